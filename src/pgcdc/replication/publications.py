"""Publications: create, alter, describe, and warn about replica identities that bite.

A table without a usable replica identity makes the publisher *reject* UPDATE and DELETE once
they are published, and a DEFAULT identity sends only the key of the old row: both are better
learned from `describe` than from a failing application or a history table missing values.
"""

from __future__ import annotations

import re
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


@dataclass(frozen=True, slots=True)
class PublishedTable:
    schema: str
    name: str
    replica_identity: str
    has_primary_key: bool
    #: The publication's column list, None when it publishes every column.
    columns: tuple[str, ...] | None = None
    row_filter: str | None = None
    #: Columns of the replica identity (all columns under FULL, none under NOTHING).
    identity_columns: tuple[str, ...] = ()

    def problems(self, publishes: tuple[str, ...]) -> list[str]:
        """Why UPDATE/DELETE on this table would fail or lose old values while published."""
        if not {"update", "delete"} & set(publishes):
            return []
        ops = " and ".join(op.upper() for op in ("update", "delete") if op in publishes)
        if self.replica_identity == "n" or not self.identity_columns:
            why = "REPLICA IDENTITY NOTHING" if self.replica_identity == "n" else "no primary key"
            return [
                f"{why}, so {ops} on it will fail while it is published; "
                "add a primary key or ALTER TABLE ... REPLICA IDENTITY FULL"
            ]
        identity = set(self.identity_columns)
        out = []
        if self.columns is not None and not identity <= set(self.columns):
            missing = ", ".join(sorted(identity - set(self.columns)))
            out.append(
                f"the column list leaves out replica identity column(s) {missing}, "
                f"so {ops} on it will fail"
            )
        if self.row_filter and self.replica_identity != "f":
            outside = [c for c in _referenced_columns(self.row_filter) if c not in identity]
            if outside:
                out.append(
                    f"the row filter uses {', '.join(outside)}, outside the replica identity, "
                    f"so {ops} on it will fail; use REPLICA IDENTITY FULL"
                )
        if not out and self.replica_identity in "di":
            kind = "DEFAULT" if self.replica_identity == "d" else "USING INDEX"
            out.append(
                f"REPLICA IDENTITY {kind} sends only the key of old rows; "
                "use REPLICA IDENTITY FULL to keep old values"
            )
        return out


def _referenced_columns(expression: str) -> list[str]:
    """Column names in a deparsed row filter (pg_get_expr output): identifiers not followed by
    '(' (functions) and not keywords or quoted constants."""
    without_strings = re.sub(r"'(?:[^']|'')*'", "", expression)
    names = re.findall(r'"((?:[^"]|"")+)"|\b([a-z_][a-z0-9_$]*)\b(?!\s*\()', without_strings)
    keywords = {
        "and",
        "or",
        "not",
        "is",
        "null",
        "true",
        "false",
        "in",
        "like",
        "ilike",
        "between",
        "any",
        "all",
        "some",
        "text",
        "integer",
        "bigint",
        "numeric",
        "boolean",
        "date",
        "timestamp",
        "with",
        "time",
        "zone",
        "without",
        "varying",
        "character",
        "distinct",
        "from",
        "similar",
        "to",
        "escape",
        "collate",
    }
    found = []
    for quoted, bare in names:
        name = quoted.replace('""', '"') if quoted else bare
        if (quoted or name not in keywords) and name not in found:
            found.append(name)
    return found


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    name: str
    all_tables: bool
    publishes: tuple[str, ...]
    via_partition_root: bool
    tables: list[PublishedTable] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """Tables whose replica identity makes updates/deletes fail or lose old values."""
        return [
            f"{t.schema}.{t.name}: {problem}"
            for t in self.tables
            for problem in t.problems(self.publishes)
        ]


def create_publication(
    conninfo: str,
    name: str,
    tables: Sequence[TableSpec] | None = None,
    *,
    publish: Sequence[str] | None = None,
    via_partition_root: bool = False,
) -> PublicationInfo:
    """CREATE PUBLICATION for `tables`, or FOR ALL TABLES when `tables` is None."""
    with connect_sql(conninfo) as conn:
        _check_specs(tables or (), conn.info.server_version)
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
        _execute(conn, query, f"creating publication {name!r}")
    return describe_publication(conninfo, name)


def alter_publication(
    conninfo: str,
    name: str,
    *,
    add: Sequence[TableSpec] = (),
    drop: Sequence[str] = (),
    set_tables: Sequence[TableSpec] | None = None,
) -> PublicationInfo:
    with connect_sql(conninfo) as conn:
        _check_specs([*add, *(set_tables or ())], conn.info.server_version)
        ident = sql.Identifier(name)
        doing = f"altering publication {name!r}"
        if set_tables is not None:
            _execute(
                conn,
                sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident)
                + sql.SQL(", ").join(t.sql() for t in set_tables),
                doing,
            )
        if add:
            _execute(
                conn,
                sql.SQL("ALTER PUBLICATION {} ADD TABLE ").format(ident)
                + sql.SQL(", ").join(t.sql() for t in add),
                doing,
            )
        if drop:
            _execute(
                conn,
                sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(ident)
                + sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in drop),
                doing,
            )
    return describe_publication(conninfo, name)


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
    with connect_sql(conninfo) as conn:
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
    tables = [
        PublishedTable(
            schema,
            table,
            identity,
            has_pk,
            None if cols is None else tuple(cols),
            row_filter,
            tuple(identity_cols or ()),
        )
        for schema, table, identity, has_pk, cols, row_filter, identity_cols in rows
    ]
    return PublicationInfo(name, all_tables, publishes, via_root, tables)


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
