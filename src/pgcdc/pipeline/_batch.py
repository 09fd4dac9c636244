"""A batch of spooled transactions applied to every target: one `TableWork` per table with
changes (its column types resolved on the driver), run by the driver itself (its threads, or
its apply processes: `pgcdc.pipeline._appliers`) unless a large backlog waits (then by a
Spark job); a table
whose changes fail under ``on_error = "quarantine"`` is set aside; the batch's line goes to
the batch log and the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pgcdc.errors import PipelineFailed
from pgcdc.monitoring import BatchLog, BatchRecord, PipelineMetrics
from pgcdc.pipeline._appliers import ApplierPool
from pgcdc.pipeline._bindings import TableBindings
from pgcdc.pipeline._dispatch import Dispatcher, DispatchError, InlineDispatcher
from pgcdc.pipeline._online import OnlineCopies
from pgcdc.pipeline._tables import FollowedTables
from pgcdc.pipeline._work import (
    TableOutcome,
    TableWork,
    apply_tables,
    group_work,
    maintain_open,
    warm_tables,
)
from pgcdc.pipeline.config import PipelineConfig
from pgcdc.protocol import Decoder, Lsn, Relation
from pgcdc.spool._session import Spooler
from pgcdc.spool._spool import SpoolRange, load_ranges
from pgcdc.types.catalog import TypeCatalog

__all__ = ["BatchApplier", "BatchReport", "PipelineStats", "batch_bounds"]


def batch_bounds(
    pending: int, inline_max_changes: int, max_changes: int | None
) -> tuple[int | None, bool]:
    """The most changes the next batch may hold, given the changes waiting (`pending`), and
    whether the driver applies it (else a Spark job).

    The driver keeps its targets open between batches (in its threads or its apply
    processes), a Spark job's tasks open theirs anew in each worker (the first job of a run
    starts the workers too). So whatever waits, up to ``inline_max_changes``, is one batch
    the driver applies: under a live load a slow batch is followed by a larger one, cheaper
    per change, and still the driver's. A larger backlog (a run starting behind, a burst)
    goes to Spark jobs, in batches up to ``max_changes_per_batch``: their tasks run in
    processes of their own, on as many cores as Spark has, while the driver's threads share
    one interpreter with the replication thread, busy receiving the backlog."""
    if pending > inline_max_changes or not inline_max_changes:
        return max_changes, False
    limit = inline_max_changes if max_changes is None else min(max_changes, inline_max_changes)
    return limit, True


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


class BatchApplier:
    """Applies batches of one pipeline. `dispatcher` gives where a batch too large for the
    driver runs (the Spark session is started on first use)."""

    def __init__(
        self,
        config: PipelineConfig,
        tables: FollowedTables,
        copies: OnlineCopies,
        types: TypeCatalog,
        batch_log: BatchLog,
        *,
        dispatcher: Callable[[], Dispatcher],
    ) -> None:
        self.config = config
        self.tables = tables
        self.copies = copies
        self.types = types
        self.batch_log = batch_log
        self._dispatcher = dispatcher
        #: The processes that apply the batches the driver keeps (`start`), or None: threads
        #: of this process do (``apply_processes = 0``: `_inline`).
        self._appliers: ApplierPool | None = None
        self._inline = InlineDispatcher(parallelism=2)
        #: The gauges to keep, while the pipeline serves metrics.
        self.metrics: PipelineMetrics | None = None
        self._relations: dict[bytes, Relation] = {}
        #: Seconds of maintenance between batches since the last batch's report.
        self._maintained = 0.0
        #: Tables whose targets the driver applies to have been read ahead, or applied to.
        self._warmed: set[str] = set()

    def start(self) -> None:
        """Lease the apply processes (new ones import what they need while the session
        starts; `pgcdc.pipeline._appliers`)."""
        if self.config.apply_processes and self._appliers is None:
            self._appliers = ApplierPool.lease(self.config.apply_processes)

    def close(self) -> None:
        """Give the apply processes back, for the next run of this process."""
        appliers, self._appliers = self._appliers, None
        if appliers is not None:
            appliers.give_back()

    def _relation(self, encoded: bytes) -> Relation:
        relation = self._relations.get(encoded)
        if relation is None:
            message = Decoder(1).decode(encoded)
            assert isinstance(message, Relation)
            relation = self._relations[encoded] = message
        return relation

    def plan_work(self, ranges: dict[int, list[SpoolRange]]) -> list[TableWork]:
        """One `TableWork` per configured table with changes in `ranges` (a batch's), its
        column types resolved here (the answers go with the work)."""
        tables = self.tables
        per_table: dict[str, list[SpoolRange]] = {}
        for relid, found in ranges.items():
            last = found[-1].versions[-1] if found and found[-1].versions else None
            table = tables.table_of(relid, None if last is None else self._relation(last))
            if table is not None:
                per_table.setdefault(table, []).extend(found)
        bindings = tables.bind()
        return [self._work(table, found, bindings) for table, found in per_table.items()]

    def _work(self, table: str, found: list[SpoolRange], bindings: TableBindings) -> TableWork:
        oids = sorted(
            {c.type_oid for r in found for v in r.versions for c in self._relation(v).columns}
        )
        config, tables = self.config, self.tables
        return TableWork(
            table,
            tuple(s.spec for s, _ in tables.targets[table]),
            tuple(found),
            self.types.describe(oids),
            config.app_id,
            config.conninfo,
            on_error=config.on_error.get(table, "stop"),
            own_oid=bindings.oids.get(table),
            leaves=frozenset(bindings.leaves.get(table, ())),
            pending_log=self.copies.pending_location(table),
            pending=table in tables.pending,
            storage_options=tables.state.storage_options,
            changes=sum(r.changes for r in found),
            read_cache=config.read_cache,
        )

    def run_tasks(self, works: list[TableWork], by_driver: bool) -> tuple[list[TableOutcome], str]:
        """The batch's tables applied: by the driver itself (`batch_bounds` says when; its
        apply processes, else its threads), else by a Spark job; and which ("inline",
        "job"). Tasks that do not run on this machine (a cluster's, a Spark Connect
        server's) get the tables' changes read from the spool into their work: only the
        driver can read it."""
        if not works:
            return [], "inline"
        if by_driver:  # its targets are maintained between batches (`maintain_between`)
            works = [replace(w, maintain=False) for w in works]
            self._warmed.update(w.table for w in works)
            if self._appliers is not None:
                try:
                    return self._appliers.apply(works), "inline"
                except DispatchError as exc:
                    raise PipelineFailed(str(exc)) from None
        dispatcher = self._inline if by_driver else self._dispatcher()
        if not dispatcher.same_host:
            works = [replace(w, ranges=load_ranges(w.ranges)) for w in works]
        groups = group_work(works, dispatcher.parallelism)
        try:
            results = dispatcher.map(apply_tables, groups)
        except DispatchError as exc:
            raise PipelineFailed(str(exc)) from None
        return [outcome for result in results for outcome in result], (
            "inline" if by_driver else "job"
        )

    def maintain_between(self) -> bool:
        """One maintenance pass of a target the driver keeps open, if one is due (called
        while the driver waits for the next batch: a pass after a batch would hold back
        the next one, and passes of several targets often fall due in the same batch);
        whether one ran."""
        started = time.monotonic()
        try:
            if self._warm_one():
                ran = True
            elif self._appliers is None:
                ran = maintain_open()
            else:
                ran = self._appliers.maintain()
        except DispatchError as exc:
            raise PipelineFailed(str(exc)) from None
        self._maintained += time.monotonic() - started
        return ran

    def _warm_one(self) -> bool:
        """The targets of one table that no batch the driver applied has touched yet read
        ahead (`warm_tables`), if one is left that is not waiting for its copy; whether one
        was. Its first batch under random changes would do it, holding back the commit."""
        skip = self._warmed | self.tables.pending
        table = next((t for t in self.tables.targets if t not in skip), None)
        if table is None:
            return False
        self._warmed.add(table)
        work = self._work(table, [], self.tables.bind())
        if self._appliers is None:
            warm_tables([work])
        else:
            self._appliers.warm([work])
        return True

    def apply(
        self, batch_id: int, spooler: Spooler, start: Lsn, end: Lsn, *, by_driver: bool
    ) -> BatchReport:
        """Apply the spooled transactions ending in (start, end] to every target, by the
        driver itself or by a Spark job."""
        started = time.monotonic()
        spool = spooler.spool
        info = spool.batch(start, end)
        works = self.plan_work(spool.ranges(start, end))
        planned = time.monotonic()
        outcomes, how = self.run_tasks(works, by_driver)
        phases = {"plan": planned - started, how: time.monotonic() - planned}
        if self._maintained:  # between the last batch and this one
            phases["maintain"], self._maintained = self._maintained, 0.0
        for outcome in outcomes:
            for phase, seconds in outcome.phases.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
        applied: dict[str, int] = {}
        skipped = 0
        for outcome in outcomes:
            applied.update(outcome.applied)
            skipped += outcome.skipped
            self._judge(outcome)
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
        self._record(report, spooler, info.bytes, info.first_commit_lsn, end, outcomes)
        return report

    def _judge(self, outcome: TableOutcome) -> None:
        """A table's failed outcome: quarantined now (its changes went to its pending log),
        or the pipeline stops with its line."""
        if outcome.error is None:
            return
        if outcome.pending and outcome.table not in self.tables.pending:  # quarantined now
            first = Lsn(outcome.first_commit_lsn or 0)
            self.tables.set_aside(outcome.table, outcome.error, str(first))
        elif not outcome.pending:
            raise PipelineFailed(
                f'{outcome.error}; nothing of it is confirmed (on_error = "quarantine" '
                "for this table lets the others stream on)"
            )
        else:
            raise PipelineFailed(f"{outcome.table}: its pending change log: {outcome.error}")

    def _record(
        self,
        report: BatchReport,
        spooler: Spooler,
        size: int,
        first: Lsn | None,
        end: Lsn,
        outcomes: list[TableOutcome],
    ) -> None:
        """The batch's line in the batch log, and the metrics."""
        now = datetime.now(UTC)
        server = spooler.server_position or None
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
