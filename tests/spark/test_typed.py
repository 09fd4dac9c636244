"""Typed per-table DataFrames: the envelope's text maps as structs of the table's Spark types."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.spark.typed import table_changes
from replication.helpers import unique
from spark.helpers import source_options

pytestmark = pytest.mark.server


def test_table_changes_are_typed(spark: Any, pg: Database) -> None:
    slot, publication = unique("typed"), unique("pub")
    pg.execute(
        "CREATE TYPE mood AS ENUM ('sad', 'ok');"
        "CREATE TABLE t (id int PRIMARY KEY, n numeric(10,2), ts timestamptz, tags text[],"
        " m mood, doc text);"
        "ALTER TABLE t ALTER doc SET STORAGE EXTERNAL;"
        "CREATE TABLE other (id int PRIMARY KEY);"
        f"CREATE PUBLICATION {publication} FOR TABLE t, other"
    )
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(
        "INSERT INTO t VALUES (1, 2.5, '2026-01-01 10:00+00', '{a,b}', 'ok', repeat('d', 5000)),"
        " (2, NULL, NULL, NULL, NULL, NULL)"
    )
    pg.execute("INSERT INTO other VALUES (1)")
    pg.execute("UPDATE t SET n = 3 WHERE id = 1")
    pg.execute("DELETE FROM t WHERE id = 2")
    envelope = spark.read.format("pgoutput").options(**source_options(pg, slot, publication))
    df = table_changes(envelope.load(), "public.t", conninfo=pg.dsn)
    assert df.schema["after"].dataType.simpleString() == (
        "struct<id:int,n:decimal(10,2),ts:timestamp,tags:array<string>,m:string,doc:string>"
    )
    rows = df.orderBy("sequence").collect()
    assert [(r.op, r.key.id) for r in rows] == [
        ("insert", 1),
        ("insert", 2),
        ("update", 1),
        ("delete", 2),
    ]
    first, update, delete = rows[0].after, rows[2], rows[3]
    assert first.n == Decimal("2.50") and first.tags == ["a", "b"] and first.m == "ok"
    assert first.ts == datetime(2026, 1, 1, 10, 0)  # the session time zone is UTC
    assert update.after.n == Decimal("3.00") and update.after.doc is None
    assert update.unchanged_toast == ["doc"] and update.before is None
    assert delete.after is None and delete.before.id == 2 and delete.before.n is None
