"""Ordinary DDL while the pipeline streams: after each statement (and after all of them in
one batch), every mirror equals its table and every history's current versions do.

Each step is a DDL statement and a change that touches only some rows, so the rows the
change leaves alone show what the targets did with the DDL: an added column must hold in
them the value the source has (NULL, its default, a volatile default's own value), a renamed
column its old values, a widened one its values, one whose type changed otherwise the values
the server rewrote it with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.pipeline.config import parse_config
from pgcdc.pipeline.verify import compare_history, compare_mirror
from pgcdc.targets import DeltaTarget
from replication.helpers import unique
from spark.helpers import pipeline_config, run_pipeline

pytestmark = pytest.mark.server

#: (what, DDL, a change after it); the table is `d` until it is renamed to `d2`.
STEPS = [
    (
        "add without a default",
        "ALTER TABLE {t} ADD COLUMN a1 text",
        "UPDATE {t} SET a1 = 'x' WHERE id % 5 = 0",
    ),
    (
        "add with a constant default",
        "ALTER TABLE {t} ADD COLUMN a2 int DEFAULT 7",
        "UPDATE {t} SET a2 = 8 WHERE id % 7 = 0",
    ),
    (
        "add with a volatile default",
        "ALTER TABLE {t} ADD COLUMN a3 text DEFAULT md5(random()::text)",
        "INSERT INTO {t} (id, v) VALUES (1001, 'new')",
    ),
    (
        "rename a column in the middle",
        "ALTER TABLE {t} RENAME COLUMN v TO v2",
        "UPDATE {t} SET v2 = 'r' WHERE id = 3",
    ),
    (
        "rename the last column",
        "ALTER TABLE {t} RENAME COLUMN a3 TO a3r",
        "UPDATE {t} SET a2 = 9 WHERE id = 4",
    ),
    ("drop a column", "ALTER TABLE {t} DROP COLUMN a1", "DELETE FROM {t} WHERE id = 5"),
    (
        "widen a type",
        "ALTER TABLE {t} ALTER COLUMN n TYPE bigint",
        "UPDATE {t} SET n = 5000000000 WHERE id = 7",
    ),
    (
        "set a default",
        "ALTER TABLE {t} ALTER COLUMN n SET DEFAULT 1",
        "INSERT INTO {t} (id) VALUES (1002)",
    ),
    (
        "change a type beyond a widening",
        "ALTER TABLE {t} ALTER COLUMN a2 TYPE text USING 'a' || a2",
        "UPDATE {t} SET a2 = 'changed' WHERE id = 10",
    ),
    (
        "change a type back, with other values",
        "ALTER TABLE {t} ALTER COLUMN a2 TYPE numeric(6,1) USING length(a2) / 3.0",
        "UPDATE {t} SET a2 = 1.5 WHERE id = 12",
    ),
    (
        "add an identity column",
        "ALTER TABLE {t} ADD COLUMN k int GENERATED ALWAYS AS IDENTITY",
        "UPDATE {t} SET n = 3 WHERE id = 3",
    ),
    (
        "change the primary key",
        "ALTER TABLE {t} DROP CONSTRAINT d_pkey, ADD PRIMARY KEY (k)",
        "UPDATE {t} SET n = 4 WHERE k = 6",
    ),
    (
        "limit a text's length",
        "ALTER TABLE {t} ALTER COLUMN v2 TYPE varchar(20)",
        "UPDATE {t} SET v2 = 'short' WHERE id = 13",
    ),
    (
        "lengthen it",
        "ALTER TABLE {t} ALTER COLUMN v2 TYPE varchar(40)",
        "UPDATE {t} SET v2 = 'a little longer' WHERE id = 14",
    ),
    (
        "widen a numeric",
        "ALTER TABLE {t} ALTER COLUMN a2 TYPE numeric(9,1)",
        "UPDATE {t} SET a2 = 12345.6 WHERE id = 15",
    ),
    ("rename the table", "ALTER TABLE d RENAME TO d2", "UPDATE {t} SET n = 1 WHERE id = 8"),
    (
        "replica identity full",
        "ALTER TABLE {t} REPLICA IDENTITY FULL",
        "UPDATE {t} SET n = 2 WHERE id = 9",
    ),
    (
        "add after the identity change",
        "ALTER TABLE {t} ADD COLUMN a4 int",
        "INSERT INTO {t} (id, v2) VALUES (1003, 'x')",
    ),
]


@contextlib.contextmanager
def _dropped_after(pg: Database, slot: str, *tables: str) -> Iterator[None]:
    """The test's slot and tables are dropped after it, whatever happened."""
    try:
        yield
    finally:
        pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
        pg.execute(f"DROP TABLE IF EXISTS {', '.join(tables)}")


def _table(step: int) -> str:
    renamed = next(i for i, s in enumerate(STEPS) if s[0] == "rename the table")
    return "d2" if step >= renamed else "d"


