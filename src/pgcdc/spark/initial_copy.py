"""The initial copy of a pipeline's tables, handed off to the stream at the slot's consistent
point, resumable chunk by chunk.

First run: the pipeline's slot is created with an exported snapshot (reference §2); its
consistent point P is where the stream will start. Every table is planned into block ranges
(`pgcdc.snapshot.plan`) and the chunks are copied in parallel by Spark tasks, each importing
the snapshot (``SET TRANSACTION SNAPSHOT``), so together they are the database exactly as of P.
Each task appends its rows to the targets in a Delta commit that names the chunk; when every
chunk is in, each target records P as its watermark and the stream takes over from P.

A crash mid-copy: the exported snapshot died with its connection. The chunks already committed
stay (their commits name them); the others are copied under a new exported snapshot P2 (a
temporary slot's) and merged by key instead of appended, then the targets get watermark P.
The stream then replays (P, P2] over rows copied as of P2, which converges per key because
every change carries its row's new values. Limits, documented: a table without a key
(REPLICA IDENTITY FULL) merges identical rows into one on that path, and an update in (P, P2]
that left a TOASTed value unchanged on a row that moved from an unfinished chunk into a
finished one cannot find the old value.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from psycopg import sql

from pgcdc.errors import PgcdcError
from pgcdc.protocol import Lsn, Relation
from pgcdc.replication.connection import DEFAULT_SESSION_SETTINGS, ReplicationConnection
from pgcdc.replication.slots import connect_sql
from pgcdc.snapshot.copy import copy_query, copy_schema, read_copy
from pgcdc.snapshot.plan import DEFAULT_CHUNK_BLOCKS, Chunk, plan_chunks
from pgcdc.spark.session import error_line
from pgcdc.spark.typed import CatalogAnswers, catalog_registry, catalog_relation
from pgcdc.targets import END_AT, START_AT, DeltaTarget

__all__ = ["CHUNK_KEY", "InitialCopy", "TableProgress"]

#: The Delta commit metadata keys naming the chunk a commit holds and the copy's point.
CHUNK_KEY = "pgcdc.snapshot.chunk"
POINT_KEY = "pgcdc.snapshot.point"


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
class _Target:
    path: str
    mode: str


@dataclass(frozen=True, slots=True)
class _Task:
    """What one Spark task needs: all of it pickles."""

    conninfo: str
    snapshot: str
    chunk: Chunk
    relation: Relation
    answers: CatalogAnswers
    targets: tuple[_Target, ...]
    point: int
    merge: bool


def _session(conninfo: str, snapshot: str) -> Any:
    conn = connect_sql(conninfo)
    for name, value in DEFAULT_SESSION_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    conn.commit()
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
    return conn


def _rows(task: _Task) -> pa.Table:
    relation = task.relation
    registry = catalog_registry(relation, task.answers)
    conn = _session(task.conninfo, task.snapshot)
    try:
        chunk = task.chunk
        query = copy_query(
            relation, chunk.leaf, first_block=chunk.first_block, end_block=chunk.end_block
        )
        batches = list(read_copy(conn, query, relation, registry, table_name=chunk.table))
    finally:
        conn.close()
    return pa.Table.from_batches(batches, schema=copy_schema(relation, registry))


def _for_target(rows: pa.Table, mode: str, point: int) -> pa.Table:
    if mode != "history":
        return rows
    start = pa.array(
        [{"commit_lsn": point, "ordinal": 0}] * rows.num_rows,
        pa.struct([("commit_lsn", pa.int64()), ("ordinal", pa.int64())]),
    )
    rows = rows.append_column(START_AT, start)
    return rows.append_column(END_AT, pa.nulls(rows.num_rows, start.type))


def _conform(rows: pa.Table, path: str) -> pa.Table:
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    return rows.select(schema.names).cast(schema)


def copy_chunk(task: _Task) -> tuple[str, str, int]:
    """Runs on an executor: reads the chunk under the snapshot and appends it to every target
    in one commit each (the commit names the chunk). Returns (table, chunk id, rows)."""
    rows = _rows(task)
    metadata = {
        CHUNK_KEY: task.chunk.id,
        POINT_KEY: str(task.point),
        "pgcdc.snapshot.rows": str(rows.num_rows),
    }
    for target in task.targets:
        data = _conform(_for_target(rows, target.mode, task.point), target.path)
        commit = CommitProperties(custom_metadata=metadata)
        if task.merge:
            _merge(target, data, task.relation, commit)
        else:
            write_deltalake(target.path, data, mode="append", commit_properties=commit)
    return task.chunk.table, task.chunk.id, rows.num_rows


def _merge(target: _Target, data: pa.Table, relation: Relation, commit: CommitProperties) -> None:
    keys = [c.name for c in relation.columns if c.flags & 1] or [c.name for c in relation.columns]
    null_safe = not any(c.flags & 1 for c in relation.columns)
    op = "IS NOT DISTINCT FROM" if null_safe else "="
    match = " AND ".join(f'(t."{k}" {op} s."{k}")' for k in keys)
    if target.mode == "history":
        match += f' AND t."{END_AT}" IS NULL'
    (
        DeltaTable(target.path)
        .merge(data, match, source_alias="s", target_alias="t", commit_properties=commit)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def done_chunks(path: str, point: int) -> dict[str, int]:
    """Chunk id -> rows, for the chunks of the copy at `point` a target's commits hold."""
    if not DeltaTable.is_deltatable(path):
        return {}
    done = {}
    for commit in DeltaTable(path).history():
        chunk = commit.get(CHUNK_KEY)
        if chunk is not None and commit.get(POINT_KEY) == str(int(point)):
            done[chunk] = int(commit.get("pgcdc.snapshot.rows", 0))
    return done


