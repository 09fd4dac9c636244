"""The initial copy of a pipeline's tables, handed off to the stream at the slot's consistent
point.

First run: the pipeline records that it is about to create its slot, then creates it with an
exported snapshot (reference §2); its consistent point P is where the stream will start. Every
table is planned into block ranges (`pgcdc.snapshot.plan`) and the chunks are copied in
parallel by Spark tasks, each importing the snapshot (``SET TRANSACTION SNAPSHOT``), so together
they are the database exactly as of P. Each task appends its rows to the targets in a Delta
commit that names the chunk; when every chunk is in, each target records P as its watermark
and the stream takes over from P.

A crash before the copy finished (also one between the slot's creation and the saving of the
plan: the record written before the slot says the slot is the pipeline's own) starts the copy
again: the exported snapshot died with its connection, and chunks read under another snapshot
would not be the database at one point (rows move between chunks, history versions would start
at the wrong LSN, an unchanged TOAST value of a row moved by a key change could not be found).
Nothing has been streamed yet, so the slot is dropped and created again with a new snapshot,
the targets are emptied and every chunk is copied once more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
from psycopg import sql

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA, Shape, snapshot_reads
from pgcdc.errors import PgcdcError, SlotNotFound, ValueOutOfRange
from pgcdc.pipeline._dispatch import Dispatcher
from pgcdc.pipeline._lineage import SlotLineage
from pgcdc.protocol import Lsn, Relation
from pgcdc.replication.connection import ReplicationConnection
from pgcdc.replication.slots import connect_sql, drop_slot
from pgcdc.snapshot.copy import copy_query, copy_schema, read_copy
from pgcdc.snapshot.guard import (
    LockWanted,
    SnapshotGuard,
    TablesRewritten,
    share_lock_nowait,
    wait_for_locks,
)
from pgcdc.snapshot.plan import DEFAULT_CHUNK_BLOCKS, Chunk, SnapshotError, plan_chunks
from pgcdc.snapshot.relation import catalog_relation
from pgcdc.storage import FileIO
from pgcdc.targets import Target, TargetSpec, open_target
from pgcdc.targets.base import copy_watermark
from pgcdc.targets.delta import CHUNK_KEY, POINT_KEY
from pgcdc.types.catalog import TypeDescriptions

__all__ = ["CHUNK_KEY", "POINT_KEY", "InitialCopy", "TableProgress"]

log = logging.getLogger(__name__)

#: How many snapshots a copy takes before it gives up on tables rewritten under it.
_ATTEMPTS = 5
#: How many times a copy lets a conflicting lock (a TRUNCATE, DDL) through and starts again
#: before it gives up.
_YIELDS = 20

T = TypeVar("T")


@dataclass(slots=True)
class TableProgress:
    table: str
    chunks: int
    estimated_rows: int
    point: int = 0
    chunks_done: int = 0
    rows_done: int = 0
    started: float = field(default_factory=time.monotonic)
    error: str | None = None
    #: Seconds the chunks' tasks spent, summed: "read" (the COPY: the server, the transfer,
    #: splitting rows), "type" (text to typed columns), "write" (the targets' commits).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows_done / elapsed if elapsed > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """From the time the chunks done took (chunks are about the same size)."""
        if self.chunks_done >= self.chunks:
            return 0.0
        if not self.chunks_done:
            return None
        elapsed = time.monotonic() - self.started
        return elapsed / self.chunks_done * (self.chunks - self.chunks_done)


@dataclass(frozen=True, slots=True)
class _Task:
    """What one Spark task needs: all of it pickles."""

    conninfo: str
    snapshot: str
    chunk: Chunk
    relation: Relation
    types: TypeDescriptions
    targets: tuple[TargetSpec, ...]
    app_id: str
    point: int
    #: The chunk's place in its table's plan (distinct versions' ordinals).
    position: int
    #: What the relation's columns are (attnums), for a change log's snapshot reads.
    attnums: tuple[int, ...] = ()


def _session(conninfo: str, snapshot: str) -> Any:
    conn = connect_sql(conninfo, pinned_settings=True)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
    return conn


def _rows(task: _Task, timings: dict[str, float]) -> tuple[pa.Table, pa.Table | None] | None:
    """The chunk's rows typed, and as snapshot reads when a target is a change log; None
    when another session holds or waits for a lock on the table that conflicts with reading
    it (`pgcdc.snapshot.guard.share_lock_nowait`: waiting would stall the copy and the
    source)."""
    relation = task.relation
    registry = task.types.registry()
    reads: list[pa.RecordBatch] = []
    wanted = any(spec.mode == "changelog" for spec in task.targets)
    first = -(task.position << 32) - 1

    def read_rows(strings: list[pa.Array]) -> None:
        ordinal = first - sum(b.num_rows for b in reads)
        reads.append(snapshot_reads(relation, task.attnums, strings, task.point, ordinal))

    conn = _session(task.conninfo, task.snapshot)
    try:
        chunk = task.chunk
        relation_name = f"{relation.schema}.{relation.relname}"
        if not share_lock_nowait(conn, list(dict.fromkeys([relation_name, chunk.leaf]))):
            return None
        query = copy_query(
            relation, chunk.leaf, first_block=chunk.first_block, end_block=chunk.end_block
        )
        try:
            batches = list(
                read_copy(
                    conn,
                    query,
                    relation,
                    registry,
                    table_name=chunk.table,
                    timings=timings,
                    on_texts=read_rows if wanted else None,
                )
            )
        except ValueOutOfRange as exc:
            where = f"in the initial copy at {Lsn(task.point)}, chunk {chunk.id}"
            raise exc.located(where=where) from None
    finally:
        conn.close()
    typed = pa.Table.from_batches(batches, schema=copy_schema(relation, registry))
    return typed, pa.Table.from_batches(reads, ENVELOPE_ARROW_SCHEMA) if wanted else None


def copy_chunk(task: _Task) -> dict[str, float] | None:
    """Runs on an executor: reads the chunk under the snapshot and writes it to every target
    (`Target.write_chunk`: one commit each, naming the chunk; a change log gets the rows as
    snapshot reads). Returns the seconds spent (`TableProgress.phases`), or None when the
    chunk was not read: a conflicting lock on its table is held or wanted (`_rows`)."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    read_rows = _rows(task, timings)
    if read_rows is None:
        return None
    rows, reads = read_rows
    read = time.perf_counter()
    for spec in task.targets:
        target = open_target(spec, app_id=task.app_id)
        chunk = reads if spec.mode == "changelog" else rows
        assert chunk is not None
        target.write_chunk(chunk, task.chunk.id, task.point, task.position)
    timings["read"] = read - started - timings.get("type", 0.0)
    timings["write"] = time.perf_counter() - read
    return timings


