"""The main job: a slot's changes applied, batch by batch, to Delta targets by Spark tasks.

The driver keeps the replication session (`Spooler`: committed transactions into the
spool, nothing decoded) and plans micro-batches of whole transactions; each batch is one
Spark job (a small batch: threads of the driver) whose tasks read their tables' changes from
the spool (on a cluster, or through Spark Connect: get them with their work), build the
envelope a column at a time and apply every configured table to its targets in parallel
(`pgcdc.pipeline._work`). Every target commits its
data together with the batch's highest commit LSN, so a batch replayed after a crash changes
nothing. Only when every table of a batch is applied does the slot move past it (the
replication client's `Acknowledgement`); a crash anywhere loses nothing: the slot sends the
rest again and the targets skip what they hold. No Spark checkpoint is needed: the targets'
watermarks are the record of what is done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc

from pgcdc.decoding.catalog import Catalog
from pgcdc.errors import PgcdcError, SlotNotFound, StorageError
from pgcdc.monitoring import (
    BATCH_LOG,
    BatchLog,
    BatchRecord,
    LagReport,
    PipelineMetrics,
    slot_status,
    wal_warnings,
    write_lag,
)
from pgcdc.pipeline._bindings import (
    BindingError,
    TableBindings,
    TableEvent,
    bind_partition,
    inspect_tables,
)
from pgcdc.pipeline._columns import ColumnIdentities
from pgcdc.pipeline._copy import InitialCopy, TableProgress
from pgcdc.pipeline._dispatch import Dispatcher, DispatchError, InlineDispatcher
from pgcdc.pipeline._lineage import SlotLineage
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
from pgcdc.pipeline._work import (
    TableOutcome,
    TableWork,
    apply_error_line,
    apply_tables,
    forget_open_targets,
    group_work,
    warm_up,
)
from pgcdc.pipeline.config import PipelineConfig, TableTarget
from pgcdc.protocol import Decoder, Lsn, Relation, StreamingMode
from pgcdc.replication.connection import ReplicationConnection
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.preflight import check_source
from pgcdc.replication.slots import SlotInfo, connect_sql, create_slot, drop_slot, get_slot
from pgcdc.replication.stream import LogicalStream
from pgcdc.snapshot.fill import SourceFills
from pgcdc.spool._session import Spooler
from pgcdc.spool._spool import MESSAGES, Spool, SpoolRange, default_spool_dir, load_ranges
from pgcdc.storage import FileIO, open_file_io
from pgcdc.targets import Target, TargetSpec, open_target
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
    #: Seconds per phase (`pgcdc.monitoring.BatchRecord.phases`).
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
        dispatcher: Dispatcher | None = None,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_copy: Callable[[dict[str, TableProgress]], None] | None = None,
    ) -> None:
        self.config = config
        self._spark = spark
        self._dispatcher = dispatcher
        #: Applies small batches in this process (`_run_tasks`).
        self._inline = InlineDispatcher(parallelism=2)
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
        self.bindings: TableBindings | None = None
        self.quarantine = Quarantine(self.state)
        #: What `watch_wal` last found wrong with the slot's retained WAL (None: nothing).
        self.wal_warning: str | None = None
        self._wal_checked = float("-inf")
        self._unbound: set[int] = set()
        #: Tables whose targets wait for a copy, or are quarantined: their changes go to
        #: their pending change log.
        self.pending: set[str] = set()
        #: Copies running while the stream goes on (`_copy_online`); the tables they copied.
        self._copies: list[threading.Thread] = []
        self._online_done: set[str] = set()
        #: Tables whose copy while streaming failed, with the error (`_drain_copied`).
        self._copy_failures: dict[str, str] = {}
        #: When the tables were last checked for what the stream does not show (`_watch`).
        self._tables_checked = time.monotonic()
        self._lag_checked = float("-inf")
        self._warned: set[str] = set()
        self._stopping = threading.Event()
        self._relations: dict[bytes, Relation] = {}
        self.spooler: Spooler | None = None
        self.batch_log = BatchLog(self.state.child(BATCH_LOG))
        #: The Prometheus endpoint, while `run` runs with ``[metrics] port`` set.
        self.metrics: PipelineMetrics | None = None

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

    # -- a batch -----------------------------------------------------------------------------

    def _relation(self, encoded: bytes) -> Relation:
        relation = self._relations.get(encoded)
        if relation is None:
            message = Decoder(1).decode(encoded)
            assert isinstance(message, Relation)
            relation = self._relations[encoded] = message
        return relation

    def _table_of(self, relid: int, relation: Relation | None) -> str | None:
        if relid == MESSAGES or relid in self._unbound:
            return None
        bindings = self.bind()
        table = bindings.table_of(relid)
        if table is None:
            table = bind_partition(self.config.conninfo, bindings, relid)
            if table is not None:
                self._tables_checked = float("-inf")  # an attached partition: look now
            elif relation is not None:
                name = f"{relation.namespace}.{relation.relname}"
                for configured, current in bindings.current_names.items():
                    if name in (configured, current):
                        raise PipelineFailed(
                            f"table {name} was dropped and created again while the pipeline "
                            f"ran (OID {bindings.oids[configured]}, now {relid}): its "
                            "targets hold the old table; move them away (or delete them) "
                            f"and remove {configured} from the pipeline's tables.json to copy "
                            "the new one"
                        )
                self._unbound.add(relid)
        return table

    def plan_work(self, ranges: dict[int, list[SpoolRange]]) -> list[TableWork]:
        """One `TableWork` per configured table with changes in `ranges` (a batch's), its
        column types resolved here (the answers go with the work)."""
        per_table: dict[str, list[SpoolRange]] = {}
        for relid, found in ranges.items():
            last = found[-1].versions[-1] if found and found[-1].versions else None
            table = self._table_of(relid, None if last is None else self._relation(last))
            if table is not None:
                per_table.setdefault(table, []).extend(found)
        works = []
        bindings = self.bind()
        for table, found in per_table.items():
            oids = sorted(
                {c.type_oid for r in found for v in r.versions for c in self._relation(v).columns}
            )
            works.append(
                TableWork(
                    table,
                    tuple(s.spec for s, _ in self.targets[table]),
                    tuple(found),
                    self.types.describe(oids),
                    self.config.app_id,
                    self.config.conninfo,
                    on_error=self.config.on_error.get(table, "stop"),
                    own_oid=bindings.oids.get(table),
                    leaves=frozenset(bindings.leaves.get(table, ())),
                    pending_log=self._pending_path(table),
                    pending=table in self.pending,
                    storage_options=self.state.storage_options,
                    changes=sum(r.changes for r in found),
                )
            )
        return works

    def _run_tasks(self, works: list[TableWork]) -> tuple[list[TableOutcome], str]:
        """The batch's tables applied: by the driver itself when the batch is small (a
        Spark job's set-up would cost more), else by a Spark job; and which ("inline",
        "job"). Tasks that do not run on this machine (a cluster's, a Spark Connect server's)
        get the tables' changes read from the spool into their work: only the driver can read
        it."""
        if not works:
            return [], "inline"
        small = sum(w.changes for w in works) <= self.config.inline_max_changes
        dispatcher = self._inline if small else self.dispatcher
        if not dispatcher.same_host:
            works = [replace(w, ranges=load_ranges(w.ranges)) for w in works]
        groups = group_work(works, dispatcher.parallelism)
        try:
            results = dispatcher.map(apply_tables, groups)
        except DispatchError as exc:
            raise PipelineFailed(str(exc)) from None
        return [outcome for result in results for outcome in result], ("inline" if small else "job")

    def apply_batch(self, batch_id: int, start: Lsn, end: Lsn) -> BatchReport:
        """Apply the spooled transactions ending in (start, end] to every target."""
        assert self.spooler is not None
        started = time.monotonic()
        spool = self.spooler.spool
        info = spool.batch(start, end)
        works = self.plan_work(spool.ranges(start, end))
        planned = time.monotonic()
        outcomes, how = self._run_tasks(works)
        phases = {"plan": planned - started, how: time.monotonic() - planned}
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
                self._set_aside(outcome.table, outcome.error, str(first))
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
            phases={name: round(seconds, 6) for name, seconds in report.phases.items()},
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
        (`pgcdc.pipeline._bindings`): raises `BindingError` naming a table that cannot be
        followed; a table whose rows changed since with no change in the stream is
        resynchronized."""
        if self.bindings is None:
            bindings, events = inspect_tables(
                self.config.conninfo,
                self.config.publications,
                self.targets,
                self.state,
            )
            for event in events:
                if not event.resync:
                    raise BindingError(event.line)
            self.bindings = bindings
            self._react(events)
        return self.bindings

    def watch_tables(self, every: float = 5.0) -> None:
        """At most every `every` seconds, look for what the stream cannot show
        (`pgcdc.pipeline._bindings.inspect_tables`): a table dropped and created again, one that
        left its publication, stops the pipeline (or sets the table aside, with
        ``on_error = "quarantine"``); a table that came back to its publication, or gained
        or lost partitions, is resynchronized while the others stream."""
        now = time.monotonic()
        if now - self._tables_checked < every:
            return
        self._tables_checked = now
        bindings, events = inspect_tables(
            self.config.conninfo,
            self.config.publications,
            self.targets,
            self.state,
            self.bind(),
        )
        for table, routes in self.bind().routes.items():  # partitions bound on the way
            bindings.routes.setdefault(table, routes)
        stopping = [e for e in events if e.kind in ("recreated", "publish")]
        stopping += [
            e
            for e in events
            if e.kind == "unpublished" and self.config.on_error.get(e.table, "stop") == "stop"
        ]
        if stopping:
            raise PipelineFailed(stopping[0].line)
        for event in events:
            if event.kind == "gone" and event.table not in self._warned:
                self._warned.add(event.table)
                log.warning("%s", event.line)
            elif event.kind == "unpublished" and event.table not in self.pending:
                self._set_aside(event.table, event.line, "")
        self.bindings = bindings
        self._react(events)

    def _react(self, events: list[TableEvent]) -> None:
        """Resynchronize the tables `events` say changed with no change in the stream."""
        resync = []
        for event in events:
            if not event.resync or event.table in self.pending:
                continue
            on_detach = self.config.on_detach.get(event.table, "remove")
            if event.kind == "partitions" and not event.attached and on_detach == "keep":
                log.warning('%s; on_detach = "keep": their rows stay', event.line)
                continue
            log.warning("%s", event.line)
            self.quarantine.request_resync(event.table, event.line)
            self.pending.add(event.table)
            resync.append(event.table)
        if resync and self.config.snapshot and self.spooler is not None:  # (else `start`)
            self._copy_later(resync, resync=True)

    def _set_aside(self, table: str, reason: str, since: str) -> None:
        """Quarantine `table`: its changes go to its pending change log from now on."""
        self.quarantine.add(table, reason, since)
        self.pending.add(table)
        if self.metrics is not None:
            self.metrics.set_quarantined(table, reason)
        log.error(
            "%s is quarantined: %s; its changes go to its change log until "
            "`pgcdc recopy PIPELINE.toml %s`",
            table,
            reason,
            table,
        )

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
            self.dispatcher,
            config.conninfo,
            config.slot,
            {table: [t for _, t in targets] for table, targets in self.targets.items()},
            self.state,
            chunk_blocks=config.chunk_blocks,
            on_progress=progress,
            source_names=self.bind().current_names,
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
                self._copy_failed(table, progress.error)
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
            elif ready and self.state.exists(_pending_name(table)):
                self._drain(table)  # a crash came after the copy, before the drain ended
        if waiting:
            self._copy_later(sorted(waiting), resync=False)
        if resync and config.snapshot:
            self._copy_later(sorted(resync), resync=True)

    def _copy_later(self, tables: list[str], *, resync: bool) -> None:
        """Copy (or resynchronize) `tables` in a thread while the stream goes on; their
        changes go to their pending change logs meanwhile."""
        thread = threading.Thread(
            target=self._copy_online,
            args=(tables, resync),
            name="pgcdc-online-copy",
            daemon=True,
        )
        self._copies.append(thread)
        if self.spooler is not None:  # running: start now (else when the stream starts)
            thread.start()

    def _identity(self) -> tuple[str | None, int | None]:
        with ReplicationConnection.connect(self.config.conninfo) as rconn:
            identity = rconn.identify_system()
        return identity.systemid, identity.timeline

    def _pending_path(self, table: str) -> str:
        """Where the table's pending change log is (a Delta table in the state)."""
        return self.state.location(_pending_name(table))

    def _copy_online(self, tables: list[str], resync: bool) -> None:
        keep = frozenset(t for t in tables if self.config.on_detach.get(t) == "keep")
        try:
            _, copied = self._copier().copy_online(tables, resync=resync, keep=keep)
        except PgcdcError as exc:
            self._copy_failures.update(dict.fromkeys(tables, str(exc)))
            return
        self._online_done.update(copied)
        for table in set(tables) - copied:
            self._copy_failures[table] = self.copy_progress[table].error or "failed"

    def _copy_failed(self, table: str, error: str) -> None:
        """A table's copy failed: with ``on_error = "stop"`` the pipeline stops with one line
        (the next run copies it again); with "quarantine" the table is set aside."""
        line = f"copy of {table} failed: {error}"
        if self.config.on_error.get(table, "stop") == "stop":
            raise PipelineFailed(f"{line}; it is copied again at the next run")
        if table not in self.quarantine.records():
            self._set_aside(table, line, "")

    def _drain(self, table: str) -> None:
        """The table's copy is in: apply what the stream brought meanwhile (the targets skip
        what the copy already holds), then forget the pending log."""
        log = TargetSpec(
            self._pending_path(table), "changelog", storage_options=self.state.storage_options
        )
        pending = open_target(log, app_id=self.config.app_id)
        if pending.exists:
            rows = pending.to_arrow()
            columns = pc.list_flatten(rows.column("columns"))
            if len(columns):
                oids = pc.unique(pc.struct_field(columns, "type_oid")).to_pylist()
                self.types.describe(o for o in oids if o is not None)
            for spec, _ in self.targets[table]:
                self._open(spec).apply(rows)
        self.state.delete_tree(_pending_name(table))
        self.pending.discard(table)
        self.quarantine.lift(table)

    def _drain_copied(self) -> None:
        for table, error in list(self._copy_failures.items()):
            del self._copy_failures[table]
            self._copy_failed(table, error)
        for table in list(self._online_done):
            self._online_done.discard(table)
            self._drain(table)

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
        bindings = self.bind()
        for table, targets in self.targets.items():
            recorded = next(
                (r for _, t in targets if (r := t.recorded_columns()) is not None), None
            )
            if recorded is not None and table in bindings.oids and table not in bindings.leaves:
                columns = [(c.attnum, (c.name, c.type_oid, c.type_modifier)) for c in recorded]
                identities.seed(bindings.oids[table], columns)
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
        self.lineage.streaming(config.slot, identity.systemid, identity.timeline)
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
        self.bind()
        self._check_failover()
        _ = self.dispatcher

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
        self.start()
        for thread in self._copies:
            if thread.ident is None:
                thread.start()
        start = Lsn(get_slot(self.config.conninfo, self.config.slot).confirmed_flush_lsn or 0)
        self.spooler = spooler = self._session()
        # The Python workers import what the tasks need while the session spools.
        forget_open_targets()
        self.dispatcher.map(warm_up, range(self.dispatcher.parallelism))
        try:
            self._stream(spooler, start, tick)
            for thread in self._copies:  # available-now: the copies finish before the run
                thread.join()
            self._drain_copied()
        except PipelineFailed:
            raise
        except PgcdcError as exc:
            raise PipelineFailed(str(exc)) from None
        finally:
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
            self._drain_copied()
            self.watch_wal()
            self.watch_tables()
            self.watch_lag(applied)
            spooler.check()
            end, _ = spooler.spool.plan(
                applied,
                max_changes=config.max_changes_per_batch,
                max_bytes=config.max_bytes_per_batch,
                upto=target,
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


def _pending_name(table: str) -> str:
    """The pending change log of `table` in the pipeline's state (a Delta table)."""
    return f"pending/{table}"


def _slot_or_none(conninfo: str, slot: str) -> SlotInfo | None:
    try:
        return get_slot(conninfo, slot)
    except SlotNotFound:
        return None


class SlotLost(PgcdcError):
    """The pipeline's slot no longer exists though its targets hold data."""


class PipelineFailed(PgcdcError):
    """The pipeline stopped with an error (the first line of it, cleaned up)."""
