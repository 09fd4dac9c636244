"""The pgoutput Spark source on real servers: the envelope, transaction-bounded batches,
admission control, confirmation after Spark's commit, restart from a checkpoint, batch reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.protocol import Lsn
from replication.helpers import confirmed_flush, slot_row, unique, wait_for
from spark.helpers import collect_stream, source_options

pytestmark = pytest.mark.server


def setup(db: Database) -> tuple[str, str]:
    slot, publication = unique("spark"), unique("pub")
    db.execute(
        "CREATE TABLE customers (id int PRIMARY KEY, name text, note text);"
        "CREATE TABLE orders (id int PRIMARY KEY, customer int,"
        " total numeric(12,2));"
        "ALTER TABLE customers ALTER note SET STORAGE EXTERNAL;"
        f"CREATE PUBLICATION {publication} FOR TABLE customers, orders"
    )
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    return slot, publication


def ops(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.op, r.table, r.key, r.after) for r in rows]


def test_envelope_and_transaction_bounded_batches(spark: Any, pg: Database, tmp_path: Path) -> None:
    slot, publication = setup(pg)
    big = "n" * 5000
    with pg.connect() as a, pg.connect() as b:
        a.execute("BEGIN")
        a.execute(f"INSERT INTO customers VALUES (1, 'ann', '{big}')")  # starts first ...
        b.execute(
            "BEGIN; INSERT INTO customers VALUES (2, 'bob', NULL);"
            "INSERT INTO orders VALUES (10, 2, 5.50), (11, 2, 7.25); COMMIT"
        )
        a.execute("COMMIT")  # ... commits last
    pg.execute("UPDATE customers SET name = 'anne' WHERE id = 1")  # note: unchanged TOAST
    pg.execute("UPDATE customers SET id = 3 WHERE id = 2")  # a key change
    pg.execute("DELETE FROM orders WHERE id = 11")
    pg.execute("TRUNCATE orders")
    options = source_options(pg, slot, publication, maxChangesPerBatch=2)
    batches = collect_stream(spark, options, tmp_path / "ck")
    rows = [r for _, batch in batches for r in batch]

    assert ops(rows) == [
        ("insert", "customers", {"id": "2"}, {"id": "2", "name": "bob", "note": None}),
        ("insert", "orders", {"id": "10"}, {"id": "10", "customer": "2", "total": "5.50"}),
        ("insert", "orders", {"id": "11"}, {"id": "11", "customer": "2", "total": "7.25"}),
        ("insert", "customers", {"id": "1"}, {"id": "1", "name": "ann", "note": big}),
        ("update", "customers", {"id": "1"}, {"id": "1", "name": "anne"}),
        ("update", "customers", {"id": "2"}, {"id": "3", "name": "bob", "note": None}),
        ("delete", "orders", {"id": "11"}, None),
        ("truncate", "orders", None, None),
    ]
    update_toast, key_change = rows[4], rows[5]
    assert update_toast.unchanged_toast == ["note"] and update_toast.before is None
    assert key_change.before == {"id": "2"}
    assert rows[6].before == {"id": "11"}
    # The transaction that began first has lower change LSNs but sorts by its commit.
    assert rows[3].lsn < rows[0].lsn and rows[3].commit_lsn > rows[0].commit_lsn
    sequences = [(r.sequence.commit_lsn, r.sequence.ordinal) for r in rows]
    assert sequences == sorted(set(sequences)) and rows[2].ordinal == 3
    assert rows[0].columns[0].asDict() == {
        "name": "id",
        "type_oid": 23,
        "type_modifier": -1,
        "key": True,
        "attnum": 1,
    }
    assert rows[0].schema == "public" and rows[0].replica_identity == "d"
    assert all(r.commit_ts is not None and r.xid for r in rows)

    # Batches end on transaction boundaries: each xid lies in one batch; the limit holds
    # except for a single larger transaction.
    xid_batches = {(r.xid, bid) for bid, batch in batches for r in batch}
    assert len(xid_batches) == len({x for x, _ in xid_batches})
    for _, batch in batches:
        assert len(batch) <= 2 or len({r.xid for r in batch}) == 1
    assert [len(batch) for _, batch in batches] == [3, 2, 2, 1]

    # Spark tells the source a batch is committed while planning the batch after next: the
    # slot is past every batch but the last two, and not past those.
    confirmed = confirmed_flush(pg, slot)
    assert max(r.commit_lsn for r in batches[-3][1]) < confirmed
    assert confirmed <= min(r.commit_lsn for r in batches[-1][1])


def test_restart_from_checkpoint_resumes_exactly(spark: Any, pg: Database, tmp_path: Path) -> None:
    slot, publication = setup(pg)
    for i in range(1, 9):
        pg.execute(f"INSERT INTO customers VALUES ({i}, 'c{i}', NULL)")
    options = source_options(pg, slot, publication, maxChangesPerBatch=3)
    checkpoint = tmp_path / "ck"
    first: list[tuple[int, list[Any]]] = []
    with pytest.raises(Exception, match="injected failure in batch 1"):
        collect_stream(spark, options, checkpoint, fail_on=1, batches=first)
    pg.execute("INSERT INTO customers VALUES (9, 'c9', NULL)")
    second = collect_stream(spark, options, checkpoint)
    # Batch 1 is planned again with the same bounds, then the stream goes on: with batch 0,
    # committed before the failure, every change exactly once.
    assert second[0][0] == 1
    assert [r.key for r in second[0][1]] == [r.key for r in first[1][1]]
    ids = [int(r.key["id"]) for _, batch in [first[0], *second] for r in batch]
    assert ids == list(range(1, 10))


def test_a_lost_checkpoint_restarts_at_the_slot(
    spark: Any, pg_one: Database, tmp_path: Path
) -> None:
    pg = pg_one  # what it checks does not depend on the server's version
    slot, publication = setup(pg)
    pg.execute("INSERT INTO customers VALUES (1, 'a', NULL)")
    options = source_options(pg, slot, publication)
    assert len(collect_stream(spark, options, tmp_path / "ck1")) == 1
    pg.execute("INSERT INTO customers VALUES (2, 'b', NULL)")
    again = collect_stream(spark, options, tmp_path / "ck2")
    ids = Counter(int(r.key["id"]) for _, batch in again for r in batch)
    # The last batch of the first run was never committed to the slot: it comes again
    # (targets drop it by commit LSN), followed by the new change.
    assert ids == Counter({1: 1, 2: 1})


def test_large_streamed_transaction(spark: Any, pg: Database, tmp_path: Path) -> None:
    slot, publication = setup(pg)
    pg.execute(f"ALTER DATABASE {pg.dbname} SET logical_decoding_work_mem = '64kB'")
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO customers SELECT g, repeat('x', 200), NULL FROM generate_series(1, 3000) g"
        )
        conn.execute("SAVEPOINT s")
        conn.execute(
            "INSERT INTO customers SELECT g, 'gone', NULL FROM generate_series(5001, 6000) g"
        )
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("UPDATE customers SET name = 'y' WHERE id <= 10")
        conn.execute("COMMIT")
    options = source_options(pg, slot, publication, streaming="on")
    rows = [r for _, batch in collect_stream(spark, options, tmp_path / "ck") for r in batch]
    assert Counter(r.op for r in rows) == Counter({"insert": 3000, "update": 10})
    assert [r.ordinal for r in rows] == list(range(1, 3011))


def test_batch_read_peeks_without_consuming(spark: Any, pg: Database) -> None:
    slot, publication = setup(pg)
    pg.execute("INSERT INTO customers VALUES (1, 'a', NULL)")
    pg.execute("INSERT INTO customers VALUES (2, 'b', NULL)")
    before = confirmed_flush(pg, slot)
    reader = spark.read.format("pgoutput").options(**source_options(pg, slot, publication))
    assert [r.key["id"] for r in reader.load().orderBy("sequence").collect()] == ["1", "2"]
    assert reader.load().count() == 2  # still there
    assert confirmed_flush(pg, slot) == before
    first, second = (r.commit_lsn for r in reader.load().orderBy("sequence").collect())
    options = source_options(pg, slot, publication)
    upto = spark.read.format("pgoutput").options(**options, endLsn=str(Lsn(first)))
    assert upto.load().count() == 1
    since = spark.read.format("pgoutput").options(**options, startLsn=str(Lsn(first + 1)))
    later = since.load().collect()
    assert [r.commit_lsn for r in later] == [second]


def test_missing_slot_is_one_clear_error(spark: Any, pg: Database, tmp_path: Path) -> None:
    options = source_options(pg, "no_such_slot", "no_such_pub")
    with pytest.raises(Exception, match="replication slot 'no_such_slot' does not exist"):
        collect_stream(spark, options, tmp_path / "ck")


def test_a_slot_behind_the_checkpoint_sends_ddl_the_stream_had_seen(
    spark: Any, pg_one: Database, tmp_path: Path
) -> None:
    """Spark committed a batch, the slot was not confirmed past it (a crash in between; a
    standby's copy of the slot after a failover), and it held DDL: the slot sends it again,
    and Spark skips it. Two names were swapped in it, a column added since: the first change
    after the checkpoint still says what each column is (a change of before the swap, read
    with the catalog of now, made the later ones swap a and b)."""
    slot, publication = unique("spark"), unique("pub")
    pg_one.execute(
        f"CREATE TABLE s (id int PRIMARY KEY, a int, b int); CREATE PUBLICATION {publication}"
        " FOR TABLE s"
    )
    pg_one.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    options = source_options(pg_one, slot, publication)
    checkpoint = tmp_path / "ck"
    pg_one.execute("INSERT INTO s VALUES (1, 10, 20)")
    assert len(collect_stream(spark, options, checkpoint)) == 1
    behind = unique("behind")
    pg_one.execute(f"SELECT pg_copy_logical_replication_slot('{slot}', '{behind}')")
    try:
        pg_one.execute("INSERT INTO s VALUES (2, 11, 21)")
        pg_one.execute("ALTER TABLE s RENAME a TO t; ALTER TABLE s RENAME b TO a;")
        pg_one.execute("ALTER TABLE s RENAME t TO b; UPDATE s SET a = 0 WHERE id = 2")
        assert [r.op for _, rows in collect_stream(spark, options, checkpoint) for r in rows] == [
            "insert",
            "update",
        ]
        pg_one.execute("INSERT INTO s VALUES (3, 12, 22)")
        pg_one.execute("ALTER TABLE s ADD COLUMN c int")

        def ended() -> bool:
            row = slot_row(pg_one, slot)
            return row is not None and not row["active"]

        wait_for(ended, timeout=60, what="the session to end")
        pg_one.execute(f"SELECT pg_drop_replication_slot('{slot}')")
        pg_one.execute(f"SELECT pg_copy_logical_replication_slot('{behind}', '{slot}')")
        (row,) = [r for _, rows in collect_stream(spark, options, checkpoint) for r in rows]
    finally:
        pg_one.execute(f"SELECT pg_drop_replication_slot('{behind}')")
    assert row.op == "insert" and dict(row.after) == {"id": "3", "b": "12", "a": "22"}
    assert {c.name: c.attnum for c in row.columns} == {"id": 1, "b": 2, "a": 3}
