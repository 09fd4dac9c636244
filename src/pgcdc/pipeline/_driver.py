"""The main job: a slot's changes applied, batch by batch, to Delta targets by Spark tasks.

The driver keeps the replication session (`Spooler`: committed transactions into the
spool, nothing decoded) and plans micro-batches of whole transactions; each batch is one
Spark job (a small batch: the driver's threads or apply processes, `_appliers`) whose
tasks read their tables' changes from the spool (on a cluster, or through Spark Connect:
get them with their work), build the envelope a column at a time and apply every
configured table to its targets in parallel (`pgcdc.pipeline._work`). Every target commits
its data together with the batch's highest commit LSN, so a batch replayed after a crash
changes nothing. Only when every table of a batch is applied does the slot move past it (the
replication client's `Acknowledgement`); a crash anywhere loses nothing: the slot sends the
rest again and the targets skip what they hold. No Spark checkpoint is needed: the targets'
watermarks are the record of what is done.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pgcdc.decoding.catalog import Catalog
from pgcdc.errors import PgcdcError, PipelineFailed, SlotLost, SlotNotFound, StorageError
from pgcdc.monitoring import (
    BATCH_LOG,
    BatchLog,
    LagReport,
    PipelineMetrics,
    slot_status,
    wal_warnings,
    write_lag,
)
from pgcdc.pipeline._batch import (
    BatchApplier,
    BatchReport,
    PipelineStats,
    batch_bounds,
)
from pgcdc.pipeline._columns import ColumnIdentities, seed_point
from pgcdc.pipeline._copy import InitialCopy, TableProgress
from pgcdc.pipeline._dispatch import Dispatcher
from pgcdc.pipeline._lineage import SlotLineage
from pgcdc.pipeline._online import OnlineCopies, pending_name
from pgcdc.pipeline._quarantine import Quarantine
from pgcdc.pipeline._startup import (
    REFUSALS,
    CopyCondition,
    Decision,
    SlotCondition,
    Start,
    StartFacts,
    decide,
    judge_slot,
    tables_to_copy,
)
from pgcdc.pipeline._tables import FollowedTables
from pgcdc.pipeline._work import apply_error_line, forget_open_targets, warm_up
from pgcdc.pipeline.config import PipelineConfig, TableTarget
from pgcdc.protocol import Lsn, StreamingMode
from pgcdc.replication.connection import ReplicationConnection
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.preflight import check_source
from pgcdc.replication.slots import SlotInfo, connect_sql, create_slot, drop_slot, get_slot
from pgcdc.replication.stream import LogicalStream
from pgcdc.snapshot.fill import SourceFills
from pgcdc.spool._session import Spooler
from pgcdc.spool._spool import Spool, default_spool_dir
from pgcdc.storage import FileIO, open_file_io
from pgcdc.targets import Target, open_target
from pgcdc.types.catalog import TypeCatalog

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

#: The copy's state (`InitialCopy.status`) as the start-up decision sees it.
_COPY_STATES = {
    None: CopyCondition.NONE,
    "creating": CopyCondition.CUT_OFF,
    "copying": CopyCondition.CUT_OFF,
    "done": CopyCondition.DONE,
}
#: How long the session may take to send up to the available-now target once idle.
_CATCH_UP_TIMEOUT = 600.0
#: The interpreter's thread switch interval while a pipeline runs (Python's default is
#: 5 ms). The replication session, the tables' apply threads and the driver share one
#: interpreter, and a thread that wants it waits up to an interval for one that holds it:
#: on a machine the source's load saturates, the batches' reading spent 8 to 9 times its CPU
#: waiting. Measured (`benchmarks/sustained.py --pgbench`, four runs with it, two of them
#: alternating with the default): commit-to-visible p99 3.1-4.7 s against 4.7-5.2 s in the
#: alternation (3.0-11.3 s in eight other runs), CPU per change +5%; no change to a
#: backlog's drain or to 10,000 changes/s (two runs of each).
SWITCH_INTERVAL = 0.0005


@contextmanager
def _interpreter_for_streaming() -> Iterator[None]:
    """The interpreter's settings while a pipeline runs, restored after it:
    - the thread switch interval (`SWITCH_INTERVAL`);
    - what exists once the pipeline is prepared (the imported modules of Spark, Arrow and
      delta-rs, the session) frozen out of the garbage collector's passes (`gc.freeze`). A
      full pass holds the interpreter, the replication session included, for as long as it
      takes to visit every tracked object, and a steady load starts one every second or
      two. Measured (`benchmarks/sustained.py --pgbench`, two runs each, alternated, the
      process logging its full passes; with the spool's index no longer tracked per unit):
      32 and 32 full passes took 5.2 and 6.5 s of the 75 s, the longest 0.37 and 0.61 s;
      now 23 and 25 take 0.47 and 0.44 s, the longest 0.05 and 0.06 s (107,000 objects
      frozen). Commit-to-visible p99 went from 2.4 and 5.6 s to 2.0 and 2.9 s.
    """
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL))
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)


class Pipeline:
    """Runs one configuration on a Spark session (`run`; `stop` from any thread). Its rooms:
    the tables followed (`tables`: bindings, pending, quarantine), the copies beside the
    stream (`copies`), the batches (`batches`); the driver itself decides the start, keeps
    the replication session and cuts the stream into batches."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: Any = None,
        dispatcher: Dispatcher | None = None,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_copy: Callable[[dict[str, TableProgress]], None] | None = None,
    ) -> None:
        self.config = config
        self._spark = spark
        self._dispatcher = dispatcher
        self.on_batch = on_batch
        self.on_copy = on_copy
        self.copy_progress: dict[str, TableProgress] = {}
        self.catalog = Catalog(config.conninfo)
        #: The replication thread's own: what each Relation message's columns are.
        self._spool_catalog = Catalog(config.conninfo)
        #: The descriptions of the user-defined types met, read here and shipped to the tasks.
        self.types = TypeCatalog(self.catalog)
        self.targets: dict[str, list[tuple[TableTarget, Target]]] = {}
        for spec in config.targets():
            self.targets.setdefault(spec.table, []).append((spec, self._open(spec)))
        self.stats = PipelineStats()
        #: Where the pipeline keeps its state (`state_io`: a directory or an object store).
        self.state = state_io(config)
        #: What the pipeline knows of its slot (`pgcdc.pipeline._lineage`).
        self.lineage = SlotLineage(self.state)
        #: The start's decision (`prepare`), and what happened to the slot, for messages.
        self.decision: Decision | None = None
        self._what_happened = ""
        self.tables = FollowedTables(config, self.targets, self.state, on_resync=self._resync)
        self.copies = OnlineCopies(
            config,
            self.state,
            self.tables,
            self.types,
            copier=self._copier,
            open_target=self._open,
            progress=lambda: self.copy_progress,
        )
        self.batches = BatchApplier(
            config,
            self.tables,
            self.copies,
            self.types,
            BatchLog(self.state.child(BATCH_LOG)),
            dispatcher=lambda: self.dispatcher,
        )
        #: What `watch_wal` last found wrong with the slot's retained WAL (None: nothing).
        self.wal_warning: str | None = None
        self._wal_checked = float("-inf")
        self._lag_checked = float("-inf")
        self._stopping = threading.Event()
        self.spooler: Spooler | None = None
        #: The Prometheus endpoint, while `run` runs with ``[metrics] port`` set.
        self.metrics: PipelineMetrics | None = None

    @property
    def pending(self) -> set[str]:
        """Tables whose changes go to their pending change log (`FollowedTables.pending`)."""
        return self.tables.pending

    @property
    def quarantine(self) -> Quarantine:
        return self.tables.quarantine

    def _open(self, spec: TableTarget) -> Target:
        """A target of the configuration, typing with the types met so far."""
        fills = SourceFills(self.config.conninfo)
        return open_target(
            spec.spec,
            app_id=self.config.app_id,
            registry=self.types.registry,
            source=spec.table,
            fills=fills,
        )

    @property
    def dispatcher(self) -> Dispatcher:
        """Where the work runs: the dispatcher given, or Spark tasks on the session given (or
        the one ``[spark]`` describes, started on first use: `prepare`) through
        `pgcdc.spark.dispatch.SparkDispatcher`."""
        if self._dispatcher is None:
            from pgcdc.spark.dispatch import SparkDispatcher
            from pgcdc.spark.session import spark_session

            if self._spark is None:
                config = self.config
                self._spark = spark_session(
                    f"pgcdc-{config.name}",
                    master=config.spark_master,
                    remote=config.spark_remote,
                    conf=config.spark_conf,
                )
            self._dispatcher = SparkDispatcher(self._spark)
        return self._dispatcher

    def _resync(self, tables: list[str]) -> None:
        """Tables found changed behind the stream: copied again now if the stream runs (at
        start, `start` finds them in the quarantine records)."""
        if self.config.snapshot and self.spooler is not None:
            self.copies.later(tables, resync=True, now=True)

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
            self.dispatcher,
            config.conninfo,
            config.slot,
            {table: [t for _, t in targets] for table, targets in self.targets.items()},
            self.state,
            chunk_blocks=config.chunk_blocks,
            on_progress=progress,
            source_names=self.tables.bind().current_names,
            failover=config.failover,
            publications=config.publications,
            lineage=self.lineage,
            changelog_reads=config.changelog_reads,
        )

    def _decide(self) -> Decision:
        """What to do at start (`pgcdc.pipeline._startup`): refuses with one line when the
        slot cannot feed the targets. Needs no Spark."""
        config = self.config
        copy = _COPY_STATES.get(InitialCopy.status_of(self.state) if config.snapshot else None)
        slot = _slot_or_none(config.conninfo, config.slot)
        with ReplicationConnection.connect(config.conninfo) as rconn:
            server = rconn.identify_system()
        condition, what = judge_slot(
            self.lineage.load(),
            exists=slot is not None,
            invalidated=slot is not None and slot.invalidated,
            confirmed_flush=None if slot is None else slot.confirmed_flush_lsn,
            synced=None if slot is None else slot.synced,
            system=server.systemid,
            timeline=server.timeline,
        )
        if slot is not None and slot.invalidated:
            what = (
                f"was invalidated ({slot.invalidation_reason or f'wal_status {slot.wal_status}'})"
            )
        watermarks = [
            w for ts in self.targets.values() for _, t in ts if (w := t.watermark) is not None
        ]
        applied = max(watermarks, default=None)
        facts = StartFacts(
            condition,
            copy or CopyCondition.NONE,
            targets_hold_data=applied is not None,
            behind_targets=applied is not None and applied > server.xlogpos,
            create_slot=config.create_slot,
            snapshot=config.snapshot,
            recover=config.recover_lost_slot,
        )
        decision = decide(facts)
        if decision.action is Start.REFUSE:
            assert decision.refusal is not None
            line = REFUSALS[decision.refusal].format(
                slot=config.slot,
                what=what,
                applied=Lsn(applied) if applied is not None else "?",
                server=server.xlogpos,
                state=config.state_path,
            )
            raise (SlotNotFound if decision.refusal == "missing" else SlotLost)(line)
        self._what_happened = what
        return decision

    def _check_failover(self) -> None:
        """``failover = true``: the slot is made a failover slot if it is not one (17+), or
        the start is refused (older servers have none)."""
        config = self.config
        if not config.failover:
            return
        slot = _slot_or_none(config.conninfo, config.slot)
        if slot is None or slot.failover:
            return
        with ReplicationConnection.connect(config.conninfo) as rconn:
            if rconn.server_version < 170000:
                raise PipelineFailed(
                    f"failover = true, but PostgreSQL {rconn.server_version // 10000} has no "
                    f'failover slots (17 and later have): slot "{config.slot}" would not '
                    "survive a failover; set failover = false or upgrade"
                )
            rconn.alter_slot(config.slot, failover=True)
        log.info("replication slot %s is now a failover slot", config.slot)

    def start(self) -> None:
        """Do what `prepare` decided (`pgcdc.pipeline._startup`): copy, copy again, resync
        or create the slot, or nothing; then find the tables the stream waits for (a copy
        added since, failed or asked for) and start their copy while the stream runs."""
        config = self.config
        decision = self.decision if self.decision is not None else self._decide()
        copier = self._copier()
        action = decision.action
        if action is Start.RECREATE:
            log.warning("replication slot %s %s: replacing it", config.slot, self._what_happened)
            drop_slot(config.conninfo, config.slot, wait=True)
            action = Start.COPY if config.snapshot else Start.CREATE_SLOT
        if action is Start.COPY_AGAIN:
            copier.restart()
        elif action is Start.RESYNC:
            log.warning(
                "replication slot %s %s: copying every table under a new slot and "
                "reconciling the targets with it",
                config.slot,
                self._what_happened,
            )
            if _slot_or_none(config.conninfo, config.slot) is not None:
                drop_slot(config.conninfo, config.slot, wait=True)
            copier.start_fresh(resync=True)
        elif action is Start.COPY:
            copier.start_fresh()
        elif action is Start.CREATE_SLOT:
            created = create_slot(config.conninfo, config.slot, failover=config.failover)
            self.lineage.created(config.slot, *self._identity(), created.consistent_point)
        copy = _COPY_STATES.get(copier.status) or CopyCondition.NONE
        marked = {
            table: all(t.watermark is not None for _, t in targets)
            for table, targets in self.targets.items()
        }
        for table, progress in self.copy_progress.items():
            if progress.error is not None:
                self.copies.failed(table, progress.error)
        records = {t: r for t, r in self.quarantine.records().items() if t in self.targets}
        set_aside = {t for t, r in records.items() if r.status == "quarantined"}
        resync = {t for t, r in records.items() if r.status == "resync"} - set_aside
        waiting = tables_to_copy(action, copy, marked, config.snapshot)
        waiting |= {t for t, r in records.items() if r.status == "recopy"}
        waiting -= set_aside | resync
        for table in sorted(set_aside):
            log.warning("%s stays quarantined: %s", table, records[table].reason)
        for table, ready in marked.items():
            if table in waiting | set_aside | resync:
                self.pending.add(table)
            elif ready and self.state.exists(pending_name(table)):
                self.copies.drain(table)  # a crash came after the copy, before the drain ended
        if waiting:
            self.copies.later(sorted(waiting), resync=False, now=False)
        if resync and config.snapshot:
            self.copies.later(sorted(resync), resync=True, now=False)

    def _identity(self) -> tuple[str | None, int | None]:
        with ReplicationConnection.connect(self.config.conninfo) as rconn:
            identity = rconn.identify_system()
        return identity.systemid, identity.timeline

    # -- running -----------------------------------------------------------------------------

    def _session(self) -> Spooler:
        """The replication session, spooling from the slot's confirmed position."""
        config = self.config
        streaming = config.streaming
        if streaming is None:
            version = int(self.catalog.query("SHOW server_version_num")[0][0])
            streaming = StreamingMode.ON if version >= 140000 else StreamingMode.OFF
        directory = config.spool_dir or default_spool_dir(config.slot)
        identities = ColumnIdentities(self._spool_catalog, config.publications)
        bindings = self.tables.bind()
        for table, targets in self.targets.items():
            if table not in bindings.oids or table in bindings.leaves:
                continue
            # what the consumer of its changes that holds the least holds, and the columns
            # recorded as of that point: the slot sends again what came before, which every
            # consumer skips (see `ColumnIdentities`); a table whose changes go to its pending
            # change log (a copy under way, a quarantine) has its targets emptied or left
            # behind, and the log counts too
            held = [(t.watermark, t.recorded_columns()) for _, t in targets]
            if table in self.tables.pending:
                held.append(self.copies.pending_held(table))
            recorded, at = seed_point(held)
            columns = [(c.attnum, (c.name, c.type_oid, c.type_modifier)) for c in recorded or ()]
            identities.seed(bindings.oids[table], columns, at)
        return Spooler(
            config.conninfo,
            config.slot,
            StreamOptions(config.publications),
            Spool(directory, identify=identities),
            streaming=StreamingMode(streaming),
            status_interval=config.status_interval,
            on_session=self._session_started,
        ).start()

    def _session_started(self, stream: LogicalStream) -> None:
        """A replication session streams (the first, or one after a reconnect: perhaps to
        a promoted standby): its slot must still be the one the targets were fed from; the
        slot is then recorded as moving only after the record does (`SlotLineage`)."""
        config = self.config
        identity = stream.identity
        assert identity is not None
        slot = get_slot(config.conninfo, config.slot)
        condition, what = judge_slot(
            self.lineage.load(),
            exists=True,
            invalidated=slot.invalidated,
            confirmed_flush=slot.confirmed_flush_lsn,
            synced=slot.synced,
            system=identity.systemid,
            timeline=identity.timeline,
        )
        if condition is not SlotCondition.OK:
            raise SlotLost(
                f'replication slot "{config.slot}" {what}: the changes since the targets\' '
                "watermark cannot be streamed from it; set recover_lost_slot = true in "
                "[source] to copy the tables under a new slot and reconcile the targets"
            )
        self.lineage.streaming(
            config.slot, identity.systemid, identity.timeline, slot.confirmed_flush_lsn
        )
        before = stream.before_status

        def record() -> None:
            if before is not None:
                before()
            self.lineage.advance(config.slot, stream.acks.flush_lsn)

        stream.before_status = record

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
        check_storage(self.config)
        self.decision = self._decide()
        self.tables.bind()
        self._check_failover()
        _ = self.dispatcher

    def run(self, *, tick: Callable[[], None] | None = None) -> PipelineStats:
        """Run until caught up (available-now), `stop()` or an error, after an initial copy
        if one is due (and `prepare` if it was not called); `tick` is called about twice a
        second (for a progress view)."""
        self.prepare()
        if self.config.metrics_port is not None:
            self.metrics = PipelineMetrics()
            self.tables.metrics = self.batches.metrics = self.metrics
            self.metrics.start(self.config.metrics_port, self.config.metrics_host)
        try:
            with _interpreter_for_streaming():
                return self._run(tick)
        finally:
            if self.metrics is not None:
                self.metrics.stop()

    def _run(self, tick: Callable[[], None] | None) -> PipelineStats:
        self.start()
        self.copies.start_all()
        start = Lsn(get_slot(self.config.conninfo, self.config.slot).confirmed_flush_lsn or 0)
        self.spooler = spooler = self._session()
        # The apply processes and Spark's Python workers import what the tasks need while
        # the session spools.
        forget_open_targets()
        try:
            self.batches.start()
            self.dispatcher.map(warm_up, range(self.dispatcher.parallelism))
            self._stream(spooler, start, tick)
            self.copies.join_all()  # available-now: the copies finish before the run
            self.copies.finish()
        except PipelineFailed:
            raise
        except PgcdcError as exc:
            raise PipelineFailed(str(exc)) from None
        finally:
            self.batches.close()
            spooler.stop()  # the last status update moves the slot to what is durable
            self.catalog.close()
            self._spool_catalog.close()
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
            self.copies.finish()
            self.watch_wal()
            self.tables.watch()
            self.watch_lag(applied)
            spooler.check()
            spool = spooler.spool
            pending = spool.pending(applied, upto=target, at_most=config.inline_max_changes + 1)
            limit, by_driver = batch_bounds(
                pending, config.inline_max_changes, config.max_changes_per_batch
            )
            end, changes = spool.plan(
                applied, max_changes=limit, max_bytes=config.max_bytes_per_batch, upto=target
            )
            if end == applied:
                if target is not None and spooler.reached(target, after=applied):
                    return  # caught up
                if not self.batches.maintain_between():
                    spooler.wait_for_more(applied, timeout=0.5)
                continue
            if now < next_batch:  # at most one batch start per interval
                if not self.batches.maintain_between():
                    self._stopping.wait(next_batch - now)
                continue
            # a batch cut by a limit leaves a backlog: the next one starts at once
            next_batch = now + interval if changes >= pending else 0.0
            report = self.batches.apply(batch_id, spooler, applied, end, by_driver=by_driver)
            self.stats.add(report)
            if self.on_batch is not None:
                self.on_batch(report)
            batch_id += 1
            # Recorded here, not by the session before its status update (`_session_started`
            # still makes sure): its two fsyncs held the session up to tens of milliseconds
            # a batch, on a machine the source's load saturates.
            self.lineage.advance(config.slot, end)
            spooler.confirm(end)
            applied = end
            if time.monotonic() >= next_batch:  # no wait before the next batch to maintain
                self.batches.maintain_between()  # in: one pass now, if one is due

    def watch_lag(self, applied: Lsn, every: float = 2.0) -> LagReport | None:
        """At most every `every` seconds: how far behind the pipeline is (now minus the
        commit time of the oldest change spooled and not applied; 0 when the session has
        everything the server sent and none waits), for the metrics and `pgcdc status`."""
        now = time.monotonic()
        if now - self._lag_checked < every or self.spooler is None:
            return None
        self._lag_checked = now
        at = datetime.now(UTC)
        oldest = self.spooler.spool.oldest_pending(applied)
        server = self.spooler.server_position
        seconds = 0.0 if oldest is None else max(0.0, (at - oldest).total_seconds())
        behind = None if not server else max(0, int(server) - int(applied))
        if oldest is None and not server:  # still receiving: the last batch's figure
            return None
        report = LagReport(at, seconds, behind)
        write_lag(self.state, report)
        if self.metrics is not None:
            self.metrics.set_lag(report)
        return report

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
    check_storage(config)
    Quarantine(state_io(config)).request_recopy(table)
    forget_open_targets()
    for path in paths:
        open_file_io(path, config.storage_options).delete_tree()
    return paths


def state_io(config: PipelineConfig) -> FileIO:
    """Where the pipeline keeps its state (``[target] state``: a directory, or an object
    store's URI opened with the targets' storage options)."""
    return open_file_io(config.state_path, config.storage_options)


def check_storage(config: PipelineConfig) -> None:
    """Raise `StorageError` (one line naming the setting, the location and the store's
    reason) when the targets' root or the state cannot be used: before anything starts."""
    for setting, location in (
        ("target.path", config.target_path),
        ("target.state", config.state_path),
    ):
        try:
            open_file_io(location, config.storage_options).check()
        except StorageError as exc:
            raise StorageError(f"{setting} {exc}") from None


def _slot_or_none(conninfo: str, slot: str) -> SlotInfo | None:
    try:
        return get_slot(conninfo, slot)
    except SlotNotFound:
        return None
