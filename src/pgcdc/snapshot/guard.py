"""Keeps the tables of a copy as they were at its snapshot, for as long as the copy runs.

A copy reads its chunks in many transactions, each importing one exported snapshot. That is
one point in time for ordinary writes, but TRUNCATE and the table-rewriting commands (ALTER
TABLE … TYPE, a volatile default, VACUUM FULL, CLUSTER) are not MVCC-safe: once one commits, a
transaction of an older snapshot sees the rewritten table (empty, after a TRUNCATE). A chunk
read after it would miss rows that the stream, starting at the snapshot's point, then updates
or deletes (a table without a key can then never be made equal again).

`SnapshotGuard` opens a transaction under the snapshot and takes ACCESS SHARE locks on every
table of the copy (as pg_dump does), so none can be rewritten until the copy ends; then it
checks that none was rewritten between the snapshot and the locks (the table's file node as
the snapshot sees it against the current one) and raises `TablesRewritten` if one was: the
copy must start again under a new snapshot.

Those locks must not stall the source. A TRUNCATE (or any ACCESS EXCLUSIVE lock) asked for
while the guard holds its table waits for the guard, and every later lock request on the table
queues behind it: the application's reads and writes, and the copy's next chunk, for which
the guard waits outside the server (no deadlock is detected). So a chunk takes its table's
lock with NOWAIT first (`share_lock_nowait`, as pg_dump's workers do): when a conflicting lock
is held or waited for, the chunk is not read, the copy lets go of the guard (the TRUNCATE
goes through) and starts again under a new snapshot (`LockWanted`).
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.replication.slots import connect_sql
from pgcdc.snapshot.plan import SnapshotError, qualified

__all__ = [
    "CopyInterrupted",
    "LockWanted",
    "SnapshotGuard",
    "TablesRewritten",
    "share_lock_nowait",
    "wait_for_locks",
]

_REWRITTEN = """
    SELECT c.oid::regclass::text
    FROM pg_catalog.pg_class c
    WHERE c.oid IN (
        SELECT t.relid FROM unnest(%s::regclass[]) AS r(relid),
                            LATERAL pg_catalog.pg_partition_tree(r.relid) t
        UNION SELECT r.relid FROM unnest(%s::regclass[]) AS r(relid)
    )
    AND c.relkind IN ('r', 'm') AND c.relfilenode <> pg_catalog.pg_relation_filenode(c.oid)
    ORDER BY 1"""


class CopyInterrupted(SnapshotError):
    """The copy must start again under a new snapshot (`tables` say where it cannot go on)."""

    def __init__(self, tables: list[str], message: str) -> None:
        self.tables = tables
        super().__init__(message)


class TablesRewritten(CopyInterrupted):
    """A table of the copy was rewritten after its snapshot, before the guard's locks."""

    def __init__(self, tables: list[str]) -> None:
        super().__init__(
            tables,
            f"{', '.join(tables)} rewritten (TRUNCATE, ALTER TABLE, VACUUM FULL or CLUSTER) "
            "after the copy's snapshot was taken",
        )


class LockWanted(CopyInterrupted):
    """Another session holds or waits for a lock on a table of the copy that conflicts with
    its ACCESS SHARE locks: the copy lets it through and starts again."""

    def __init__(self, tables: list[str]) -> None:
        super().__init__(
            tables,
            f"{', '.join(tables)}: another session waits for an ACCESS EXCLUSIVE lock "
            "(TRUNCATE, ALTER TABLE, VACUUM FULL, CLUSTER or LOCK) that the copy holds off",
        )


def share_lock_nowait(conn: Any, tables: list[str]) -> bool:
    """Takes ACCESS SHARE on `tables` ("schema.name", each without its partitions) in
    `conn`'s open transaction, unless another session holds or waits for a conflicting
    lock on one of them: then False, and the transaction is aborted (roll it back)."""
    names = ", ".join(f"ONLY {qualified(t)}" for t in tables)
    try:
        conn.execute(f"LOCK TABLE {names} IN ACCESS SHARE MODE NOWAIT")
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def wait_for_locks(conninfo: str, tables: list[str]) -> None:
    """Until the locks held or asked for on `tables` before this call that conflict with
    ACCESS SHARE are released (a TRUNCATE the copy let through has committed or rolled
    back), so that a snapshot taken next is after it. A table gone meanwhile is let be: the
    copy's next attempt says what happened to it."""
    with connect_sql(conninfo) as conn:
        for table in tables:
            with contextlib.suppress(psycopg.Error), conn.transaction():
                conn.execute(f"LOCK TABLE ONLY {qualified(table)} IN ACCESS SHARE MODE")


class SnapshotGuard:
    """A transaction under `snapshot` holding ACCESS SHARE locks on `tables` ("schema.name")
    until closed; `conn` may be used for reads meanwhile (it sees the snapshot)."""

    def __init__(self, conninfo: str, snapshot: str, tables: list[str]) -> None:
        self.conninfo = conninfo
        self.snapshot = snapshot
        self.tables = tables
        self.conn: Any = None

    def __enter__(self) -> SnapshotGuard:
        self.conn = conn = connect_sql(self.conninfo)
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self.snapshot)))
            names = [qualified(t) for t in self.tables]
            if names:
                conn.execute(f"LOCK TABLE {', '.join(names)} IN ACCESS SHARE MODE")
            rewritten = [r[0] for r in conn.execute(_REWRITTEN, (names, names))]
        except BaseException:
            conn.close()
            raise
        if rewritten:
            conn.close()
            raise TablesRewritten(rewritten)
        return self

    def release(self) -> None:
        """Ends the transaction now, letting go of the locks (closing the guard again is
        harmless)."""
        self.conn.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.conn.close()
