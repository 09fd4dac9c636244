"""Focused cases of the exactly-once promise (issue 12) on real servers: each one lost or
invented rows, or stopped the pipeline for good, before it was fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.pipeline import BindingError
from pgcdc.targets import DeltaTarget
from replication.helpers import confirmed_flush, unique
from spark.helpers import assert_identical, pipeline_config, run_pipeline

pytestmark = pytest.mark.server


def _slot_and_publication(db: Database, tables: str) -> tuple[str, str]:
    slot, publication = unique("once"), unique("pub")
    db.execute(f"CREATE PUBLICATION {publication} FOR TABLE {tables}")
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    return slot, publication


def _rows(path: Path, mode: str = "mirror") -> list[dict[str, Any]]:
    return DeltaTarget(str(path), mode, app_id="pgcdc:test").to_arrow().to_pylist()


@pytest.mark.parametrize("last", [3, 1])
def test_identity_full_updates_of_a_toasted_row_in_one_batch(
    spark: Any, pg: Database, tmp_path: Path, last: int
) -> None:
    """Identity FULL, the TOASTed column unchanged by two updates in one micro-batch: one row
    (not two), and with n going 1 -> 2 -> 1 no "MERGE matched a target row with multiple
    source rows" on every restart (case 1)."""
    pg.execute(
        "CREATE TABLE notes (tag text, n int, note text);"
        "ALTER TABLE notes ALTER note SET STORAGE EXTERNAL;"
        "ALTER TABLE notes REPLICA IDENTITY FULL"
    )
    slot, publication = _slot_and_publication(pg, "notes")
    lake = tmp_path / "lake"
    tables = {"public.notes": ["mirror", "history"]}
    config = pipeline_config(pg, slot, publication, lake, tables)
    pg.execute("INSERT INTO notes VALUES ('a', 1, repeat('x', 3000)), ('b', 1, repeat('y', 3000))")
    run_pipeline(spark, config)
    pg.execute(f"UPDATE notes SET n = 2 WHERE tag = 'a'; UPDATE notes SET n = {last}")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    mirror = sorted((r["tag"], r["n"], len(r["note"])) for r in _rows(lake / "public.notes"))
    assert mirror == [("a", last, 3000), ("b", last, 3000)]
    pg.execute("UPDATE notes SET n = n + 10")  # and again, from the target's rows
    run_pipeline(spark, config)
    assert_identical(pg, config)


