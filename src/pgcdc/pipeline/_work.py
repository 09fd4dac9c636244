"""One micro-batch of the pipeline, applied by Spark tasks: the executors' side.

The driver plans a batch (a range of spooled transactions) and cuts it into `TableWork`s,
one per configured table with changes: the table's spool ranges, its targets and what typing
needs (the descriptions of its types, read on the driver). Tasks on the driver's machine read
the ranges from the spool's files; for tasks elsewhere (a cluster's executors, a Spark
Connect server's) the ranges carry their bytes, read on the driver: executors need no
filesystem shared with it. Spark tasks run `apply_tables` on groups of them, in parallel:
each reads its ranges a column at a time (`pgcdc.spool._spool.read_changes`: the
rows per relation shape, the envelope only when something needs it) and applies them to
every target of the table, each committing its data with the batch's watermark. Only a small
`TableOutcome` per table goes back to the driver.

A table whose targets cannot take its changes (a type change they cannot follow, a value out
of range, a storage error) is reported in one line naming the table, the change, its key and
its LSN; with ``on_error = "quarantine"`` its changes go to its pending change log instead,
so the batch still completes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import ChangeBatch
from pgcdc.errors import TargetError, first_line
from pgcdc.protocol import Lsn
from pgcdc.snapshot.fill import SourceFills
from pgcdc.spool._spool import SpoolRange, read_changes
from pgcdc.targets import READ_CACHE_BYTES, Target, TargetSpec, decoded_columns, open_target
from pgcdc.types.catalog import TypeDescriptions
from pgcdc.types.registry import TypeRegistry

log = logging.getLogger(__name__)

__all__ = [
    "TableOutcome",
    "TableWork",
    "apply_error_line",
    "apply_tables",
    "forget_open_targets",
    "group_work",
    "maintain_open",
    "warm_tables",
    "warm_up",
]


@dataclass(frozen=True, slots=True)
class TableWork:
    """What a task needs to apply one table's part of a batch (all of it pickles)."""

    table: str
    targets: tuple[TargetSpec, ...]
    #: The table's changes: spool ranges (with their bytes for tasks on other machines:
    #: `pgcdc.spool._spool.load_ranges`).
    ranges: tuple[SpoolRange, ...]
    #: The descriptions of the user-defined types its columns have (read on the driver).
    types: TypeDescriptions
    app_id: str
    conninfo: str
    on_error: str = "stop"
    #: The table's own OID and its partitions' (a TRUNCATE of some of them only is refused).
    own_oid: int | None = None
    leaves: frozenset[int] = frozenset()
    #: The table's pending change log: where its changes go while it waits for its copy or
    #: is quarantined (`pending`), or from this batch on when quarantined now.
    pending_log: str = ""
    pending: bool = False
    #: The pending log's storage options (its targets' own are in their specs).
    storage_options: Mapping[str, str] | None = None
    changes: int = 0
    #: The bytes of its targets' columns the process keeps decoded (``target.read_cache``).
    read_cache: int = READ_CACHE_BYTES
    #: Maintain the targets after applying (a Spark task); False: the driver, which applies
    #: the batch itself, maintains its open targets between batches (`maintain_open`).
    maintain: bool = True


@dataclass(slots=True)
class TableOutcome:
    table: str
    changes: int
    #: Rows applied per target ("schema.table mode"); replayed rows are not counted.
    applied: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    seconds: float = 0.0
    #: The one-line error, when the targets could not take the changes.
    error: str | None = None
    #: The changes went to the pending change log (quarantined now, or waiting for a copy).
    pending: bool = False
    #: The first commit LSN of the batch (for the quarantine's record).
    first_commit_lsn: int | None = None
    last_commit_time: datetime | None = None
    #: Seconds per phase: "read" (spool to envelope), "fold" (watermark, folding, typing),
    #: "write" (the Delta commits).
    phases: dict[str, float] = field(default_factory=dict)