def _assert_equal(pg: Database, config: dict[str, Any], table: str, after: str) -> None:
    for spec in parse_config(config).targets():
        target = DeltaTarget(spec.path, spec.mode, app_id="pgcdc:test")
        compare = compare_mirror if spec.mode == "mirror" else compare_history
        verdict = compare(pg.dsn, f"public.{table}", target.to_arrow())
        assert verdict.equal, (
            f"after {after}: {spec.mode} {verdict} {verdict.missing} {verdict.extra}"
        )


def _pipeline(
    pg: Database, tmp_path: Path, table: str, rows: str, **trigger: Any
) -> tuple[str, dict[str, Any]]:
    """`table` (its CREATE TABLE) filled by `rows` (an INSERT), published, and the
    configuration of a pipeline that copies it into a mirror and a history: the slot's name
    and the configuration."""
    slot, publication = unique("ddl"), unique("pub")
    name = table.split()[2]
    pg.execute(f"{table}; {rows}; CREATE PUBLICATION {publication} FOR TABLE {name}")
    tables = {f"public.{name}": ["mirror", "history"]}
    config = pipeline_config(pg, slot, publication, tmp_path / "lake", tables, **trigger)
    config["source"]["create_slot"] = True
    return slot, config


@pytest.mark.parametrize("batches", ["a batch per step", "one batch for all"])
def test_ordinary_ddl_while_streaming(
    spark: Any, pg: Database, tmp_path: Path, batches: str
) -> None:
    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE d (id int PRIMARY KEY, v text, n int)",
        "INSERT INTO d SELECT g, 'v' || g, g FROM generate_series(1, 40) g",
    )
    with _dropped_after(pg, slot, "d", "d2"):
        run_pipeline(spark, config)  # the initial copy
        _assert_equal(pg, config, "d", "the copy")
        for i, (what, ddl, change) in enumerate(STEPS):
            pg.execute(ddl.format(t=_table(i - 1) if "RENAME TO" in ddl else _table(i)))
            pg.execute(change.format(t=_table(i)))
            if batches == "a batch per step":
                run_pipeline(spark, config)
                _assert_equal(pg, config, _table(i), what)
        run_pipeline(spark, config)
        _assert_equal(pg, config, _table(len(STEPS) - 1), "every step")


def test_a_column_read_per_key_whose_type_changed_since(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """A renamed column's values are read per key when its batch is applied; by then the
    source may hold them in another type, changed by a later transaction: they are not taken
    in the old type (they would not parse, or would be the later ones), the later batch's type
    change gives every row its value."""
    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE r (id int PRIMARY KEY, v int)",
        "INSERT INTO r SELECT g, g FROM generate_series(1, 20) g",
        max_changes_per_batch=1,  # a batch per transaction
    )
    with _dropped_after(pg, slot, "r"):
        run_pipeline(spark, config)
        pg.execute("BEGIN; ALTER TABLE r RENAME v TO w; UPDATE r SET w = 0 WHERE id = 1; COMMIT")
        pg.execute(
            "BEGIN; ALTER TABLE r ALTER w TYPE text USING 'x' || w;"
            "UPDATE r SET w = 'y' WHERE id = 2; COMMIT"
        )
        pipeline = run_pipeline(spark, config)
        assert pipeline.stats.batches == 2
        _assert_equal(pg, config, "r", "a rename, then a type change")


