"""The pipeline on real servers: Delta mirrors equal their sources and histories replay to
them, through interleaved, streamed and prepared transactions, key changes, unchanged TOAST,
truncates, row filters, identity-full tables and schema changes."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.pipeline._appliers import ApplierPool
from pgcdc.pipeline._driver import SWITCH_INTERVAL
from pgcdc.pipeline._lineage import SlotLineage
from pgcdc.pipeline._startup import SlotRecord
from pgcdc.pipeline._work import TableOutcome, TableWork
from pgcdc.protocol import Lsn
from pgcdc.targets import DeltaTarget
from replication.helpers import confirmed_flush, current_wal_lsn, unique
from spark.helpers import assert_identical, pipeline_config, run_pipeline

pytestmark = pytest.mark.server

SCHEMA = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tags text[], profile jsonb,
                        balance numeric(12,2), notes text, seen timestamptz);
ALTER TABLE customers ALTER notes SET STORAGE EXTERNAL;
CREATE TABLE orders (id int PRIMARY KEY, total numeric(12,2),
                     customer bigint REFERENCES customers ON DELETE CASCADE ON UPDATE CASCADE);
CREATE TABLE events (kind text, at int, payload jsonb);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE big (id int PRIMARY KEY, v text);
"""
TABLES = {
    "public.customers": ["mirror", "history"],
    "public.orders": ["mirror", "history", "changelog"],
    "public.events": "mirror",
    "public.big": "mirror",
}


def setup(db: Database, publication_sql: str | None = None) -> tuple[str, str]:
    slot, publication = unique("pipe"), unique("pub")
    db.execute(SCHEMA)
    db.execute(
        publication_sql.format(publication=publication)
        if publication_sql
        else f"CREATE PUBLICATION {publication} FOR TABLE customers, orders, events, big"
    )
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    return slot, publication


def workload(db: Database) -> None:
    notes = "n" * 6000
    db.execute(
        "INSERT INTO customers SELECT g, 'c' || g, ARRAY['a', 'b'], "
        "jsonb_build_object('k', g), g * 1.25, "
        f"CASE WHEN g % 2 = 0 THEN '{notes}' END, '2026-01-01 10:00+00' "
        "FROM generate_series(1, 40) g"
    )
    db.execute("INSERT INTO orders SELECT g, g * 2, g % 40 + 1 FROM generate_series(1, 60) g")
    db.execute("INSERT INTO events VALUES ('a', 1, '{}'), ('a', 1, '{}'), ('b', 2, NULL)")
    with db.connect() as a, db.connect() as b:
        a.execute("BEGIN")
        a.execute("UPDATE customers SET name = 'first-began' WHERE id = 1")
        b.execute("BEGIN; UPDATE customers SET name = 'committed-first' WHERE id = 2; COMMIT")
        a.execute("UPDATE customers SET balance = 0 WHERE id = 2")
        a.execute("COMMIT")
    db.execute("UPDATE customers SET name = 'toast kept' WHERE id % 4 = 0")  # notes unchanged
    db.execute("UPDATE customers SET id = 1000 + id WHERE id IN (6, 7)")  # key changes
    db.execute("UPDATE customers SET id = 2000, notes = NULL WHERE id = 1008")
    db.execute("DELETE FROM customers WHERE id IN (3, 5)")  # cascades to orders
    db.execute("UPDATE events SET at = 9 WHERE kind = 'b'")
    db.execute("DELETE FROM events WHERE kind = 'a'")  # both identical rows
    db.execute("BEGIN; INSERT INTO big VALUES (1, 'x'); PREPARE TRANSACTION 'p1'")
    db.execute("COMMIT PREPARED 'p1'")
    db.execute("BEGIN; INSERT INTO big VALUES (2, 'rolled back'); PREPARE TRANSACTION 'p2'")
    db.execute("ROLLBACK PREPARED 'p2'")
    db.execute("TRUNCATE orders")
    db.execute("INSERT INTO orders VALUES (1, 1.00, 1), (2, 2.00, 2)")
    db.execute("UPDATE orders SET total = 3 WHERE id = 1")


