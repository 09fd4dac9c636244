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
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from psycopg import sql

from pgcdc.replication.slots import connect_sql
from pgcdc.snapshot.plan import SnapshotError, qualified

__all__ = ["SnapshotGuard", "TablesRewritten"]

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


class TablesRewritten(SnapshotError):
    """A table of the copy was rewritten after its snapshot, before the guard's locks."""

    def __init__(self, tables: list[str]) -> None:
        self.tables = tables
        super().__init__(
            f"{', '.join(tables)} rewritten (TRUNCATE, ALTER TABLE, VACUUM FULL or CLUSTER) "
            "after the copy's snapshot was taken"
        )


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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.conn.close()
