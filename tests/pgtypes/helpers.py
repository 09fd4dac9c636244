"""Streaming a table's rows through a real server and decoding them with the type registry."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pgcdc.embedded import Database
from pgcdc.protocol import Insert, Relation
from pgcdc.replication import ReplicationClient, StreamOptions
from pgcdc.types import DEFAULT_REGISTRY, TypeRegistry
from replication.helpers import unique


def stream_inserts(
    pg: Database,
    table: str,
    *,
    binary: bool,
    registry: TypeRegistry = DEFAULT_REGISTRY,
    setup: str | None = None,
    insert: str,
) -> list[tuple[Any, ...]]:
    """Run `insert` (SQL that inserts rows into `table`) with a fresh slot and publication in
    place, stream it back (text or binary column forms) and decode every column with
    `registry`. Returns one tuple per inserted row, in order, columns as in the table."""
    pub, slot = unique("pub"), unique("slot")
    if setup:
        pg.execute(setup)
    pg.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(insert)
    options = StreamOptions((pub,), binary=binary)
    rows: list[tuple[Any, ...]] = []
    relations: dict[int, Relation] = {}
    with ReplicationClient(pg.dsn, slot, options, until_idle=True, reconnect=False) as client:
        for _, message in client:
            if isinstance(message, Relation):
                relations[message.relid] = message
            elif isinstance(message, Insert):
                relation = relations[message.relid]
                row = message.new
                values = []
                for column, kind, value in zip(
                    relation.columns, row.kinds, row.values, strict=True
                ):
                    if value is None:
                        values.append(None)
                    else:
                        values.append(registry.get(column.type_oid).decode(kind, value))
                rows.append(tuple(values))
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    return rows


def kinds_sent(pg: Database, table: str, insert: str, *, binary: bool) -> set[str]:
    """Which column kinds (t/b) the server used, to check that binary mode really was binary."""
    pub, slot = unique("pub"), unique("slot")
    pg.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(insert)
    seen: set[str] = set()
    options = StreamOptions((pub,), binary=binary)
    with ReplicationClient(pg.dsn, slot, options, until_idle=True, reconnect=False) as client:
        for _, message in client:
            if isinstance(message, Insert):
                seen.update(chr(k) for k in message.new.kinds)
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    return seen


def _refuse(data: bytes) -> Any:
    raise AssertionError(f"a column came in the other format: {data[:20]!r}")


#: Registries that fail on the format not asked for, proving each stream's columns were sent
#: in the mode under test.
TEXT_ONLY = TypeRegistry(
    {o: replace(c, from_binary=_refuse) for o, c in DEFAULT_REGISTRY.codecs.items()}
)
BINARY_ONLY = TypeRegistry(
    {o: replace(c, from_text=_refuse) for o, c in DEFAULT_REGISTRY.codecs.items()}
)


def stream_both(pg: Database, columns: str, rows: list[str]) -> tuple[list[tuple], list[tuple]]:
    """Fill table `src` (id int, `columns`) with `rows` (SQL select lists), copy it into a
    published table once per mode, and return the streamed (text rows, binary rows) without
    the id."""
    pg.execute(f"CREATE TABLE src (id int, {columns})")
    for i, row in enumerate(rows):
        pg.execute(f"INSERT INTO src SELECT {i}, {row}")
    pg.execute("CREATE TABLE v (LIKE src)")
    insert = "INSERT INTO v SELECT * FROM src ORDER BY id"
    text = stream_inserts(pg, "v", binary=False, registry=TEXT_ONLY, insert=insert)
    binary = stream_inserts(pg, "v", binary=True, registry=BINARY_ONLY, insert=insert)
    return [r[1:] for r in text], [r[1:] for r in binary]
