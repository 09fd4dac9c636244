"""The Prometheus endpoint: off until started, then the figures of the batches and the slot,
scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import math
import socket
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgcdc.embedded import Database
from pgcdc.errors import MonitoringError
from pgcdc.monitoring import PipelineMetrics, slot_status, wal_warnings
from pgcdc.monitoring.lag import LagReport
from pgcdc.protocol import Lsn
from replication.helpers import unique

from .helpers import TARGETS, batch_records


@pytest.fixture
def metrics() -> Iterator[PipelineMetrics]:
    metrics = PipelineMetrics()
    try:
        yield metrics
    finally:
        metrics.stop()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_batches_targets_copy_and_quarantine(metrics: PipelineMetrics) -> None:
    port = metrics.start(0)
    records = batch_records(5)
    for record in records:
        metrics.record_batch(record)
    metrics.set_watermark(TARGETS[0], Lsn.parse("1/2"))
    metrics.set_copy_progress("public.orders", 750, 1000)
    metrics.set_quarantined("public.a", "column type changed")
    metrics.set_quarantined("public.b", "dropped")
    metrics.set_quarantined("public.b", None)

    samples = scrape(port)
    assert samples[("pgcdc_batches_total", ())] == 5
    assert samples[("pgcdc_changes_total", ())] == sum(r.changes for r in records) == 1500
    assert samples[("pgcdc_bytes_total", ())] == 1500 * 120
    assert samples[("pgcdc_lag_seconds", ())] == 0  # measured by the pipeline, not per batch
    assert samples[("pgcdc_batch_seconds_count", ())] == 5
    assert samples[("pgcdc_batch_seconds_sum", ())] == pytest.approx(
        sum(r.seconds for r in records)
    )
    mirror = (("target", TARGETS[0]),)
    history = (("target", TARGETS[1]),)
    assert samples[("pgcdc_target_rows_total", mirror)] == 1500
    assert samples[("pgcdc_target_rows_total", history)] == 2 * (100 + 300 + 500)
    assert samples[("pgcdc_target_apply_seconds_count", history)] == 3
    assert samples[("pgcdc_target_watermark_lsn", mirror)] == (1 << 32) + 2
    table = (("table", "public.orders"),)
    assert samples[("pgcdc_initial_copy_rows_done", table)] == 750
    assert samples[("pgcdc_initial_copy_rows_total", table)] == 1000
    quarantined = {k[1]: v for k, v in samples.items() if k[0] == "pgcdc_table_quarantined"}
    assert quarantined == {(("reason", "column type changed"), ("table", "public.a")): 1}


def test_slot_figures_from_a_real_slot(pg: Database, metrics: PipelineMetrics) -> None:
    pg.execute("CREATE TABLE t (id int)")
    slot = unique("metrics")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    pg.execute("INSERT INTO t SELECT generate_series(1, 10000)")
    status = slot_status(pg.dsn, slot)
    warnings = wal_warnings(status, max_retained_bytes=1)
    assert warnings
    metrics.record_slot(status, warnings)
    port = metrics.start(0)
    samples = scrape(port)
    assert samples[("pgcdc_slot_retained_wal_bytes", ())] == status.slot.retained_bytes > 0
    assert samples[("pgcdc_slot_lag_bytes", ())] == status.lag_bytes > 0
    assert math.isnan(samples[("pgcdc_slot_safe_wal_size_bytes", ())])  # no keep-size limit
    assert samples[("pgcdc_slot_invalidated", ())] == 0
    assert samples[("pgcdc_wal_warning", ())] == 1
    metrics.record_slot(status, [])
    assert scrape(port)[("pgcdc_wal_warning", ())] == 0


def test_off_until_started_and_port_in_use(metrics: PipelineMetrics) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MonitoringError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics.start(port)
    port = metrics.start(0)
    with pytest.raises(MonitoringError, match="already started"):
        metrics.start(0)
    metrics.stop()
    with pytest.raises(OSError):
        scrape(port)


def test_the_lag_gauges_follow_the_pipelines_measure(metrics: PipelineMetrics) -> None:
    """The lag is what the pipeline measures now (`LagReport`), not the last batch's: after
    a backlog it goes back to 0 when the pipeline has caught up."""
    port = metrics.start(0)
    metrics.set_lag(LagReport(datetime.now(UTC), 70.0, 20 << 20))
    samples = scrape(port)
    assert (samples[("pgcdc_lag_seconds", ())], samples[("pgcdc_lag_bytes", ())]) == (70, 20 << 20)
    metrics.set_lag(LagReport(datetime.now(UTC), 0.0, 0))
    samples = scrape(port)
    assert (samples[("pgcdc_lag_seconds", ())], samples[("pgcdc_lag_bytes", ())]) == (0, 0)
