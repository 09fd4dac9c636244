"""Random workloads and crashes: after catching up, every mirror equals its source table and
every history replays to it, whatever the batch boundaries and wherever the pipeline died."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database, EmbeddedServer
from replication.helpers import unique
from spark.helpers import assert_identical, finish_child, pipeline_config, run_pipeline, start_child

pytestmark = pytest.mark.server

SCHEMA = """
CREATE TABLE a (k int PRIMARY KEY, v text, n numeric(10,2));
CREATE TABLE b (k1 int, k2 text, doc jsonb, PRIMARY KEY (k1, k2));
CREATE TABLE c (x int, y text);
ALTER TABLE c REPLICA IDENTITY FULL;
"""
TABLES = {
    "public.a": ["mirror", "history"],
    "public.b": ["mirror", "history"],
    "public.c": "mirror",
}

keys = st.integers(0, 7)
text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
operation = st.one_of(
    st.tuples(st.just("upsert_a"), keys, text, st.integers(-1000, 1000)),
    st.tuples(st.just("update_a"), keys, text),
    st.tuples(st.just("move_a"), keys, keys),
    st.tuples(st.just("delete_a"), keys),
    st.tuples(st.just("upsert_b"), keys, st.sampled_from(["x", "y"]), st.integers(0, 9)),
    st.tuples(st.just("delete_b"), keys),
    st.tuples(st.just("insert_c"), keys, text),
    st.tuples(st.just("update_c"), keys, text),
    st.tuples(st.just("delete_c"), keys),
    st.tuples(st.just("truncate"), st.sampled_from(["a", "b", "c", "a, b"])),
)
transactions = st.lists(st.lists(operation, min_size=1, max_size=6), min_size=1, max_size=12)

SQL = {
    "upsert_a": "INSERT INTO a VALUES (%s, %s, %s) ON CONFLICT (k) DO UPDATE "
    "SET v = excluded.v, n = excluded.n",
    "update_a": "UPDATE a SET v = %s WHERE k = %s",
    "move_a": "UPDATE a SET k = %s WHERE k = %s AND NOT EXISTS (SELECT 1 FROM a WHERE k = %s)",
    "delete_a": "DELETE FROM a WHERE k = %s",
    "upsert_b": "INSERT INTO b VALUES (%s, %s, jsonb_build_object('n', %s)) "
    "ON CONFLICT (k1, k2) DO UPDATE SET doc = excluded.doc",
    "delete_b": "DELETE FROM b WHERE k1 = %s",
    "insert_c": "INSERT INTO c VALUES (%s, %s)",
    "update_c": "UPDATE c SET y = %s WHERE x = %s",
    "delete_c": "DELETE FROM c WHERE x = %s",
}


def newest_only(version: int) -> None:
    """These tests restart Spark many times; the version matrix is test_pipeline.py's."""
    if version < 18:
        pytest.skip("slow recovery tests run on PostgreSQL 18 only")


def play(db: Database, txns: list[list[tuple[Any, ...]]]) -> None:
    with db.connect() as conn:
        for txn in txns:
            conn.execute("BEGIN")
            for op, *args in txn:
                if op == "truncate":
                    conn.execute(f"TRUNCATE {args[0]}")
                elif op == "update_a" or op == "update_c":
                    conn.execute(SQL[op], (args[1], args[0]))
                elif op == "move_a":
                    conn.execute(SQL[op], (args[1], args[0], args[1]))
                else:
                    conn.execute(SQL[op], args)
            conn.execute("COMMIT")


def prepare(db: Database) -> tuple[str, str]:
    slot, publication = unique("prop"), unique("pub")
    db.execute(SCHEMA)
    db.execute(f"CREATE PUBLICATION {publication} FOR TABLE a, b, c")
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    return slot, publication


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=transactions, second=transactions, batch=st.integers(1, 40))
def test_random_workloads(
    spark: Any,
    pg_server: EmbeddedServer,
    tmp_path_factory: Any,
    first: Any,
    second: Any,
    batch: int,
) -> None:
    newest_only(pg_server.version)
    db = pg_server.create_database()
    try:
        slot, publication = prepare(db)
        lake = tmp_path_factory.mktemp("lake")
        config = pipeline_config(db, slot, publication, lake, TABLES, max_changes_per_batch=batch)
        play(db, first)
        run_pipeline(spark, config)
        assert_identical(db, config)
        play(db, second)
        run_pipeline(spark, config)
        assert_identical(db, config)
    finally:
        db.drop()


def test_crashes_and_lost_state(pg: Database, tmp_path: Path) -> None:
    newest_only(pg.version)
    rng = random.Random(7)
    slot, publication = prepare(pg)
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, TABLES, max_changes_per_batch=25)
    workload = [
        [("upsert_a", rng.randrange(40), f"v{i}", i), ("upsert_b", rng.randrange(8), "x", i)]
        + [("update_a", rng.randrange(40), f"u{i}"), ("insert_c", rng.randrange(5), f"c{i}")]
        + ([("move_a", rng.randrange(40), rng.randrange(40, 80))] if i % 3 == 0 else [])
        + ([("delete_a", rng.randrange(40)), ("delete_c", rng.randrange(5))] if i % 4 == 0 else [])
        for i in range(60)
    ]
    play(pg, workload[:30])
    # Die right after the second batch's Delta commits, before Spark records the batch.
    code, output = finish_child(start_child(config, "--exit-after-batches", "2"))
    assert code == 3, output
    # The slot sends the batch again; the targets already hold it and skip its rows.
    play(pg, workload[30:40])
    code, output = finish_child(start_child(config))
    assert code == 0, output
    first = output.split("\n", 1)[0].split()
    assert first[:2] == ["batch", "0"] and first[5] != "0", output
    assert_identical(pg, config)
    play(pg, workload[40:45])
    # Die at a random moment (start-up, planning, reading, applying).
    proc = start_child(config)
    time.sleep(rng.uniform(6, 12))
    os.killpg(proc.pid, signal.SIGKILL)
    finish_child(proc)
    play(pg, workload[45:])
    play(pg, [[("truncate", "c"), ("insert_c", 1, "after truncate")]])
    # Lose the pipeline's state: the targets' own watermarks keep replays out.
    shutil.rmtree(lake / "_pgcdc")
    code, output = finish_child(start_child(config))
    assert code == 0 and "caught up" in output, output
    assert_identical(pg, config)