class InitialCopy:
    """Copies a pipeline's tables before its stream starts (see the module docstring)."""

    def __init__(
        self,
        spark: Any,
        conninfo: str,
        slot: str,
        targets: dict[str, list[DeltaTarget]],
        state_path: str | Path,
        *,
        chunk_blocks: int = DEFAULT_CHUNK_BLOCKS,
        on_progress: Callable[[dict[str, TableProgress]], None] | None = None,
    ) -> None:
        self.spark = spark
        self.conninfo = conninfo
        self.slot = slot
        self.targets = targets
        self.state_path = Path(state_path)
        self.chunk_blocks = chunk_blocks
        self.on_progress = on_progress
        self.progress: dict[str, TableProgress] = {}

    # -- state -----------------------------------------------------------------------------

    def _state(self) -> dict[str, Any] | None:
        if not self.state_path.exists():
            return None
        return json.loads(self.state_path.read_text())

    def _save(self, state: dict[str, Any]) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    @property
    def unfinished(self) -> bool:
        state = self._state()
        return state is not None and state["status"] != "done"

    # -- running ---------------------------------------------------------------------------

    def start_fresh(self) -> Lsn:
        """Create the slot with an exported snapshot and copy everything as of its point."""
        with ReplicationConnection.connect(self.conninfo) as rconn:
            created = rconn.create_slot(self.slot, snapshot="export")
            assert created.snapshot_name is not None
            point = created.consistent_point
            with connect_sql(self.conninfo) as conn:
                plans = {t: plan_chunks(conn, t, self.chunk_blocks) for t in self.targets}
            state = {
                "status": "copying",
                "point": str(point),
                "chunks": {t: [c.to_json() for c in cs] for t, cs in plans.items()},
            }
            self._save(state)
            copied = self._copy(plans, created.snapshot_name, point, merge=False)
        self._finish(state, copied)
        return point

    def resume(self) -> Lsn:
        """Copy the chunks a crashed copy left, under a new snapshot, by key."""
        state = self._state()
        assert state is not None
        point = Lsn.parse(state["point"])
        plans: dict[str, list[Chunk]] = {}
        #: Per target, the chunks it holds: a crash may come between a chunk's commits.
        already: dict[str, set[str]] = {}
        for table, chunks in state["chunks"].items():
            paths = [t.path for t in self.targets.get(table, []) if t.mode != "changelog"]
            for path in paths:
                already[path] = set(done_chunks(path, point))
            done = set.intersection(*(already[p] for p in paths)) if paths else set()
            plans[table] = [c for c in map(Chunk.from_json, chunks) if c.id not in done]
        temporary = f"pgcdc_resume_{uuid.uuid4().hex[:12]}"
        with ReplicationConnection.connect(self.conninfo) as rconn:
            created = rconn.create_slot(temporary, temporary=True, snapshot="export")
            assert created.snapshot_name is not None
            copied = self._copy(plans, created.snapshot_name, point, merge=True, already=already)
        self._finish(state, copied)
        return point

    def _finish(self, state: dict[str, Any], copied: set[str]) -> None:
        """The copied tables' targets take over from the point; a table whose copy failed
        stays without a watermark, for an online copy later (`copy_online`)."""
        point = Lsn.parse(state["point"])
        for table in copied:
            for target in self.targets[table]:
                target.mark(int(point))
        state["status"] = "done"
        self._save(state)

    def copy_online(self, tables: list[str]) -> tuple[Lsn, set[str]]:
        """Copy `tables` while the stream goes on: under a new exported snapshot (a temporary
        slot's), into emptied targets, each marked with that snapshot's point. Returns the
        point and the tables that succeeded."""
        temporary = f"pgcdc_copy_{uuid.uuid4().hex[:12]}"
        with ReplicationConnection.connect(self.conninfo) as rconn:
            created = rconn.create_slot(temporary, temporary=True, snapshot="export")
            assert created.snapshot_name is not None
            point = created.consistent_point
            for table in tables:
                for target in self.targets[table]:
                    target.clear()
            with connect_sql(self.conninfo) as conn:
                plans = {t: plan_chunks(conn, t, self.chunk_blocks) for t in tables}
            copied = self._copy(plans, created.snapshot_name, point, merge=False)
        for table in copied:
            for target in self.targets[table]:
                target.mark(int(point))
        return point, copied

    def _copy(
        self,
        plans: dict[str, list[Chunk]],
        snapshot: str,
        point: Lsn,
        *,
        merge: bool,
        already: dict[str, set[str]] | None = None,
    ) -> set[str]:
        """Copies every table's chunks, one Spark job per table, all at once; a table whose
        copy fails is left out (its progress holds the error). The tables that succeeded."""
        jobs: dict[str, list[_Task]] = {}
        for table, chunks in plans.items():
            targets = self.targets[table]
            estimated = sum(c.estimated_rows for c in chunks)
            progress = TableProgress(table, len(chunks), estimated, int(point))
            self.progress[table] = progress
            try:
                relation, answers = catalog_relation(self.conninfo, table)
                registry = catalog_registry(relation, answers)
                for target in targets:
                    target.ensure_table(relation, registry)
            except PgcdcError as exc:
                progress.error = str(exc)
                continue
            copied = tuple(_Target(t.path, t.mode) for t in targets if t.mode != "changelog")
            held = already or {}
            jobs[table] = [
                _Task(
                    self.conninfo,
                    snapshot,
                    c,
                    relation,
                    answers,
                    tuple(t for t in copied if c.id not in held.get(t.path, ())),
                    int(point),
                    merge,
                )
                for c in chunks
            ]

        def job(table: str, tasks: list[_Task]) -> None:
            try:
                if tasks:
                    rdd = self.spark.sparkContext.parallelize(tasks, len(tasks)).map(copy_chunk)
                    # Merges into one table must not race: one task at a time.
                    _ = list(rdd.toLocalIterator()) if merge else rdd.collect()
            except Exception as exc:
                self.progress[table].error = error_line(exc)

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
        return {t for t in jobs if self.progress[t].error is None}

    def _poll(self) -> None:
        for table, progress in self.progress.items():
            paths = [t.path for t in self.targets[table] if t.mode != "changelog"]
            if not paths:
                continue
            done = done_chunks(paths[0], progress.point)
            planned = progress.chunks
            progress.chunks_done = min(len(done), planned) if planned else 0
            progress.rows_done = sum(done.values())
        if self.on_progress is not None:
            self.on_progress(self.progress)