def group_work(works: list[TableWork], tasks: int) -> list[list[TableWork]]:
    """At most `tasks` groups of about equal changes (largest first), so that a batch of
    many small tables does not pay a task per table."""
    groups: list[list[TableWork]] = [[] for _ in range(min(tasks, len(works)))]
    loads = [0] * len(groups)
    for work in sorted(works, key=lambda w: -w.changes):
        at = loads.index(min(loads))
        groups[at].append(work)
        loads[at] += max(work.changes, 1)
    return [g for g in groups if g]


def warm_up(_: object) -> bool:
    """A task that only imports what `apply_tables` needs: run once per executor core at the
    start, so that the first batch does not wait for the Python workers' imports; a worker
    kept from an earlier run forgets the targets it had open."""
    import deltalake  # noqa: F401

    forget_open_targets()
    return True


def apply_tables(works: Iterable[TableWork]) -> list[TableOutcome]:
    """Runs where the work is dispatched (a Spark task, or the driver for a small batch):
    each table's changes to its targets (see the module)."""
    return [_apply(work) for work in works]


#: The targets this process applies to, kept open between batches (a Spark Python worker
#: runs many tasks; the driver, or an apply process of its (`pgcdc.pipeline._appliers`),
#: applies its tables' part of every small batch): their tables' logs are read
#: from where they were, not anew. By (path, mode, app id).
_OPEN: dict[tuple[str, str, str], Target] = {}


def _target(work: TableWork, spec: TargetSpec, registry: TypeRegistry) -> Target:
    """`spec`'s target, open since an earlier batch of this process or opened now, typing
    with `registry` (the types may have been described anew since)."""
    key = (spec.path, spec.mode, work.app_id)
    target = _OPEN.get(key)
    if target is None or target.spec != spec:
        fills = SourceFills(work.conninfo)
        target = open_target(
            spec, app_id=work.app_id, registry=registry, source=work.table, fills=fills
        )
        _OPEN[key] = target
    target.registry = registry
    return target


def forget_open_targets() -> None:
    """Targets are opened anew from now on (a run starts; targets were removed)."""
    _OPEN.clear()


def warm_tables(works: Iterable[TableWork]) -> float:
    """The targets of tables no batch has touched yet opened, and what their first batch
    would read read ahead (`Target.warm`: a large table's key index, a history's current
    rows); the seconds it took. A target that cannot is opened anew by its first batch,
    which says why."""
    started = time.monotonic()
    for work in works:
        decoded_columns().budget = work.read_cache
        registry = work.types.registry()
        for spec in work.targets:
            try:
                _target(work, spec, registry).warm()
            except Exception as exc:  # (reading ahead is not needed for correctness)
                log.debug("reading ahead %s failed: %s", spec.path, exc, exc_info=True)
                _OPEN.pop((spec.path, spec.mode, work.app_id), None)
    return time.monotonic() - started


def maintain_open() -> bool:
    """One maintenance pass over a target open in this process that is due for one (the
    driver, between the batches it applies itself: at most one pass per call, so passes
    that fall due together are spread over the waits of several batches); whether one ran.
    The targets are asked in turn, from the one after the last that ran. A pass that fails
    is logged, and its target opened anew by the next batch (which then says what fails)."""
    keys = list(_OPEN)
    for i, key in enumerate(keys):
        target = _OPEN[key]
        try:
            ran = target.maintain()
        except Exception as exc:  # (maintenance is not needed for correctness)
            log.warning("maintenance of %s failed: %s", target, exc)
            _OPEN.pop(key, None)
            ran = True
        if ran:
            for done in keys[: i + 1]:  # asked last next time
                if done in _OPEN:
                    _OPEN[done] = _OPEN.pop(done)
            return True
    return False