class InitialCopy:
    """Copies a pipeline's tables before its stream starts (see the module docstring).

    Its state is ``snapshot.json`` in the pipeline's `state`: the status, the slot, the
    point and the chunks planned; a resync stages its copies as Delta tables under
    ``resync/`` there."""

    STATE_FILE = "snapshot.json"
    STAGING = "resync"

    def __init__(
        self,
        dispatcher: Dispatcher,
        conninfo: str,
        slot: str,
        targets: dict[str, list[Target]],
        state: FileIO,
        *,
        chunk_blocks: int = DEFAULT_CHUNK_BLOCKS,
        on_progress: Callable[[dict[str, TableProgress]], None] | None = None,
        source_names: dict[str, str] | None = None,
        failover: bool = False,
        publications: Sequence[str] = (),
        lineage: SlotLineage | None = None,
        changelog_reads: bool = True,
    ) -> None:
        self.dispatcher = dispatcher
        #: Where the slot this copy creates is recorded as the pipeline's.
        self.lineage = lineage
        #: A change log starts with the copied rows as snapshot reads (op "read"); else a
        #: table with only change logs is not copied.
        self.changelog_reads = changelog_reads
        self.conninfo = conninfo
        self.slot = slot
        self.targets = targets
        self.state = state
        self.chunk_blocks = chunk_blocks
        self.on_progress = on_progress
        self.progress: dict[str, TableProgress] = {}
        #: configured table -> its current name in the source (after a rename).
        self.source_names = source_names or {}
        #: The copy in progress goes to staging tables (a resync).
        self._staged = False
        #: The pipeline's slot is a failover slot.
        self.failover = failover
        #: The publications: a table is copied with the columns they publish.
        self.publications = tuple(publications)

    # -- state -----------------------------------------------------------------------------

    @classmethod
    def read_state(cls, state: FileIO) -> dict[str, Any] | None:
        """The copy's state kept in a pipeline's `state` (None: no copy was ever started)."""
        text = state.read(cls.STATE_FILE)
        if text is None:
            return None
        try:
            data = json.loads(text)
            str(data["status"])
        except (ValueError, KeyError, TypeError) as exc:
            where = state.location(cls.STATE_FILE)
            raise PgcdcError(f"{where}: unreadable state of the initial copy ({exc})") from None
        return dict(data)

    def _state(self) -> dict[str, Any] | None:
        return self.read_state(self.state)

    def _save(self, state: dict[str, Any]) -> None:
        self.state.write(self.STATE_FILE, json.dumps(state).encode())

    @property
    def status(self) -> str | None:
        """None (no copy was ever started), "creating" (the slot is being created: a slot of
        that name is this pipeline's), "copying" or "done"."""
        return self.status_of(self.state)

    @classmethod
    def status_of(cls, state: FileIO) -> str | None:
        """`status` of the copy whose state is kept in `state`."""
        data = cls.read_state(state)
        return None if data is None else str(data["status"])

    # -- running ---------------------------------------------------------------------------

    def start_fresh(self, *, resync: bool = False) -> Lsn:
        """Create the slot with an exported snapshot and copy everything as of its point.

        The state says "creating" before the slot exists, so a crash right after its creation
        leaves a record that the slot is the pipeline's own (`restart` drops it). A table
        rewritten between the snapshot and the copy's locks (`SnapshotGuard`), or one a
        TRUNCATE or DDL waits for while it is copied, makes it start again with a new slot.

        `resync`: the pipeline's slot was lost while the targets hold data: the copy goes to
        staging tables, and each target is then reconciled with its table's
        (`Target.reconcile`: only what differs changes), from where the new slot streams."""
        self._save({"status": "creating", "slot": self.slot, "resync": resync})

        def drop() -> None:
            with contextlib.suppress(SlotNotFound):
                drop_slot(self.conninfo, self.slot, wait=True)

        return self._attempts(lambda: self._copy_fresh(resync), drop, "the initial copy")

    def _attempts(self, copy: Callable[[], T], failed: Callable[[], None], what: str) -> T:
        """`copy()` until it is not interrupted (`CopyInterrupted`: a table rewritten before
        the copy's locks, or a lock it let through), `failed()` after each interruption;
        raises `SnapshotError` when that happened too often."""
        rewritten = yielded = 0
        while True:
            try:
                return copy()
            except TablesRewritten as exc:
                failed()
                rewritten += 1
                if rewritten == _ATTEMPTS:
                    raise SnapshotError(f"{what} cannot start: {exc}") from None
                log.info("%s starts again with a new snapshot: %s", what, exc)
            except LockWanted as exc:
                failed()
                yielded += 1
                if yielded == _YIELDS:
                    raise SnapshotError(f"{what} gave up after {yielded} starts: {exc}") from None
                log.warning(
                    "%s: %s lets it through and starts again under a new snapshot", exc, what
                )
                wait_for_locks(self.conninfo, exc.tables)

    def _copy_fresh(self, resync: bool) -> Lsn:
        with ReplicationConnection.connect(self.conninfo) as rconn:
            identity = rconn.identify_system()
            created = rconn.create_slot(self.slot, snapshot="export", failover=self.failover)
            assert created.snapshot_name is not None
            point = created.consistent_point
            if self.lineage is not None:
                self.lineage.created(self.slot, identity.systemid, identity.timeline, point)
            sources = [self._source(t) for t in self.targets]
            with SnapshotGuard(self.conninfo, created.snapshot_name, sources) as guard:
                plans = {
                    t: plan_chunks(guard.conn, self._source(t), self.chunk_blocks, t)
                    for t in self.targets
                }
                release = self._releaser(guard, rconn)
                state = {
                    "status": "copying",
                    "slot": self.slot,
                    "point": str(point),
                    "resync": resync,
                    "chunks": {t: [c.to_json() for c in cs] for t, cs in plans.items()},
                }
                self._save(state)
                copied = self._copy(plans, created.snapshot_name, point, release, resync)
        self._finish(state, copied)
        return point

    def restart(self) -> Lsn:
        """A copy that did not finish (or never started after the slot was created): drop
        the pipeline's slot, empty the targets and copy everything again under a new slot's
        snapshot. Nothing was streamed before the copy finished, so nothing is lost."""
        resync = bool((self._state() or {}).get("resync"))
        with contextlib.suppress(SlotNotFound):
            drop_slot(self.conninfo, self.slot, wait=True)
        if resync:  # the targets hold what the lost slot had brought: they stay
            self.state.delete_tree(self.STAGING)
        return self.start_fresh(resync=resync)  # (`_copy` empties the targets)

    def _staging(self, table: str) -> Target:
        """Where a resync copies `table` before its targets are reconciled with it."""
        app_id = self.targets[table][0].app_id
        where = self.state.location(f"{self.STAGING}/{table}")
        spec = TargetSpec(where, "mirror", storage_options=self.state.storage_options)
        return open_target(spec, app_id=app_id)

    def _finish(self, state: dict[str, Any], copied: set[str]) -> None:
        """The copied tables' targets take over from the point (after a resync, reconciled
        with the copy first); a table whose copy failed stays without a watermark, for an
        online copy later (`copy_online`)."""
        point = Lsn.parse(state["point"])
        for table in copied:
            if state.get("resync"):
                self._reconcile(table, point)
            else:
                for target in self.targets[table]:
                    target.mark(copy_watermark(point))
        self.state.delete_tree(self.STAGING)
        state["status"] = "done"
        self._save(state)

    def copy_online(
        self, tables: list[str], *, resync: bool = False, keep: frozenset[str] = frozenset()
    ) -> tuple[Lsn, set[str]]:
        """Copy `tables` while the stream goes on: under a new exported snapshot (a temporary
        slot's, taken again if a table is rewritten before the copy's locks), into emptied
        targets, each marked with that snapshot's point; with `resync`, into staging tables
        each target is then reconciled with (only what differs changes: a history keeps its
        versions; the tables in `keep` keep the rows the copy does not have). Returns the
        point and the tables that succeeded."""
        return self._attempts(
            lambda: self._copy_online(tables, resync, keep),
            lambda: None,  # (the temporary slot went with its connection)
            f"the copy of {', '.join(tables)}",
        )

    def _copy_online(
        self, tables: list[str], resync: bool, keep: frozenset[str]
    ) -> tuple[Lsn, set[str]]:
        temporary = f"pgcdc_copy_{uuid.uuid4().hex[:12]}"
        with ReplicationConnection.connect(self.conninfo) as rconn:
            created = rconn.create_slot(temporary, temporary=True, snapshot="export")
            assert created.snapshot_name is not None
            point = created.consistent_point
            sources = [self._source(t) for t in tables]
            with SnapshotGuard(self.conninfo, created.snapshot_name, sources) as guard:
                plans = {
                    t: plan_chunks(guard.conn, self._source(t), self.chunk_blocks, t)
                    for t in tables
                }
                release = self._releaser(guard, rconn)
                copied = self._copy(plans, created.snapshot_name, point, release, resync)
        for table in copied:
            if resync:
                self._reconcile(table, point, keep_missing=table in keep)
                self.state.delete_tree(f"{self.STAGING}/{table}")
            else:
                for target in self.targets[table]:
                    target.mark(copy_watermark(point))
        return point, copied

    def _reconcile(self, table: str, point: Lsn, *, keep_missing: bool = False) -> None:
        """Each target of `table` made equal to its staged copy at `point`, under the columns
        the copy was made with (the source's may have changed since: a column dropped and
        added again under its name is another column, whose values the copy does not hold)."""
        staging = self._staging(table)
        rows = staging.to_arrow()
        columns = staging.recorded_columns()
        if columns is None:  # (a staged copy from before pgcdc recorded them)
            source = catalog_relation(self.conninfo, self._source(table), self.publications)
            columns = Shape.of(source.relation, source.attnums).columns
        keys = [c.name for c in columns if c.key]
        if any(t.mode == "changelog" for t in self.targets[table]):
            log.warning(
                "%s: its change log gets no changes for what happened while they could not "
                "be streamed (the copy says how the table is, not how it changed)",
                table,
            )
        for target in self.targets[table]:
            target.reconcile(rows, int(point), keys, keep_missing=keep_missing, columns=columns)

    def _source(self, table: str) -> str:
        """The table's current name in the source (it may have been renamed)."""
        return self.source_names.get(table, table)

    @staticmethod
    def _releaser(guard: SnapshotGuard, rconn: ReplicationConnection) -> Callable[[], None]:
        """What lets go of a copy that cannot go on: the guard's locks (a TRUNCATE waiting
        for them goes through), and the snapshot's export (the connection that created the
        slot), so that the chunks not yet started fail at once instead of reading under it."""

        def release() -> None:
            guard.release()
            rconn.close()

        return release

    def _copy(
        self,
        plans: dict[str, list[Chunk]],
        snapshot: str,
        point: Lsn,
        release: Callable[[], None],
        staging: bool = False,
    ) -> set[str]:
        """Copies every table's chunks (into its targets, or its staging table), one Spark job
        per table, all at once, into targets emptied first and given the table's columns as
        of the snapshot; a table whose copy fails is left out (its progress holds the error).
        The tables that succeeded.

        A chunk not read because another session wants a conflicting lock on its table
        (`copy_chunk` gives None) ends the copy: `release()` is called as soon as its
        table's job ends (the other jobs' chunks then fail at once), and `LockWanted` is
        raised when every job has ended."""
        jobs: dict[str, list[_Task]] = {}
        wanted: list[str] = []
        releasing = threading.Lock()
        self._staged = staging
        for table, chunks in plans.items():
            targets = [self._staging(table)] if staging else self.targets[table]
            estimated = sum(c.estimated_rows for c in chunks)
            progress = TableProgress(table, len(chunks), estimated, int(point))
            self.progress[table] = progress
            try:
                source = catalog_relation(self.conninfo, self._source(table), self.publications)
                relation, types = source.relation, source.types
                registry = types.registry()
                for target in targets:
                    target.reset(relation, registry, source.attnums)
            except PgcdcError as exc:
                progress.error = str(exc)
                continue
            copied = tuple(t.spec for t in targets if t.mode != "changelog" or self.changelog_reads)
            app_id = targets[0].app_id
            jobs[table] = [
                _Task(
                    self.conninfo,
                    snapshot,
                    c,
                    relation,
                    types,
                    copied,
                    app_id,
                    int(point),
                    i,
                    source.attnums,
                )
                for i, c in enumerate(chunks)
                if copied
            ]

        def job(table: str, tasks: list[_Task]) -> None:
            progress = self.progress[table]
            try:
                outcomes = self.dispatcher.map(copy_chunk, tasks) if tasks else []
            except Exception as exc:
                progress.error = str(exc) if isinstance(exc, PgcdcError) else repr(exc)
                return
            for timings in outcomes:
                if timings is None:
                    with releasing:
                        if not wanted:
                            release()
                        wanted.append(self._source(table))
                    progress.error = "stopped: a conflicting lock is wanted on the table"
                    return
                for phase, seconds in timings.items():
                    progress.phases[phase] = progress.phases.get(phase, 0.0) + seconds

        threads = [
            threading.Thread(target=job, args=item, name=f"pgcdc-copy-{item[0]}", daemon=True)
            for item in jobs.items()
        ]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            threads[0].join(1.0) if threads[0].is_alive() else time.sleep(1.0)
            self._poll()
        self._poll()
        if wanted:
            raise LockWanted(sorted(wanted))
        return {t for t in jobs if self.progress[t].error is None}

    def _poll(self) -> None:
        for table, progress in self.progress.items():
            targets = [self._staging(table)] if self._staged else self.targets[table]
            copied = [t for t in targets if t.mode != "changelog" or self.changelog_reads]
            if not copied:
                continue
            done = copied[0].copied_chunks(progress.point)
            planned = progress.chunks
            progress.chunks_done = min(len(done), planned) if planned else 0
            progress.rows_done = sum(done.values())
        if self.on_progress is not None:
            self.on_progress(self.progress)
