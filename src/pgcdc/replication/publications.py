"""Publications: create, alter and describe them, without ever making the source refuse writes.

Publishing UPDATE and DELETE of a table makes the server check, at every UPDATE and DELETE
the application runs, that the replica identity can carry the change: a table without one (no
primary key, REPLICA IDENTITY NOTHING), a row filter on a column outside it, or a column list
that leaves one of its columns out, and the application's statement fails (``cannot update
table ...``). `create_publication` and `alter_publication` therefore ask the server itself
before committing: inside the transaction that makes the change, ``EXPLAIN UPDATE`` and
``EXPLAIN DELETE`` of every published table run the very check the executor runs (nothing
executes, no trigger fires), and a table whose writes the change would break makes the
command refuse with one line saying why and what to do, unless forced. `describe_publication`
reports the tables whose writes the server refuses now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from pgcdc.errors import PublicationError, PublicationNotFound, UnsupportedOption
from pgcdc.replication.connection import sql_error
from pgcdc.replication.slots import connect_sql

__all__ = [
    "PublicationInfo",
    "PublishedTable",
    "TableSpec",
    "WriteRefusal",
    "alter_publication",
    "create_publication",
    "describe_publication",
]


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table to publish, optionally with a column list and a row filter (PG15+)."""

    name: str
    columns: tuple[str, ...] | None = None
    where: str | None = None

    @classmethod
    def parse(cls, text: str) -> TableSpec:
        """``schema.table``, ``table(col, col)``, optionally followed by `` WHERE expr``."""
        where = None
        head, sep, tail = text.partition(" WHERE ")
        if not sep:
            head, sep, tail = text.partition(" where ")
        if sep:
            where = tail.strip()
        columns = None
        if "(" in head:
            name, _, rest = head.partition("(")
            columns = tuple(c.strip() for c in rest.rstrip(") ").split(",") if c.strip())
            head = name
        return cls(head.strip(), columns, where)

    def sql(self) -> sql.Composable:
        parts: list[sql.Composable] = [sql.Identifier(*self.name.split(".", 1))]
        if self.columns:
            parts.append(
                sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.columns)))
            )
        if self.where:
            parts.append(sql.SQL(" WHERE ({})").format(sql.SQL(self.where)))
        return sql.Composed(parts)


#: pg_class.relreplident, as ALTER TABLE ... REPLICA IDENTITY spells it.
IDENTITY_NAMES = {"d": "default", "i": "index", "f": "full", "n": "nothing"}

#: The SQLSTATEs of the server's refusal of an UPDATE or DELETE on a published table
#: (invalid_column_reference: a row filter or column list; object_not_in_prerequisite_state:
#: no replica identity).
_NO_IDENTITY = "55000"
_REFUSED = ("42P10", _NO_IDENTITY)


@dataclass(frozen=True, slots=True)
class WriteRefusal:
    """The server refuses `operation` (UPDATE or DELETE) on a table, for `reason` (its own
    words); or, when `refused` is False, it could not be asked (no privilege, a lock)."""

    operation: str
    reason: str
    refused: bool = True