def _apply(work: TableWork) -> TableOutcome:
    started = time.monotonic()
    decoded_columns().budget = work.read_cache
    batch = read_changes(work.ranges)
    outcome = TableOutcome(work.table, batch.num_rows)
    outcome.phases = {
        "read": time.monotonic() - started,
        "fold": 0.0,
        "write": 0.0,
        "maintain": 0.0,
    }
    outcome.first_commit_lsn = batch.first_commit_lsn
    outcome.last_commit_time = batch.last_commit_time
    try:
        if work.pending:
            _log(work, batch, outcome)
        else:
            if not batch.row_changes_only:  # truncations among the rows, perhaps
                _check_truncates(work, batch.envelope())
            registry = work.types.registry()
            for spec in work.targets:
                target = _target(work, spec, registry)
                result = target.apply(batch)
                maintained = time.monotonic()
                if work.maintain:
                    target.maintain()
                outcome.applied[f"{work.table} {spec.mode}"] = result.applied
                outcome.skipped += result.skipped
                outcome.phases["fold"] += result.fold_seconds
                outcome.phases["write"] += result.write_seconds
                outcome.phases["maintain"] += time.monotonic() - maintained
    except Exception as exc:
        for spec in work.targets:  # its state may be half-way: open it anew next time
            _OPEN.pop((spec.path, spec.mode, work.app_id), None)
        outcome.error = apply_error_line(work.table, batch.envelope(), exc)
        log.debug("%s", outcome.error, exc_info=True)  # the traceback, for a bug report
        if work.on_error == "quarantine" and not work.pending:
            _log(work, batch, outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


def _log(work: TableWork, batch: ChangeBatch, outcome: TableOutcome) -> None:
    """The changes to the table's pending change log, durably (the slot may then move)."""
    log = TargetSpec(work.pending_log, "changelog", storage_options=work.storage_options)
    open_target(log, app_id=work.app_id, source=work.table).apply(batch.envelope())
    outcome.pending = True
    outcome.applied[f"{work.table} pending"] = batch.num_rows


def _check_truncates(work: TableWork, rows: pa.Table) -> None:
    """A TRUNCATE of some partitions only (a publication without publish_via_partition_root
    sends each partition's own) cannot be applied to the parent's targets: they do not know
    which rows were that partition's."""
    if not work.leaves:
        return
    truncates = rows.filter(pc.equal(rows.column("op"), "truncate"))
    by_commit: dict[int, set[int]] = {}
    for lsn, oid in zip(
        truncates.column("commit_lsn").to_pylist(),
        truncates.column("relation_oid").to_pylist(),
        strict=True,
    ):
        by_commit.setdefault(lsn, set()).add(oid)
    for lsn, oids in by_commit.items():
        if work.own_oid in oids or work.leaves <= oids:
            continue
        partial = oids & work.leaves
        if partial:
            raise TargetError(
                f"TRUNCATE of some of its partitions only (OIDs "
                f"{', '.join(map(str, sorted(partial)))}) at commit LSN {Lsn(lsn)} cannot "
                "be applied to the parent's targets; recopy the table"
            )


_DATA_FILE = re.compile(r"\S*\.parquet\b|\b(?:file|s3a?|abfss?|gs)://\S+")


def apply_error_line(table: str, rows: pa.Table, exc: BaseException) -> str:
    """One line for a batch of `table` its targets could not take: the commit LSNs, the
    first change and its key, and the error's first line without data file names."""
    reason = first_line(exc)
    reason = _DATA_FILE.sub("<data file>", reason)
    if not rows.num_rows:
        return f"{table}: {reason}"
    lsns = rows.column("commit_lsn")
    low, high = Lsn(pc.min(lsns).as_py()), Lsn(pc.max(lsns).as_py())
    order = pc.sort_indices(
        rows.select(["commit_lsn", "ordinal"]),
        [("commit_lsn", "ascending"), ("ordinal", "ascending")],
    )
    first = rows.take(order.slice(0, 1)).to_pylist()[0]
    key = ", ".join(f"{k}={v}" for k, v in (first["key"] or []))
    span = f"commit LSN {low}" if low == high else f"commit LSNs {low} to {high}"
    return (
        f"{table}: cannot apply {rows.num_rows} change{'' if rows.num_rows == 1 else 's'} "
        f"at {span} (first: {first['op']} "
        f"of key ({key}) at LSN {Lsn(first['lsn'] or 0)}): {reason}"
    )