def test_a_new_key_some_rows_lack_stops_the_table_until_recopied(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """An identity column added (each row its own value, read per key when the batch is
    applied), made the primary key, and a row deleted by it, all before the batch: the row is
    gone when its value is read, so the target's row has none, and the delete (by the new
    key) cannot find it. The table stops with one line, the slot stays; a recopy mends it."""
    from pgcdc.pipeline import PipelineFailed, request_recopy

    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE s (id int PRIMARY KEY, v text)",
        "INSERT INTO s SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    with _dropped_after(pg, slot, "s"):
        run_pipeline(spark, config)
        pg.execute("ALTER TABLE s ADD COLUMN k int GENERATED ALWAYS AS IDENTITY")
        pg.execute("UPDATE s SET v = 'kept' WHERE id = 2")
        pg.execute("ALTER TABLE s DROP CONSTRAINT s_pkey, ADD PRIMARY KEY (k)")
        pg.execute("UPDATE s SET v = 'by k' WHERE k = 3; DELETE FROM s WHERE k = 5")
        with pytest.raises(PipelineFailed) as failed:
            run_pipeline(spark, config)
        line = str(failed.value)
        assert "public.s: rows are matched by (k) from" in line, line
        assert "1 row(s) of the target hold no value in it" in line and "recopy" in line
        request_recopy(parse_config(config), "public.s")
        run_pipeline(spark, config)
        _assert_equal(pg, config, "s", "the recopy")


def test_a_slot_behind_its_targets_sends_ddl_they_hold_again(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """The slot may send again transactions its targets applied long ago (a standby's copy
    of a failover slot is behind; so is a slot not confirmed before a crash), with DDL among
    them and more DDL since: the changes after the targets' watermark are read from what
    they recorded, not from the replayed transactions read against a catalog of later. Here
    a column is renamed and another added under its old name before the watermark, a change
    comes after it, and a column is added after that change."""
    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE w (id int PRIMARY KEY, v int, x int)",
        "INSERT INTO w SELECT g, g, g FROM generate_series(1, 20) g",
    )
    behind = unique("behind")
    with _dropped_after(pg, slot, "w"):
        run_pipeline(spark, config)
        pg.execute(f"SELECT pg_copy_logical_replication_slot('{slot}', '{behind}')")
        try:
            pg.execute("UPDATE w SET x = x + 100 WHERE id % 2 = 0")
            pg.execute("ALTER TABLE w RENAME x TO y; ALTER TABLE w ADD x int DEFAULT 7")
            pg.execute("UPDATE w SET y = -y, x = id WHERE id % 3 = 0")
            run_pipeline(spark, config)
            _assert_equal(pg, config, "w", "the DDL")
            pg.execute("UPDATE w SET y = 0, x = 0 WHERE id % 5 = 0")
            pg.execute("ALTER TABLE w ADD c int; UPDATE w SET c = 1 WHERE id = 1")
            # the slot goes back to before the DDL: the copy made then takes its place
            pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
            pg.execute(f"SELECT pg_copy_logical_replication_slot('{behind}', '{slot}')")
            run_pipeline(spark, config)
            _assert_equal(pg, config, "w", "the DDL sent again")
        finally:
            pg.execute(f"SELECT pg_drop_replication_slot('{behind}')")


def test_a_column_dropped_and_added_again_in_another_type_in_a_backlog(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """``ADD e int`` and a change with it, then ``DROP e; ADD e bigint`` with a volatile
    default (each row its own value) and a change, all read later as one backlog, with the
    catalog of after: the first message's ``e`` is the column now dropped, not the new one
    of its name (whose values, read as the first message's type, would mostly not fit)."""
    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE x (id int PRIMARY KEY, v int)",
        "INSERT INTO x SELECT g, g FROM generate_series(1, 30) g",
    )
    with _dropped_after(pg, slot, "x"):
        run_pipeline(spark, config)
        pg.execute("ALTER TABLE x ADD COLUMN e int DEFAULT 5")
        pg.execute("UPDATE x SET v = -v WHERE id % 3 = 0")
        pg.execute(
            "ALTER TABLE x DROP COLUMN e; "
            "ALTER TABLE x ADD COLUMN e bigint DEFAULT (random() * 1e12)::bigint"
        )
        pg.execute("UPDATE x SET v = 0 WHERE id % 5 = 0")
        run_pipeline(spark, config)
        _assert_equal(pg, config, "x", "the backlog")


def test_an_identity_index_a_schema_move_constraints_and_rewrites(
    spark: Any, pg: Database, tmp_path: Path
) -> None:
    """Rows matched by a unique index's column (`REPLICA IDENTITY USING INDEX`, its key
    changed), the table moved to another schema and back (followed by OID), constraints and
    defaults set and dropped, a rewrite without a change (`CLUSTER`), and the index's column
    dropped with the identity back to the primary key."""
    slot, config = _pipeline(
        pg,
        tmp_path,
        "CREATE TABLE q (id int PRIMARY KEY, u int NOT NULL, v text)",
        "INSERT INTO q SELECT g, g + 100, 'v' || g FROM generate_series(1, 20) g",
    )
    with _dropped_after(pg, slot, "q", "other.q"):
        run_pipeline(spark, config)
        pg.execute(
            "CREATE UNIQUE INDEX q_u ON q (u); ALTER TABLE q REPLICA IDENTITY USING INDEX q_u"
        )
        pg.execute(
            "UPDATE q SET v = 'x' WHERE id = 3; UPDATE q SET u = 500 WHERE id = 4;"
            "DELETE FROM q WHERE id = 5"
        )
        run_pipeline(spark, config)
        _assert_equal(pg, config, "q", "identity by index")
        pg.execute("CREATE SCHEMA IF NOT EXISTS other; ALTER TABLE q SET SCHEMA other")
        pg.execute(
            "UPDATE other.q SET v = 'y' WHERE id = 6; INSERT INTO other.q VALUES (99, 999, 'n')"
        )
        run_pipeline(spark, config)
        pg.execute("ALTER TABLE other.q SET SCHEMA public")
        _assert_equal(pg, config, "q", "set schema")
        pg.execute(
            "ALTER TABLE q ALTER COLUMN v SET NOT NULL, ALTER COLUMN v SET DEFAULT 'd',"
            "ADD CONSTRAINT c CHECK (u > 0)"
        )
        pg.execute(
            "INSERT INTO q (id, u) VALUES (100, 1000); ALTER TABLE q ALTER COLUMN v DROP DEFAULT"
        )
        pg.execute("CLUSTER q USING q_pkey")
        pg.execute("UPDATE q SET v = 'z' WHERE id = 7")
        run_pipeline(spark, config)
        _assert_equal(pg, config, "q", "constraints and rewrites")
        pg.execute("ALTER TABLE q DROP COLUMN u, REPLICA IDENTITY DEFAULT")
        pg.execute("UPDATE q SET v = 'w' WHERE id = 8")
        run_pipeline(spark, config)
        _assert_equal(pg, config, "q", "dropped the identity index's column")
