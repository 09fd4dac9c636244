"""The main job: a slot's changes applied, batch by batch, to Delta targets by Spark tasks.

The driver keeps the replication session (`Spooler`: committed transactions into the
spool, nothing decoded) and plans micro-batches of whole transactions; each batch is one
Spark job whose tasks read the spool, build the envelope a column at a time and apply every
configured table to its targets in parallel (`pgcdc.spark.batch`). Every target commits its
data together with the batch's highest commit LSN, so a batch replayed after a crash changes
nothing. Only when every table of a batch is applied does the slot move past it (the
replication client's `Acknowledgement`); a crash anywhere loses nothing: the slot sends the
rest again and the targets skip what they hold. No Spark checkpoint is needed: the targets'
watermarks are the record of what is done.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from pgcdc.decoding.catalog import Catalog
from pgcdc.errors import PgcdcError, SlotNotFound
from pgcdc.monitoring import (
    BatchLog,
    BatchRecord,
    PipelineMetrics,
    slot_status,
    wal_warnings,
)
from pgcdc.protocol import Decoder, Lsn, Relation, StreamingMode
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.preflight import check_source
from pgcdc.replication.slots import SlotInfo, connect_sql, create_slot, drop_slot, get_slot
from pgcdc.snapshot.fill import SourceFills
from pgcdc.spark.batch import (
    TableOutcome,
    TableWork,
    apply_error_line,
    apply_tables,
    group_work,
    warm_up,
)
from pgcdc.spark.bindings import TableBindings, bind_partition, bind_tables
from pgcdc.spark.config import PipelineConfig, TableTarget
from pgcdc.spark.initial_copy import InitialCopy, TableProgress
from pgcdc.spark.quarantine import Quarantine
from pgcdc.spark.session import error_line
from pgcdc.spark.spool import MESSAGES, Spool, SpoolRange, default_spool_dir
from pgcdc.spark.spooler import Spooler
from pgcdc.spark.typed import CatalogAnswers
from pgcdc.targets import Target, TargetSpec, open_target
from pgcdc.types.catalog import resolve
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeRegistry

__all__ = [
    "BatchReport",
    "Pipeline",
    "PipelineFailed",
    "PipelineStats",
    "SlotLost",
    "apply_error_line",
    "request_recopy",
]

log = logging.getLogger(__name__)

#: How long the session may take to send up to the available-now target once idle.
_CATCH_UP_TIMEOUT = 600.0


@dataclass(slots=True)
class BatchReport:
    batch_id: int
    changes: int
    #: Rows applied per target ("schema.table mode"); replayed rows are not counted.
    applied: dict[str, int]
    skipped: int
    last_commit_lsn: Lsn | None
    last_commit_time: datetime | None
    seconds: float
    #: Per table: the seconds its task spent.
    table_seconds: dict[str, float] = field(default_factory=dict)
    #: Seconds per phase: "plan" (the driver), "job" (the Spark job, wall), and summed over
    #: the tasks: "read" (spool to envelope), "fold" (folding, typing), "write" (Delta).
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class PipelineStats:
    batches: int = 0
    changes: int = 0
    per_table: dict[str, int] = field(default_factory=dict)
    last_commit_lsn: Lsn | None = None
    last_commit_time: datetime | None = None
    last_batch_at: float | None = None
    started: float = field(default_factory=time.monotonic)

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        self.changes += report.changes
        for name, count in report.applied.items():
            self.per_table[name] = self.per_table.get(name, 0) + count
        if report.last_commit_lsn is not None:
            self.last_commit_lsn = report.last_commit_lsn
            self.last_commit_time = report.last_commit_time
        self.last_batch_at = time.monotonic()


class Pipeline:
    """Runs one configuration on a Spark session (`run`; `stop` from any thread)."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: Any = None,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_copy: Callable[[dict[str, TableProgress]], None] | None = None,
    ) -> None:
        self.config = config
        self._spark = spark
        self.on_batch = on_batch
        self.on_copy = on_copy
        self.copy_progress: dict[str, TableProgress] = {}
        self.registry: TypeRegistry = DEFAULT_REGISTRY.copy()
        self.catalog = Catalog(config.conninfo)
        #: Catalog answers typing needs, recorded here and replayed in the tasks.
        self.answers = CatalogAnswers(self.catalog)
        self.targets: dict[str, list[tuple[TableTarget, Target]]] = {}
        fills = SourceFills(config.conninfo)
        for spec in config.targets():
            target = open_target(
                spec.spec,
                app_id=config.app_id,
                registry=self.registry,
                source=spec.table,
                fills=fills,
            )
            self.targets.setdefault(spec.table, []).append((spec, target))
        self.stats = PipelineStats()
        self.bindings: TableBindings | None = None
        self.quarantine = Quarantine(Path(config.state_path) / "quarantine.json")
        #: What `watch_wal` last found wrong with the slot's retained WAL (None: nothing).
        self.wal_warning: str | None = None
        self._wal_checked = float("-inf")
        self._unbound: set[int] = set()
        #: Tables whose targets wait for a copy, or are quarantined: their changes go to
        #: their pending change log.
        self.pending: set[str] = set()
        self._online: threading.Thread | None = None
        self._online_done: set[str] = set()
        self._stopping = threading.Event()
        self._relations: dict[bytes, Relation] = {}
        self.spooler: Spooler | None = None
        self.batch_log = BatchLog(Path(config.state_path) / "batches.jsonl")
        #: The Prometheus endpoint, while `run` runs with ``[metrics] port`` set.
        self.metrics: PipelineMetrics | None = None

    @property
    def spark(self) -> Any:
        """The Spark session given, or a local one started on first use (`prepare`)."""
        if self._spark is None:
            from pgcdc.spark.session import local_session

            self._spark = local_session(f"pgcdc-{self.config.name}")
        return self._spark

    # -- a batch -----------------------------------------------------------------------------

    def _relation(self, encoded: bytes) -> Relation:
        relation = self._relations.get(encoded)
        if relation is None:
            message = Decoder(1).decode(encoded)
            assert isinstance(message, Relation)
            relation = self._relations[encoded] = message
        return relation

    def _table_of(self, relid: int) -> str | None:
        if relid == MESSAGES or relid in self._unbound:
            return None
        bindings = self.bind()
        table = bindings.table_of(relid)
        if table is None:
            table = bind_partition(self.config.conninfo, bindings, relid)
            if table is None:
                self._unbound.add(relid)
        return table

    def plan_work(self, ranges: dict[int, list[SpoolRange]]) -> list[TableWork]:
        """One `TableWork` per configured table with changes in `ranges` (a batch's), its
        column types resolved here (the answers go with the work)."""
        per_table: dict[str, list[SpoolRange]] = {}
        for relid, found in ranges.items():
            table = self._table_of(relid)
            if table is not None:
                per_table.setdefault(table, []).extend(found)
        works = []
        bindings = self.bind()
        for table, found in per_table.items():
            oids = sorted(
                {c.type_oid for r in found for v in r.versions for c in self._relation(v).columns}
            )
            resolve(self.registry, self.answers, oids)
            works.append(
                TableWork(
                    table,
                    tuple(s.spec for s, _ in self.targets[table]),
                    tuple(found),
                    self.answers,
                    tuple(oids),
                    self.config.app_id,
                    self.config.conninfo,
                    on_error=self.config.on_error.get(table, "stop"),
                    own_oid=bindings.oids.get(table),
                    leaves=frozenset(bindings.leaves.get(table, ())),
                    pending_log=self._pending_path(table),
                    pending=table in self.pending,
                    changes=sum(r.changes for r in found),
                )
            )
        return works

    def _run_tasks(self, works: list[TableWork]) -> list[TableOutcome]:
        if not works:
            return []
        context = self.spark.sparkContext
        groups = group_work(works, max(1, int(context.defaultParallelism)))
        try:
            results = context.parallelize(groups, len(groups)).map(apply_tables).collect()
        except Exception as exc:
            raise PipelineFailed(error_line(exc)) from None
        return [outcome for result in results for outcome in result]

    def apply_batch(self, batch_id: int, start: Lsn, end: Lsn) -> BatchReport:
        """Apply the spooled transactions ending in (start, end] to every target."""
        assert self.spooler is not None
        started = time.monotonic()
        spool = self.spooler.spool
        info = spool.batch(start, end)
        works = self.plan_work(spool.ranges(start, end))
        planned = time.monotonic()
        outcomes = self._run_tasks(works)
        phases = {"plan": planned - started, "job": time.monotonic() - planned}
        for outcome in outcomes:
            for phase, seconds in outcome.phases.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
        applied: dict[str, int] = {}
        skipped = 0
        for outcome in outcomes:
            applied.update(outcome.applied)
            skipped += outcome.skipped
            if outcome.error is None:
                continue
            if outcome.pending and outcome.table not in self.pending:  # quarantined now
                first = Lsn(outcome.first_commit_lsn or 0)
                self.quarantine.add(outcome.table, outcome.error, str(first))
                self.pending.add(outcome.table)
                if self.metrics is not None:
                    self.metrics.set_quarantined(outcome.table, outcome.error)
                log.error(
                    "%s is quarantined: %s; its changes go to its change log until "
                    "`pgcdc recopy PIPELINE.toml %s`",
                    outcome.table,
                    outcome.error,
                    outcome.table,
                )
            elif not outcome.pending:
                raise PipelineFailed(
                    f'{outcome.error}; nothing of it is confirmed (on_error = "quarantine" '
                    "for this table lets the others stream on)"
                )
            else:
                raise PipelineFailed(f"{outcome.table}: its pending change log: {outcome.error}")
        report = BatchReport(
            batch_id,
            info.changes,
            applied,
            skipped,
            info.last_commit_lsn,
            info.last_commit_time,
            time.monotonic() - started,
            {o.table: o.seconds for o in outcomes},
            phases,
        )
        self.stats.add(report)
        self._record(report, info.bytes, info.first_commit_lsn, end, outcomes)
        if self.on_batch is not None:
            self.on_batch(report)
        return report

    def _record(
        self,
        report: BatchReport,
        size: int,
        first: Lsn | None,
        end: Lsn,
        outcomes: list[TableOutcome],
    ) -> None:
        """The batch's line in the batch log, and the metrics."""
        now = datetime.now(UTC)
        assert self.spooler is not None
        server = self.spooler.server_position or None
        targets = {
            name: {"rows": rows, "seconds": report.table_seconds.get(name.rsplit(" ", 1)[0], 0.0)}
            for name, rows in report.applied.items()
        }
        last_time = report.last_commit_time
        record = BatchRecord(
            time=now,
            batch=report.batch_id,
            changes=report.changes,
            bytes=size,
            first_commit_lsn=None if first is None else str(first),
            last_commit_lsn=None if report.last_commit_lsn is None else str(report.last_commit_lsn),
            last_commit_time=last_time,
            server_lsn=None if server is None else str(server),
            lag_bytes=None if server is None else max(0, int(server) - int(end)),
            lag_seconds=None if last_time is None else (now - last_time).total_seconds(),
            seconds=report.seconds,
            targets=targets,
        )
        self.batch_log.append(record)
        if self.metrics is not None:
            self.metrics.record_batch(record)
            if report.last_commit_lsn is not None:
                for outcome in outcomes:
                    for name in outcome.applied:
                        self.metrics.set_watermark(name, int(report.last_commit_lsn))

    def bind(self) -> TableBindings:
        """The configured tables' relation OIDs, resolved or re-checked once per run
        (`pgcdc.spark.bindings`): raises `BindingError` naming a table that cannot be
        followed."""
        if self.bindings is None:
            self.bindings = bind_tables(
                self.config.conninfo,
                self.config.publications,
                self.targets,
                Path(self.config.state_path) / "tables.json",
            )
        return self.bindings

    # -- the initial copy --------------------------------------------------------------------

    def _copier(self) -> InitialCopy:
        config = self.config

        def progress(tables: dict[str, TableProgress]) -> None:
            self.copy_progress = dict(tables)
            if self.metrics is not None:
                for table, copied in tables.items():
                    self.metrics.set_copy_progress(table, copied.rows_done, copied.estimated_rows)
            if self.on_copy is not None:
                self.on_copy(self.copy_progress)

        return InitialCopy(
            self.spark,
            config.conninfo,
            config.slot,
            {table: [t for _, t in targets] for table, targets in self.targets.items()},
            Path(config.state_path) / "snapshot.json",
            chunk_blocks=config.chunk_blocks,
            on_progress=progress,
            source_names=self.bind().current_names,
            failover=config.failover,
            publications=config.publications,
        )

    def _check_slot(self) -> None:
        config = self.config
        if not config.create_slot and _slot_or_none(config.conninfo, config.slot) is None:
            raise SlotNotFound(
                f"replication slot '{config.slot}' does not exist (create it with "
                "`pgcdc slot create`, or set create_slot = true in [source])"
            )

    def initial_copy(self) -> None:
        """Copy the tables first when the slot is new (the pipeline creates it with an
        exported snapshot) or a previous copy did not finish (it starts again: see
        `pgcdc.spark.initial_copy`). Once the pipeline has run, a table still without a copy
        (added since, or whose copy failed) is copied while the stream runs. A first run on
        a slot the pipeline did not create copies nothing: the slot holds the tables' changes
        from its creation on.

        A slot that is gone while the targets hold data stops the pipeline: the changes
        between the targets' watermarks and a new slot would be lost."""
        config = self.config
        copier = self._copier()
        status = copier.status if config.snapshot else None
        slot = _slot_or_none(config.conninfo, config.slot)
        watermarks = [t.watermark for ts in self.targets.values() for _, t in ts]
        lost = slot is None or slot.invalidated
        if status in ("creating", "copying"):
            copier.restart()
        elif lost and (status == "done" or any(w is not None for w in watermarks)):
            applied = max((w for w in watermarks if w is not None), default=None)
            if slot is None:
                what = "is gone"
            else:
                reason = slot.invalidation_reason or f"wal_status {slot.wal_status}"
                what = f"was invalidated ({reason})"
            if not config.recover_lost_slot:
                raise SlotLost(
                    f'replication slot "{config.slot}" {what}, but the targets hold changes up '
                    f"to commit LSN {Lsn(applied) if applied is not None else '?'}: the changes "
                    "since then cannot be streamed again; set recover_lost_slot = true in "
                    "[source] to copy the tables under a new slot and reconcile the targets "
                    "with them (or move the targets and the pipeline's state "
                    f"({config.state_path}) away to copy everything anew)"
                )
            log.warning(
                "replication slot %s %s: copying every table under a new slot and "
                "reconciling the targets with it",
                config.slot,
                what,
            )
            if slot is not None:
                drop_slot(config.conninfo, config.slot, wait=True)
            copier.start_fresh(resync=True)
        elif slot is None and config.create_slot and config.snapshot:
            copier.start_fresh()
        if not config.snapshot:
            return
        failed = {t for t, p in self.copy_progress.items() if p.error is not None}
        marked = {
            table: all(t.watermark is not None for _, t in targets)
            for table, targets in self.targets.items()
        }
        records = {t: r for t, r in self.quarantine.records().items() if t in self.targets}
        set_aside = {t for t, r in records.items() if r.status == "quarantined"}
        if not any(marked.values()) and not records:
            return  # a first run on a slot made by someone else: the stream has it all
        for table, ready in marked.items():
            if table in set_aside:
                self.pending.add(table)
                log.warning("%s stays quarantined: %s", table, records[table].reason)
            elif not ready:  # added since the last run, its copy failed, or a recopy
                self.pending.add(table)
            elif Path(self._pending_path(table)).exists():
                self._drain(table)  # a crash came after the copy, before the drain ended
        waiting = sorted(self.pending - failed - set_aside)
        for table in failed:
            log.error("copy of %s failed: %s", table, self.copy_progress[table].error)
        if waiting:
            self._online = threading.Thread(
                target=self._copy_online, args=(waiting,), name="pgcdc-online-copy", daemon=True
            )

    def _pending_path(self, table: str) -> str:
        return str(Path(self.config.state_path) / "pending" / table)

    def _copy_online(self, tables: list[str]) -> None:
        _, copied = self._copier().copy_online(tables)
        self._online_done.update(copied)
        for table in set(tables) - copied:
            log.error("copy of %s failed: %s", table, self.copy_progress[table].error)

    def _drain(self, table: str) -> None:
        """The table's copy is in: apply what the stream brought meanwhile (the targets skip
        what the copy already holds), then forget the pending log."""
        log = TargetSpec(self._pending_path(table), "changelog")
        pending = open_target(log, app_id=self.config.app_id)
        if pending.exists:
            rows = pending.to_arrow()
            columns = pc.list_flatten(rows.column("columns"))
            if len(columns):
                oids = pc.unique(pc.struct_field(columns, "type_oid")).to_pylist()
                resolve(self.registry, self.answers, [o for o in oids if o is not None])
            for _, target in self.targets[table]:
                target.apply(rows)
        shutil.rmtree(self._pending_path(table), ignore_errors=True)
        self.pending.discard(table)
        self.quarantine.lift(table)

    def _drain_copied(self) -> None:
        for table in list(self._online_done):
            self._online_done.discard(table)
            self._drain(table)

    # -- running -----------------------------------------------------------------------------

    def _session(self) -> Spooler:
        """The replication session, spooling from the slot's confirmed position."""
        config = self.config
        if _slot_or_none(config.conninfo, config.slot) is None:
            # create_slot = true, no copy wanted
            create_slot(config.conninfo, config.slot, failover=config.failover)
        streaming = config.streaming
        if streaming is None:
            version = int(self.catalog.query("SHOW server_version_num")[0][0])
            streaming = StreamingMode.ON if version >= 140000 else StreamingMode.OFF
        directory = config.spool_dir or default_spool_dir(config.slot)
        return Spooler(
            config.conninfo,
            config.slot,
            StreamOptions(config.publications),
            Spool(directory),
            streaming=StreamingMode(streaming),
            status_interval=config.status_interval,
        ).start()

    def prepare(self) -> None:
        """Check the source (the server's settings and the role: `check_source`; the slot,
        every table and its publication), then start Spark: a wrong configuration is said at
        once, not after the JVM started. Starting Spark installs its own SIGINT handler: a
        caller that handles Ctrl-C installs its own after this."""
        config = self.config
        check_source(
            config.conninfo,
            config.slot,
            config.publications,
            create_slot=config.create_slot or config.recover_lost_slot,
        )
        self._check_slot()
        self.bind()
        _ = self.spark

    def run(self, *, tick: Callable[[], None] | None = None) -> PipelineStats:
        """Run until caught up (available-now), `stop()` or an error, after an initial copy
        if one is due (and `prepare` if it was not called); `tick` is called about twice a
        second (for a progress view)."""
        self.prepare()
        if self.config.metrics_port is not None:
            self.metrics = PipelineMetrics()
            self.metrics.start(self.config.metrics_port, self.config.metrics_host)
        try:
            return self._run(tick)
        finally:
            if self.metrics is not None:
                self.metrics.stop()

    def _run(self, tick: Callable[[], None] | None) -> PipelineStats:
        self.initial_copy()
        if self._online is not None and self._online.ident is None:
            self._online.start()
        start = Lsn(get_slot(self.config.conninfo, self.config.slot).confirmed_flush_lsn or 0)
        self.spooler = spooler = self._session()
        # The Python workers import what the tasks need while the session spools.
        context = self.spark.sparkContext
        cores = max(1, int(context.defaultParallelism))
        context.parallelize(range(cores), cores).map(warm_up).collect()
        try:
            self._stream(spooler, start, tick)
            if self._online is not None and self._online.ident is not None:
                self._online.join()  # available-now: the copies finish before the run does
                self._drain_copied()
        except PipelineFailed:
            raise
        except PgcdcError as exc:
            raise PipelineFailed(str(exc)) from None
        finally:
            spooler.stop()  # the last status update moves the slot to what is durable
            self.catalog.close()
        return self.stats

    def _stream(self, spooler: Spooler, applied: Lsn, tick: Callable[[], None] | None) -> None:
        config = self.config
        target = _server_lsn(config.conninfo) if config.available_now else None
        interval = config.interval_seconds
        next_batch = time.monotonic()
        last_tick = 0.0
        batch_id = 0
        while not self._stopping.is_set():
            now = time.monotonic()
            if tick is not None and now - last_tick >= 0.5:
                tick()
                last_tick = now
            self._drain_copied()
            self.watch_wal()
            spooler.check()
            end, _ = spooler.spool.plan(
                applied, max_changes=config.max_changes_per_batch, upto=target
            )
            if end == applied:
                if target is not None and spooler.reached(target, after=applied):
                    return  # caught up
                spooler.wait_for_more(applied, timeout=0.5)
                continue
            if now < next_batch:  # at most one batch start per interval
                self._stopping.wait(next_batch - now)
                continue
            next_batch = now + interval
            self.apply_batch(batch_id, applied, end)
            batch_id += 1
            spooler.confirm(end)
            applied = end

    def watch_wal(self, every: float = 10.0) -> str | None:
        """At most every `every` seconds, look at the slot (`pgcdc.monitoring.slot_status`):
        `wal_warning` says (and the log warns once) when it retains more WAL than
        ``max_retained_wal``, the server will invalidate it soon (``safe_wal_size``, an idle
        timeout) or has done so. None when all is well."""
        now = time.monotonic()
        if now - self._wal_checked < every:
            return self.wal_warning
        self._wal_checked = now
        try:
            status = slot_status(self.config.conninfo, self.config.slot)
        except PgcdcError:
            return self.wal_warning  # the stream reports a missing slot itself
        warnings = wal_warnings(status, self.config.max_retained_wal)
        if self.metrics is not None:
            self.metrics.record_slot(status, warnings)
        warning = "; ".join(warnings) or None
        if warning and warning != self.wal_warning:
            log.warning("%s", warning)
        self.wal_warning = warning
        return warning

    def stop(self) -> None:
        """Finish the batch in progress, then stop."""
        self._stopping.set()


def _server_lsn(conninfo: str) -> Lsn:
    with connect_sql(conninfo) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def request_recopy(config: PipelineConfig, table: str) -> list[str]:
    """Ask for a new copy of `table` (quarantined or not), with the pipeline stopped: its
    targets are removed now; the next run copies it while the others stream, then applies
    the changes logged meanwhile and lifts any quarantine. The removed target paths."""
    table = table if "." in table else f"public.{table}"
    if table not in config.tables:
        raise PgcdcError(f"{table} is not a table of pipeline {config.name!r}")
    paths = [spec.path for spec in config.targets() if spec.table == table]
    remote = [p for p in paths if "://" in p]
    if remote:
        raise PgcdcError(f"{remote[0]}: recopy removes local targets only")
    Quarantine(Path(config.state_path) / "quarantine.json").request_recopy(table)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    return paths


def _slot_or_none(conninfo: str, slot: str) -> SlotInfo | None:
    try:
        return get_slot(conninfo, slot)
    except SlotNotFound:
        return None


class SlotLost(PgcdcError):
    """The pipeline's slot no longer exists though its targets hold data."""


class PipelineFailed(PgcdcError):
    """The pipeline stopped with an error (the first line of it, cleaned up)."""