def test_mirrors_and_histories_follow_the_source(
    spark: Any, pg: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot, publication = setup(pg)
    pg.execute(f"ALTER DATABASE {pg.dbname} SET logical_decoding_work_mem = '64kB'")
    workload(pg)
    # A large transaction, streamed by the server while in progress, with a rolled-back part.
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO big SELECT g, repeat('v', 100) FROM generate_series(10, 4000) g")
        conn.execute("SAVEPOINT s")
        conn.execute("DELETE FROM big WHERE id < 100")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("UPDATE big SET v = 'u' WHERE id % 10 = 0")
        conn.execute("COMMIT")
    config = pipeline_config(
        pg, slot, publication, tmp_path / "lake", TABLES, max_changes_per_batch=500
    )
    config["source"]["streaming"] = "on"
    config["target"]["read_cache"] = "96MB"
    config["trigger"]["apply_processes"] = 2
    saved: list[tuple[threading.Thread, Lsn]] = []  # the slot's record, by whom
    save = SlotLineage._save

    def recorded(lineage: SlotLineage, record: SlotRecord) -> None:
        saved.append((threading.current_thread(), record.confirmed))
        save(lineage, record)

    monkeypatch.setattr(SlotLineage, "_save", recorded)
    sent: list[TableWork] = []  # to the apply processes
    apply = ApplierPool.apply

    def sending(pool: ApplierPool, works: Sequence[TableWork]) -> list[TableOutcome]:
        sent.extend(works)
        return apply(pool, works)

    monkeypatch.setattr(ApplierPool, "apply", sending)
    pipeline = run_pipeline(spark, config)
    assert pipeline.stats.batches >= 2
    assert sent and {work.read_cache for work in sent} == {96 << 20}
    assert_identical(pg, config)
    # The clean stop moved the slot to the end of the last batch, which the driver recorded
    # (each batch's end, before it let the session confirm it: the session's thread has no
    # fsync to wait for then).
    assert confirmed_flush(pg, slot) >= pipeline.stats.last_commit_lsn
    by_driver = [lsn for thread, lsn in saved if thread is threading.current_thread()]
    assert len(by_driver) >= pipeline.stats.batches
    assert max(lsn for _, lsn in saved) >= confirmed_flush(pg, slot)

    # History: customer 1 has its insert version closed by the interleaved update.
    history = (
        DeltaTarget(
            str(tmp_path / "lake/public.customers__history"), "history", app_id="pgcdc:test"
        )
        .to_arrow()
        .to_pylist()
    )
    versions = sorted(
        (r["__START_AT"]["commit_lsn"], r["name"], r["__END_AT"] is None)
        for r in history
        if r["id"] == 1
    )
    assert [(name, current) for _, name, current in versions] == [
        ("c1", False),
        ("first-began", True),
    ]
    changelog = DeltaTarget(
        str(tmp_path / "lake/public.orders__changelog"), "changelog", app_id="pgcdc:test"
    ).to_arrow()
    assert "truncate" in changelog.column("op").to_pylist()

    # Nothing new: a second run applies nothing and changes nothing. While it runs, its
    # threads switch every 0.5 ms and what existed before it is frozen out of the garbage
    # collector's passes; the interpreter's own settings come back afterwards.
    intervals: set[float] = set()
    frozen: set[int] = set()
    running = threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            intervals.add(sys.getswitchinterval())
            frozen.add(gc.get_freeze_count())
            time.sleep(0.002)

    default = sys.getswitchinterval()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        again = run_pipeline(spark, config)
    finally:
        running.clear()
        watcher.join()
    assert again.stats.changes == 0
    assert_identical(pg, config)
    # No batch: whatever moved the slot (the session, past an idle stretch) recorded it first.
    assert max(lsn for _, lsn in saved) >= confirmed_flush(pg, slot)
    assert SWITCH_INTERVAL in intervals and sys.getswitchinterval() == default > SWITCH_INTERVAL
    assert max(frozen) > 10_000 and gc.get_freeze_count() == 0


def test_row_filters_convert_updates(spark: Any, pg: Database, tmp_path: Path) -> None:
    slot, publication = setup(
        pg,
        "ALTER TABLE customers REPLICA IDENTITY FULL;"
        "CREATE PUBLICATION {publication} FOR TABLE customers WHERE (balance > 10)",
    )
    pg.execute(
        "INSERT INTO customers (id, name, balance) SELECT g, 'c', g FROM generate_series(1, 20) g"
    )
    pg.execute("UPDATE customers SET balance = 50 WHERE id = 3")  # moves in: an insert
    pg.execute("UPDATE customers SET balance = 1 WHERE id = 15")  # moves out: a delete
    pg.execute("UPDATE customers SET name = 'x' WHERE id = 16")
    config = pipeline_config(
        pg, slot, publication, tmp_path / "lake", {"public.customers": "mirror"}
    )
    run_pipeline(spark, config)
    rows = DeltaTarget(
        str(tmp_path / "lake/public.customers"), "mirror", app_id="pgcdc:test"
    ).to_arrow()
    ids = sorted(rows.column("id").to_pylist())
    assert ids == [3, *range(11, 15), *range(16, 21)]


def test_schema_changes(spark: Any, pg: Database, tmp_path: Path) -> None:
    slot, publication = setup(pg)
    pg.execute("INSERT INTO orders VALUES (1, 1.5)")
    config = pipeline_config(pg, slot, publication, tmp_path / "lake", {"public.orders": "mirror"})
    run_pipeline(spark, config)
    # An added column appears; widening int4 to int8 evolves the target.
    pg.execute("ALTER TABLE orders ADD COLUMN note text")
    pg.execute("INSERT INTO orders VALUES (2, 2.5, NULL, 'new column')")
    pg.execute("ALTER TABLE orders ALTER id TYPE bigint")
    pg.execute("INSERT INTO orders VALUES (3000000000, 3, NULL, 'wide')")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    # A type change beyond a widening: every row holds the source's values again.
    pg.execute("ALTER TABLE orders ALTER total TYPE text USING 'total ' || total")
    pg.execute("INSERT INTO orders VALUES (4, 'four', NULL, 'x')")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    # One of a key column stops the pipeline, names table, column and LSN, moves nothing.
    pg.execute("ALTER TABLE orders ALTER id TYPE text USING 'o' || id")
    pg.execute("INSERT INTO orders VALUES ('o5', 'five', NULL, 'x')")
    before = confirmed_flush(pg, slot)
    from pgcdc.pipeline import PipelineFailed

    with pytest.raises(PipelineFailed, match=r"public\.orders\.id.*LSN"):
        run_pipeline(spark, config)
    assert confirmed_flush(pg, slot) == before
    assert current_wal_lsn(pg) > before


def test_targets_given_by_uri(spark: Any, pg: Database, tmp_path: Path) -> None:
    """Targets named by a URI (an object store's path, here ``file://``) with storage options,
    the state in a directory of its own: the copy and the stream go through the URI."""
    if pg.version < 18:
        pytest.skip("the storage path is the same on every server")
    pg.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO u SELECT g, 'v' || g FROM generate_series(1, 500) g")
    publication, slot = unique("pub"), unique("uri")
    pg.execute(f"CREATE PUBLICATION {publication} FOR TABLE u")
    config = pipeline_config(pg, slot, publication, tmp_path, {"public.u": ["mirror", "history"]})
    config["source"]["create_slot"] = True
    config["target"] = {
        "path": f"file://{tmp_path}/lake",
        "state": str(tmp_path / "state"),
        "storage_options": {"timeout": "30s"},
    }
    run_pipeline(spark, config)
    pg.execute("UPDATE u SET v = 'changed' WHERE id % 7 = 0; DELETE FROM u WHERE id > 490")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    assert (tmp_path / "lake" / "public.u" / "_delta_log").is_dir()
    assert (tmp_path / "state" / "tables.json").exists()


@pytest.mark.parametrize("processes", [0, 2])
def test_targets_the_driver_applies_batches_to_are_maintained_between_them(
    spark: Any, pg: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    """The targets of the batches the driver keeps are maintained where they are open, while
    the driver waits for the next batch, or, when none waits, with one pass after a batch:
    each target still gets its passes, one target of a process at a time. Threads of the
    driver (``apply_processes = 0``): every pass is counted, due every 3 versions. Apply
    processes: the passes they say they ran, due every 25 versions (their own default)."""
    import pgcdc.targets._merge_on_read as merge_on_read
    import pgcdc.targets.delta as delta

    passes: list[str] = []
    original = merge_on_read.maintain_deletion_vectors

    def counted(table: Any, policy: Any = None, **options: Any) -> Any:
        passes.append(table.uri)
        return original(table, policy, **options)

    ran: list[bool] = []
    maintain = ApplierPool.maintain

    def said(pool: ApplierPool) -> bool:
        ran.append(maintain(pool))
        return ran[-1]

    monkeypatch.setattr(delta, "MERGE_ON_READ_EVERY", 3)
    monkeypatch.setattr(merge_on_read, "maintain_deletion_vectors", counted)
    monkeypatch.setattr(ApplierPool, "maintain", said)
    slot, publication = unique("maint"), unique("pub")
    pg.execute(
        "CREATE TABLE m (id int PRIMARY KEY, v int); "
        "INSERT INTO m SELECT g, 0 FROM generate_series(1, 50) g; "
        f"CREATE PUBLICATION {publication} FOR TABLE m"
    )
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    batches = 15 if processes == 0 else 30
    try:
        for i in range(batches):  # a transaction of 10 changes a batch
            pg.execute(f"UPDATE m SET v = {i + 1} WHERE id % 5 = {i % 5}")
        tables = {"public.m": ["mirror", "history"]}
        config = pipeline_config(
            pg, slot, publication, tmp_path / "lake", tables, max_changes_per_batch=10
        )
        config["trigger"]["apply_processes"] = processes
        pipeline = run_pipeline(spark, config)
        assert pipeline.stats.batches == batches
        assert_identical(pg, config)
        if processes:
            assert not passes  # none in the driver
            assert ran.count(True) >= 2, ran  # one of each target, after version 25
        else:
            assert not ran
            for mode in ("public.m", "public.m__history"):
                made = [p for p in passes if p.rstrip("/").endswith(mode)]
                assert len(made) >= 3, (mode, passes)  # due every 3 versions of 15 and more
    finally:
        pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
        pg.execute(f"DROP PUBLICATION {publication}; DROP TABLE m")