def test_a_table_renamed_while_streaming_keeps_its_targets(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """ALTER TABLE ... RENAME: the same relation OID under a new name; its later changes go to
    the same targets, in the same batch as the ones before the rename (case 5)."""
    pg.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    slot, publication = _slot_and_publication(pg, "items")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.items": ["mirror", "history"]})
    pg.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")
    run_pipeline(spark, config)
    pg.execute("UPDATE items SET v = 'before rename' WHERE id = 1")
    pg.execute("ALTER TABLE items RENAME TO goods")
    pg.execute("UPDATE goods SET v = 'after rename' WHERE id <= 3; DELETE FROM goods WHERE id = 4")
    pg.execute("INSERT INTO goods VALUES (21, 'new')")
    run_pipeline(spark, config)  # one batch with both names
    pg.execute("ALTER TABLE goods RENAME TO wares; UPDATE wares SET v = 'twice' WHERE id = 5")
    run_pipeline(spark, config)
    mirror = {r["id"]: r["v"] for r in _rows(lake / "public.items")}
    source = dict(pg.execute("SELECT id, v FROM wares"))
    assert mirror == source and mirror[1] == "after rename" and mirror[5] == "twice"
    assert 4 not in mirror and mirror[21] == "new"
    # The slot moved past the renamed table's changes only because they were applied.
    pg.execute("UPDATE wares SET v = 'last' WHERE id = 6")
    run_pipeline(spark, config)
    assert {r["id"]: r["v"] for r in _rows(lake / "public.items")}[6] == "last"
    history = _rows(lake / "public.items__history", "history")
    current = {r["id"]: r["v"] for r in history if r["__END_AT"] is None}
    assert current == dict(pg.execute("SELECT id, v FROM wares"))


def test_a_table_missing_from_the_publication_is_refused(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """A configured table the publication does not publish would never receive a change:
    the pipeline refuses to start, naming it (case 8); so does a table that does not exist."""
    pg.execute("CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    slot, publication = _slot_and_publication(pg, "a")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.a": "mirror", "b": "mirror"})
    with pytest.raises(BindingError, match=rf"public\.b is not in publication {publication}"):
        run_pipeline(spark, config)
    config["tables"] = {"public.a": "mirror", "public.nope": "mirror"}
    with pytest.raises(BindingError, match=r"public\.nope does not exist"):
        run_pipeline(spark, config)
    # Nothing was consumed: once b is published, everything arrives.
    pg.execute("INSERT INTO a VALUES (1); INSERT INTO b VALUES (1)")
    pg.execute(f"ALTER PUBLICATION {publication} ADD TABLE b")
    pg.execute("INSERT INTO b VALUES (2)")
    config["tables"] = {"public.a": "mirror", "public.b": "mirror"}
    run_pipeline(spark, config)
    assert [r["id"] for r in _rows(lake / "public.a")] == [1]
    assert sorted(r["id"] for r in _rows(lake / "public.b")) == [2]  # published from then on


def test_a_dropped_slot_with_data_in_the_targets_stops_the_pipeline(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """The slot is gone after the targets took changes from it: creating a new slot would
    skip whatever was committed in between, so the pipeline stops with one line instead."""
    from pgcdc.pipeline import SlotLost

    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot, publication = _slot_and_publication(pg, "t")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.t": "mirror"})
    config["source"]["create_slot"] = True
    pg.execute("INSERT INTO t VALUES (1)")
    run_pipeline(spark, config)
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    pg.execute("INSERT INTO t VALUES (2)")
    with pytest.raises(SlotLost, match=f'slot "{slot}" is gone'):
        run_pipeline(spark, config)
    assert pg.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}'") == []


def test_a_change_a_table_cannot_take_stops_or_quarantines_it(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """A change that fails on every restart (here a key column's type change, which the
    target cannot follow):
    with on_error = "stop" one line names the table, the change and its LSN, and the slot
    stays; with "quarantine" the other tables stream on and the slot moves, the table's
    changes wait in its change log, and `recopy` brings it back equal to its source."""
    from pgcdc.pipeline import PipelineFailed, request_recopy

    pg.execute("CREATE TABLE a (id int PRIMARY KEY, n int); CREATE TABLE b (id int PRIMARY KEY)")
    slot, publication = _slot_and_publication(pg, "a, b")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.a": "mirror", "b": "mirror"})
    pg.execute("INSERT INTO a SELECT g, g FROM generate_series(1, 10) g; INSERT INTO b VALUES (1)")
    run_pipeline(spark, config)
    pg.execute("ALTER TABLE a ALTER id TYPE text USING 'k' || id")
    pg.execute("UPDATE a SET n = 30 WHERE id = 'k3'; INSERT INTO b VALUES (2)")
    held = confirmed_flush(pg, slot)
    for _ in range(2):  # the same on every restart, and nothing moves
        with pytest.raises(PipelineFailed) as failed:
            run_pipeline(spark, config)
        line = str(failed.value)
        assert line.startswith("public.a: cannot apply 1 change at commit LSN"), line
        assert "first: update of key (id=k3)" in line and "type changed" in line, line
        assert "\n" not in line and ".parquet" not in line
        assert confirmed_flush(pg, slot) == held
    config["tables"]["public.a"] = {"modes": ["mirror"], "on_error": "quarantine"}
    pipeline = run_pipeline(spark, config)
    assert sorted(r["id"] for r in _rows(lake / "public.b")) == [1, 2]
    assert confirmed_flush(pg, slot) > held
    assert pipeline.quarantine.records()["public.a"].status == "quarantined"
    pg.execute("UPDATE a SET n = 40 WHERE id = 'k4'; DELETE FROM a WHERE id = 'k5'")
    pg.execute("INSERT INTO b VALUES (3)")
    run_pipeline(spark, config)  # still set aside; b goes on
    assert sorted(r["id"] for r in _rows(lake / "public.b")) == [1, 2, 3]
    assert {r["id"]: r["n"] for r in _rows(lake / "public.a")}[3] == 3  # as it was
    from pgcdc.pipeline.config import parse_config

    request_recopy(parse_config(config), "public.a")
    pg.execute("UPDATE a SET n = 60 WHERE id = 'k6'")
    pipeline = run_pipeline(spark, config)
    assert pipeline.quarantine.records() == {}
    assert_identical(pg, config)
    assert {r["id"]: r["n"] for r in _rows(lake / "public.a")}["k6"] == 60


def test_the_pipeline_warns_when_the_slot_retains_too_much_wal(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import parse_config

    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    slot, publication = _slot_and_publication(pg, "t")
    config = pipeline_config(pg, slot, publication, tmp_path / "lake", {"public.t": "mirror"})
    config["source"]["max_retained_wal"] = "64kB"
    pg.execute("INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(1, 2000) g")
    pipeline = Pipeline(parse_config(config), spark)
    warning = pipeline.watch_wal(every=0)
    assert warning is not None and warning.startswith(f"slot {slot} retains ")
    assert "over the configured 64.0 kB" in warning
    config["source"]["max_retained_wal"] = "1GB"
    assert Pipeline(parse_config(config), spark).watch_wal(every=0) is None


def test_partitions_published_on_their_own_feed_the_parent(
    spark: Any, pg: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without publish_via_partition_root each partition's changes come under its own OID:
    they go to the parent's targets, also for a partition attached later; a TRUNCATE of the
    whole table applies, a TRUNCATE of one partition stops the pipeline with a line naming it
    (the targets do not know which rows were that partition's)."""
    from pgcdc.pipeline import PipelineFailed

    pg.execute(
        "CREATE TABLE m (id int, day date, v text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);"
        "CREATE TABLE m_1 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');"
        "CREATE TABLE m_2 PARTITION OF m FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');"
    )
    slot, publication = _slot_and_publication(pg, "m")
    config = pipeline_config(pg, slot, publication, tmp_path / "lake", {"public.m": "mirror"})
    pg.execute(
        "INSERT INTO m SELECT g, DATE '2025-06-01' + g * 2, 'v' FROM generate_series(1, 200) g"
    )
    run_pipeline(spark, config)
    assert_identical(pg, config)
    pg.execute(
        "CREATE TABLE m_3 (LIKE m INCLUDING ALL);"
        "ALTER TABLE m ATTACH PARTITION m_3 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');"
        "INSERT INTO m VALUES (1000, '2027-05-01', 'attached'); UPDATE m SET v = 'u' WHERE id < 5"
    )
    with caplog.at_level("WARNING", logger="pgcdc.pipeline"):
        run_pipeline(spark, config)
    assert "public.m: partitions attached (OID" in caplog.text
    assert_identical(pg, config)
    caplog.clear()
    with caplog.at_level("WARNING", logger="pgcdc.pipeline"):
        run_pipeline(spark, config)  # said once
    assert "attached" not in caplog.text
    pg.execute("TRUNCATE m; INSERT INTO m VALUES (1, '2025-02-02', 'after')")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    pg.execute("ALTER TABLE m DETACH PARTITION m_3")  # its rows leave without a change
    with caplog.at_level("WARNING", logger="pgcdc.pipeline"):
        run_pipeline(spark, config)
    assert "public.m: partitions detached (OID" in caplog.text
    pg.execute("INSERT INTO m VALUES (2, '2026-02-02', 'b'); TRUNCATE m_1")
    with pytest.raises(PipelineFailed, match=r"public\.m: cannot apply .*TRUNCATE of some of its"):
        run_pipeline(spark, config)


def test_added_columns_hold_their_value_in_every_older_row(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """ADD COLUMN ... DEFAULT sends no change for the rows that exist: the mirror (and the
    history's current versions) take the catalog's missing value, or each row's own value
    after a volatile default, also for rows of the same batch made before the ALTER (case 6)."""
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    slot, publication = _slot_and_publication(pg, "t")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.t": ["mirror", "history"]})
    pg.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    run_pipeline(spark, config)
    pg.execute("INSERT INTO t VALUES (51, 'same batch, before')")
    pg.execute("ALTER TABLE t ADD COLUMN e text DEFAULT 'e', ADD COLUMN n int NOT NULL DEFAULT 7")
    pg.execute("UPDATE t SET v = 'after' WHERE id = 2; INSERT INTO t VALUES (52, 'new', 'x', 1)")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    pg.execute("ALTER TABLE t ADD COLUMN r float8 DEFAULT random()")  # rewrites the table
    pg.execute("ALTER TABLE t ADD COLUMN none_yet int")
    pg.execute("UPDATE t SET v = 'later' WHERE id = 3")
    run_pipeline(spark, config)
    assert_identical(pg, config)
    mirror = {r["id"]: r for r in _rows(lake / "public.t")}
    assert mirror[1]["e"] == "e" and mirror[1]["n"] == 7 and mirror[52]["e"] == "x"
    assert mirror[1]["r"] is not None and mirror[1]["none_yet"] is None


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_identity_full_duplicates_are_kept_as_copies(
    spark: Any, pg: Database, tmp_path: Path, mode: str
) -> None:
    """Two identical rows of a table without a key under REPLICA IDENTITY FULL are two mirror
    rows; deleting or updating one of them (ctid) touches one copy (case 7)."""
    pg.execute(
        "CREATE TABLE d (tag text, n int, note text);"
        "ALTER TABLE d ALTER note SET STORAGE EXTERNAL; ALTER TABLE d REPLICA IDENTITY FULL"
    )
    slot, publication = _slot_and_publication(pg, "d")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.d": mode})
    pg.execute(
        "INSERT INTO d SELECT 't' || (g % 3), g % 2, repeat('x', 3000) "
        "FROM generate_series(1, 12) g, generate_series(1, 2) copies"
    )
    run_pipeline(spark, config)
    assert_identical(pg, config)
    one = "ctid = (SELECT ctid FROM d WHERE tag = 't1' AND n = 1 LIMIT 1)"
    pg.execute(f"DELETE FROM d WHERE {one}")
    pg.execute(f"UPDATE d SET n = 5 WHERE {one}")
    pg.execute("INSERT INTO d SELECT * FROM d WHERE tag = 't2' LIMIT 1")
    pg.execute("UPDATE d SET tag = 't9' WHERE tag = 't0' AND n = 0")  # TOASTed note unchanged
    run_pipeline(spark, config)
    assert_identical(pg, config)


@pytest.mark.parametrize("published", ["a column list", "generated columns"])
def test_the_copy_takes_the_columns_the_stream_sends(
    spark: Any, pg: Database, tmp_path: Path, published: str
) -> None:
    """The initial copy copies the columns the publication publishes, as the stream sends
    them: a column list leaves the others out, and a generated column is left out unless
    the publication publishes it (PostgreSQL 18's publish_generated_columns). Before, the
    copy took every column, and the ones the stream never sends kept the copy's values."""
    from pgcdc.pipeline.config import parse_config
    from pgcdc.pipeline.verify import compare_mirror

    if published == "generated columns" and pg.version < 18:
        pytest.skip("publications publish generated columns from PostgreSQL 18")
    pg.execute(
        "CREATE TABLE g (id int PRIMARY KEY, n int, twice int GENERATED ALWAYS AS (n * 2) STORED,"
        " secret text);"
        "INSERT INTO g (id, n, secret) SELECT x, x, 's' FROM generate_series(1, 30) x"
    )
    slot, publication = unique("cols"), unique("pub")
    spec = "g (id, n)" if published == "a column list" else "g"
    options = " WITH (publish_generated_columns = stored)" if published != "a column list" else ""
    pg.execute(f"CREATE PUBLICATION {publication} FOR TABLE {spec}{options}")
    lake = tmp_path / "lake"
    config = pipeline_config(pg, slot, publication, lake, {"public.g": "mirror"})
    config["source"]["create_slot"] = True
    run_pipeline(spark, config)  # the copy
    pg.execute("UPDATE g SET n = 100, secret = 'changed' WHERE id <= 5; DELETE FROM g WHERE id = 9")
    run_pipeline(spark, config)
    expected = ["id", "n"] if published == "a column list" else ["id", "n", "twice", "secret"]
    mirror = DeltaTarget(str(lake / "public.g"), "mirror", app_id="pgcdc:test").to_arrow()
    assert mirror.column_names == expected
    pipeline = parse_config(config)
    verdict = compare_mirror(pg.dsn, "public.g", mirror, publications=pipeline.publications)
    assert verdict.equal, f"{verdict} {verdict.missing} {verdict.extra}"
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
