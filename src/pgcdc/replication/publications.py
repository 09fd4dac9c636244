"""Publications: create, alter, describe, and warn about replica identities that bite.

A table without a usable replica identity makes the publisher *reject* UPDATE and DELETE once
they are published, and a DEFAULT identity sends only the key of the old row: both are better
learned from `describe` than from a failing application or a history table missing values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from psycopg import sql

from pgcdc.errors import PublicationNotFound, UnsupportedOption
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
            parts.append(sql.SQL(" WHERE ({})").format(sql.SQL(self.where)))  # type: ignore[arg-type]
        return sql.Composed(parts)


@dataclass(frozen=True, slots=True)
class PublishedTable:
    schema: str
    name: str
    replica_identity: str
    has_primary_key: bool
    columns: tuple[str, ...] | None = None
    row_filter: str | None = None


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    name: str
    all_tables: bool
    publishes: tuple[str, ...]
    via_partition_root: bool
    tables: list[PublishedTable] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """Tables whose replica identity makes updates/deletes fail or lose old values."""
        changes_old_rows = {"update", "delete"} & set(self.publishes)
        out = []
        for t in self.tables:
            qualified = f"{t.schema}.{t.name}"
            ops = " and ".join(sorted(changes_old_rows, reverse=True)).upper()
            no_identity = t.replica_identity == "n" or (
                t.replica_identity == "d" and not t.has_primary_key
            )
            if changes_old_rows and no_identity:
                why = "REPLICA IDENTITY NOTHING" if t.replica_identity == "n" else "no primary key"
                out.append(
                    f"{qualified}: {why}, so {ops} on it will fail while it is published; "
                    "add a primary key or ALTER TABLE ... REPLICA IDENTITY FULL"
                )
            elif changes_old_rows and t.replica_identity in "di":
                identity = "DEFAULT" if t.replica_identity == "d" else "USING INDEX"
                out.append(
                    f"{qualified}: REPLICA IDENTITY {identity} sends only the key of old rows; "
                    "use REPLICA IDENTITY FULL to keep old values"
                )
        return out


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
        options = []
        if publish is not None:
            options.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(publish))))
        if via_partition_root:
            options.append(sql.SQL("publish_via_partition_root = true"))
        if options:
            query += sql.SQL(" WITH (") + sql.SQL(", ").join(options) + sql.SQL(")")
        conn.execute(query)
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
        if set_tables is not None:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident)
                + sql.SQL(", ").join(t.sql() for t in set_tables)
            )
        if add:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE ").format(ident)
                + sql.SQL(", ").join(t.sql() for t in add)
            )
        if drop:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(ident)
                + sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in drop)
            )
    return describe_publication(conninfo, name)


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
        extra = ", pt.attnames, pt.rowfilter" if version >= 150000 else ", NULL, NULL"
        rows = conn.execute(
            f"""SELECT pt.schemaname, pt.tablename, c.relreplident,
                       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
                       {extra}
                FROM pg_publication_tables pt
                JOIN pg_namespace n ON n.nspname = pt.schemaname
                JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
                WHERE pt.pubname = %s ORDER BY 1, 2""",
            (name,),
        ).fetchall()
    tables = [
        PublishedTable(
            schema, table, identity, has_pk, tuple(cols) if cols is not None else None, row_filter
        )
        for schema, table, identity, has_pk, cols, row_filter in rows
    ]
    return PublicationInfo(name, all_tables, publishes, via_root, tables)
