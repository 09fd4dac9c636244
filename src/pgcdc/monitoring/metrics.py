"""The pipeline's figures for Prometheus to scrape (`prometheus_client`, its own registry).

Off until `start()`; updated from what the pipeline has anyway: each `BatchRecord`, each
`SlotStatus` (with its WAL warnings), the targets' watermarks, the initial copy's progress
and quarantined tables.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pgcdc.errors import MonitoringError
from pgcdc.monitoring.batch_log import BatchRecord
from pgcdc.monitoring.lag import LagReport
from pgcdc.monitoring.slot_status import SlotStatus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

__all__ = ["BATCH_SECONDS_BUCKETS", "PipelineMetrics"]

BATCH_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class PipelineMetrics:
    """Gauges, counters and histograms named ``pgcdc_*``; `start(port)` serves them over HTTP
    (``/metrics``) until `stop()`. Every update method is safe to call from any thread,
    served or not."""

    def __init__(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:
            raise MonitoringError(
                "metrics need prometheus-client: pip install 'pgcdc[spark]' (or prometheus-client)"
            ) from None
        self.registry: CollectorRegistry = CollectorRegistry()
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(
            Histogram, buckets=BATCH_SECONDS_BUCKETS, registry=self.registry
        )
        self.changes = counter("pgcdc_changes", "Changes applied")
        self.bytes = counter("pgcdc_bytes", "Bytes of changes applied")
        self.batches = counter("pgcdc_batches", "Batches applied")
        self.lag_bytes = gauge(
            "pgcdc_lag_bytes", "WAL the server has that the targets do not (0: caught up)"
        )
        self.lag_seconds = gauge(
            "pgcdc_lag_seconds",
            "Now minus the commit time of the oldest change not applied yet (0: caught up)",
        )
        self.batch_seconds = histogram("pgcdc_batch_seconds", "Seconds per batch")
        self.apply_seconds = histogram(
            "pgcdc_target_apply_seconds", "Seconds applying a batch to a target", ["target"]
        )
        self.target_rows = counter("pgcdc_target_rows", "Rows applied to a target", ["target"])
        self.watermark = gauge(
            "pgcdc_target_watermark_lsn",
            "The target's watermark: the commit LSN it holds everything up to, as a number",
            ["target"],
        )
        self.retained_wal = gauge("pgcdc_slot_retained_wal_bytes", "WAL the slot keeps")
        self.safe_wal_size = gauge(
            "pgcdc_slot_safe_wal_size_bytes",
            "WAL that may still be written before max_slot_wal_keep_size invalidates the slot "
            "(NaN: no limit)",
        )
        self.slot_lag = gauge(
            "pgcdc_slot_lag_bytes", "The server's WAL position minus the slot's confirmed_flush_lsn"
        )
        self.slot_invalidated = gauge("pgcdc_slot_invalidated", "1 when the slot is invalidated")
        self.idle_timeout_in = gauge(
            "pgcdc_slot_idle_timeout_seconds",
            "Seconds before idle_replication_slot_timeout invalidates the inactive slot "
            "(NaN: does not apply)",
        )
        self.wal_warning = gauge("pgcdc_wal_warning", "1 while a WAL warning is active")
        self.copy_rows_done = gauge("pgcdc_initial_copy_rows_done", "Rows copied", ["table"])
        self.copy_rows_total = gauge(
            "pgcdc_initial_copy_rows_total", "Rows to copy (the planner's estimate)", ["table"]
        )
        self.quarantined = gauge(
            "pgcdc_table_quarantined",
            "1 for a table stopped (quarantined), labelled with the reason",
            ["table", "reason"],
        )
        self._reasons: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- serving ---------------------------------------------------------------------------

    def start(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``http://host:port/metrics`` from a daemon thread; the port (0: any free
        one, as chosen). MonitoringError when it cannot listen there."""
        from prometheus_client import start_http_server

        if self._server is not None:
            raise MonitoringError("the metrics endpoint is already started")
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise MonitoringError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- updates ---------------------------------------------------------------------------

    def record_batch(self, record: BatchRecord) -> None:
        self.batches.inc()
        self.changes.inc(record.changes)
        self.bytes.inc(record.bytes)
        self.batch_seconds.observe(record.seconds)
        for target, applied in record.targets.items():
            self.target_rows.labels(target).inc(applied["rows"])
            self.apply_seconds.labels(target).observe(applied["seconds"])

    def set_lag(self, report: LagReport) -> None:
        """The pipeline's lag, measured now (`pgcdc.monitoring.lag`)."""
        self.lag_seconds.set(report.seconds)
        if report.bytes is not None:
            self.lag_bytes.set(report.bytes)

    def record_slot(self, status: SlotStatus, warnings: Sequence[str] = ()) -> None:
        """The slot's figures, and whether `warnings` (of `wal_warnings`) holds any."""
        slot = status.slot
        nan = float("nan")
        self.retained_wal.set(nan if slot.retained_bytes is None else slot.retained_bytes)
        self.safe_wal_size.set(nan if slot.safe_wal_size is None else slot.safe_wal_size)
        lag = status.lag_bytes
        self.slot_lag.set(nan if lag is None else lag)
        self.slot_invalidated.set(1 if slot.invalidated else 0)
        left = status.idle_timeout_in
        self.idle_timeout_in.set(nan if left is None else left)
        self.wal_warning.set(1 if warnings else 0)

    def set_watermark(self, target: str, lsn: int) -> None:
        """A target's watermark LSN (exact as a float up to 2**53 bytes of WAL)."""
        self.watermark.labels(target).set(int(lsn))

    def set_copy_progress(self, table: str, done: int, total: int) -> None:
        self.copy_rows_done.labels(table).set(done)
        self.copy_rows_total.labels(table).set(total)

    def set_quarantined(self, table: str, reason: str | None) -> None:
        """Mark `table` quarantined for `reason`, or (None) no longer."""
        with self._lock:
            old = self._reasons.pop(table, None)
            if old is not None:
                self.quarantined.remove(table, old)
            if reason is not None:
                self._reasons[table] = reason
                self.quarantined.labels(table, reason).set(1)