@dataclass(frozen=True, slots=True)
class PublishedTable:
    schema: str
    name: str
    #: ``default``, ``index``, ``full`` or ``nothing`` (ALTER TABLE ... REPLICA IDENTITY).
    replica_identity: str
    has_primary_key: bool
    #: The publication's column list, None when it publishes every column.
    columns: tuple[str, ...] | None = None
    row_filter: str | None = None
    #: Columns of the replica identity (all columns under FULL, none under NOTHING).
    identity_columns: tuple[str, ...] = ()
    #: What the server says about UPDATE and DELETE on the table now (`describe_publication`).
    refusals: tuple[WriteRefusal, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def identity_text(self) -> str:
        """The replica identity in words: ``default (primary key id)``, ``full``, ..."""
        columns = ", ".join(self.identity_columns)
        if self.replica_identity == "default":
            return f"default (primary key {columns})" if columns else "default (no primary key)"
        if self.replica_identity == "index":
            return f"index ({columns})"
        return self.replica_identity

    def refusal_text(self, refusals: Sequence[WriteRefusal], *, would: bool = False) -> str:
        """One clause: which operations fail (`would`: would fail after a change), the
        server's reason, and what to do."""
        refused = [r for r in refusals if r.refused]
        if not refused:
            ops = " and ".join(r.operation for r in refusals)
            return f"could not check whether {ops} work: {refusals[0].reason}"
        ops = " and ".join(r.operation for r in refused)
        reason = refused[0].reason.rstrip(".")
        return (
            f"{ops} on it {'would fail' if would else 'fail'} in the application "
            f"({reason[:1].lower()}{reason[1:]}; replica identity {self.identity_text()}): "
            f"{self._advice(reason)}"
        )

    def _advice(self, reason: str) -> str:
        table = self.qualified
        full = f"ALTER TABLE {table} REPLICA IDENTITY FULL (which logs whole old rows)"
        if "WHERE expression" in reason:
            if self.identity_columns:
                return f"filter on {', '.join(self.identity_columns)} only, or {full}"
            return f"add a primary key, or {full}"
        if "Column list" in reason:
            if self.replica_identity == "full":
                return (
                    "publish every column (under REPLICA IDENTITY FULL every column is the "
                    "identity), or give it a primary key and REPLICA IDENTITY DEFAULT"
                )
            missing = [c for c in self.identity_columns if c not in (self.columns or ())]
            return f"add {', '.join(missing) or 'the replica identity columns'} to the column list"
        if "generated" in reason:
            return "publish the generated columns of the replica identity, or choose another"
        if self.replica_identity == "nothing":
            return f"ALTER TABLE {table} REPLICA IDENTITY DEFAULT (with a primary key), or FULL"
        if "replica identity" in reason:
            return f"add a primary key, or {full}"
        return (
            f"give {table} a replica identity the publication covers "
            "(ALTER TABLE ... REPLICA IDENTITY)"
        )


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    name: str
    all_tables: bool
    publishes: tuple[str, ...]
    via_partition_root: bool
    tables: list[PublishedTable] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """Tables whose UPDATE or DELETE the server refuses now (or that could not be checked)."""
        return [f"{t.qualified}: {t.refusal_text(t.refusals)}" for t in self.tables if t.refusals]


def create_publication(
    conninfo: str,
    name: str,
    tables: Sequence[TableSpec] | None = None,
    *,
    publish: Sequence[str] | None = None,
    via_partition_root: bool = False,
    force: bool = False,
) -> PublicationInfo:
    """CREATE PUBLICATION for `tables`, or FOR ALL TABLES when `tables` is None. Refused
    (`PublicationError`, nothing created) when it would make the server refuse the
    application's UPDATE or DELETE on a table, unless `force`."""
    query = sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(name))
    if tables is None:
        query += sql.SQL(" FOR ALL TABLES")
    elif tables:
        query += sql.SQL(" FOR TABLE ") + sql.SQL(", ").join(t.sql() for t in tables)
    options: list[sql.Composable] = []
    if publish is not None:
        options.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(publish))))
    if via_partition_root:
        options.append(sql.SQL("publish_via_partition_root = true"))
    if options:
        query += sql.SQL(" WITH (") + sql.SQL(", ").join(options) + sql.SQL(")")
    with connect_sql(conninfo) as conn:
        _check_specs(tables or (), conn.info.server_version)
        _change(conn, name, [query], "created", force=force)
    return describe_publication(conninfo, name)


def alter_publication(
    conninfo: str,
    name: str,
    *,
    add: Sequence[TableSpec] = (),
    drop: Sequence[str] = (),
    set_tables: Sequence[TableSpec] | None = None,
    force: bool = False,
) -> PublicationInfo:
    """SET, DROP and ADD tables in one transaction, in that order (so dropping a table and
    adding it again with a column list or row filter is one command). Refused like
    `create_publication`."""
    ident = sql.Identifier(name)
    statements: list[sql.Composed] = []
    if set_tables is not None:
        statements.append(
            sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident)
            + sql.SQL(", ").join(t.sql() for t in set_tables)
        )
    if drop:
        statements.append(
            sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(ident)
            + sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in drop)
        )
    if add:
        statements.append(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE ").format(ident)
            + sql.SQL(", ").join(t.sql() for t in add)
        )
    with connect_sql(conninfo) as conn:
        _check_specs([*add, *(set_tables or ())], conn.info.server_version)
        _change(conn, name, statements, "altered", force=force)
    return describe_publication(conninfo, name)


def _change(
    conn: psycopg.Connection,
    name: str,
    statements: Sequence[sql.Composed],
    done: str,
    *,
    force: bool,
) -> None:
    """Run `statements` in one transaction, committed only if they break no table's writes:
    they are tried first, the server asked about every published table's UPDATE and DELETE,
    and rolled back; a table whose writes worked before and fail after refuses the change
    (unless `force`); one that failed already (because of another publication) does not."""
    doing = f"{'creating' if done == 'created' else 'altering'} publication {name!r}"
    with conn.transaction():
        with conn.transaction(force_rollback=True):
            for statement in statements:
                _execute(conn, statement, doing)
            after = _describe(conn, name)
        before = _write_refusals(conn, [(t.schema, t.name) for t in after.tables if t.refusals])
        broken = []
        for table in after.tables:
            earlier = {r.operation for r in before.get((table.schema, table.name), ()) if r.refused}
            new = [r for r in table.refusals if r.refused and r.operation not in earlier]
            if new:
                broken.append(f"{table.qualified}: {table.refusal_text(new, would=True)}")
        if broken and not force:
            raise PublicationError(
                f"publication {name!r} not {done}: {'; '.join(broken)} (--force does it anyway)"
            )
        for statement in statements:
            _execute(conn, statement, doing)


def _execute(conn: psycopg.Connection, query: sql.Composed, doing: str) -> None:
    """Run one DDL statement; the server's refusal as one pgcdc error line."""
    try:
        conn.execute(query)
    except psycopg.Error as exc:
        raise sql_error(exc, doing, PublicationError) from None


def _check_specs(specs: Sequence[TableSpec], server_version: int) -> None:
    if server_version < 150000 and any(s.columns or s.where for s in specs):
        raise UnsupportedOption(
            f"column lists and row filters need PostgreSQL 15 or later, "
            f"the server is {server_version // 10000}"
        )


def describe_publication(conninfo: str, name: str) -> PublicationInfo:
    """The publication, its tables, and what the server says about UPDATE and DELETE on each
    now (`PublishedTable.refusals`, `PublicationInfo.warnings`)."""
    with connect_sql(conninfo) as conn, conn.transaction(force_rollback=True):
        return _describe(conn, name)


def _describe(conn: psycopg.Connection, name: str) -> PublicationInfo:
    version = conn.info.server_version
    row = conn.execute(
        """SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
           FROM pg_publication WHERE pubname = %s""",
        (name,),
    ).fetchone()
    if row is None:
        raise PublicationNotFound(f'publication "{name}" does not exist')
    all_tables, ins, upd, dele, trunc, via_root = row
    publishes = tuple(
        op
        for op, on in (("insert", ins), ("update", upd), ("delete", dele), ("truncate", trunc))
        if on
    )
    rows = conn.execute(
        f"""SELECT n.nspname, c.relname, c.relreplident,
                   EXISTS (SELECT 1 FROM pg_index i
                           WHERE i.indrelid = c.oid AND i.indisprimary),
                   {_COLUMN_LIST if version >= 150000 else "NULL"},
                   {_ROW_FILTER if version >= 150000 else "NULL"},
                   {_IDENTITY_COLUMNS}
            FROM pg_publication_tables pt
            JOIN pg_namespace n ON n.nspname = pt.schemaname
            JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
            JOIN pg_publication p ON p.pubname = pt.pubname
            WHERE pt.pubname = %s ORDER BY 1, 2""",
        (name,),
    ).fetchall()
    refusals = _write_refusals(conn, [(schema, table) for schema, table, *_ in rows])
    tables = [
        PublishedTable(
            schema,
            table,
            IDENTITY_NAMES[identity],
            has_pk,
            None if cols is None else tuple(cols),
            row_filter,
            tuple(identity_cols or ()),
            refusals.get((schema, table), ()),
        )
        for schema, table, identity, has_pk, cols, row_filter, identity_cols in rows
    ]
    return PublicationInfo(name, all_tables, publishes, via_root, tables)


def _write_refusals(
    conn: psycopg.Connection, tables: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], tuple[WriteRefusal, ...]]:
    """Per table whose UPDATE or DELETE the server refuses (or could not be asked about): why.

    ``EXPLAIN UPDATE`` / ``EXPLAIN DELETE`` start the executor, which checks the replica
    identity against every publication of the table exactly as for the application's own
    statements; nothing is executed and no trigger fires. Each runs in a savepoint rolled back
    at once, so no lock outlives it, and waits for a lock at most 10 s (then the table is
    reported as not checked). Call inside a transaction."""
    found: dict[tuple[str, str], tuple[WriteRefusal, ...]] = {}
    for schema, table in tables:
        target = sql.Identifier(schema, table)
        column = conn.execute(
            """SELECT attname FROM pg_attribute
               WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
               ORDER BY attnum LIMIT 1""",
            (target.as_string(conn),),
        ).fetchone()
        probes = [("DELETE", sql.SQL("EXPLAIN DELETE FROM {}").format(target))]
        if column is not None:  # a table without columns: DELETE checks the same
            update = sql.SQL("EXPLAIN UPDATE {} SET {} = DEFAULT")
            probes.insert(0, ("UPDATE", update.format(target, sql.Identifier(column[0]))))
        refused: list[WriteRefusal] = []
        for operation, probe in probes:
            try:
                with conn.transaction(force_rollback=True):
                    conn.execute("SET LOCAL lock_timeout = '10s'")  # a table locked: say so
                    conn.execute(probe)
            except psycopg.Error as exc:
                diag = exc.diag
                if exc.sqlstate == _NO_IDENTITY:  # the primary message names the operation
                    reason = "the table has no replica identity"
                else:
                    reason = diag.message_detail or diag.message_primary or str(exc)
                refused.append(WriteRefusal(operation, reason, exc.sqlstate in _REFUSED))
        if refused:
            found[(schema, table)] = tuple(refused)
    return found


# An explicit column list (pg_publication_rel.prattrs is NULL without one).
_COLUMN_LIST = """(SELECT array_agg(a.attname ORDER BY a.attnum)
        FROM pg_publication_rel pr JOIN pg_attribute a
          ON a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs)
        WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid)"""
_ROW_FILTER = """(SELECT pg_get_expr(pr.prqual, pr.prrelid) FROM pg_publication_rel pr
        WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid)"""
_IDENTITY_COLUMNS = """CASE c.relreplident
        WHEN 'f' THEN (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
                       WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
        WHEN 'n' THEN NULL
        ELSE (SELECT array_agg(a.attname ORDER BY a.attnum)
              FROM pg_index i JOIN pg_attribute a
                ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)
              WHERE i.indrelid = c.oid
                AND (CASE c.relreplident WHEN 'd' THEN i.indisprimary ELSE i.indisreplident END))
        END"""
