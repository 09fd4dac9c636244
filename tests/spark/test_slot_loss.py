"""A slot lost for real (invalidated by max_slot_wal_keep_size while the pipeline was stopped):
the pipeline stops with one line, or, with recover_lost_slot, copies every table under a new
slot, reconciles each target with it (only what differs changes; a history gets versions for
exactly those rows) and streams on from there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import EmbeddedServer, EmbeddedServerError
from pgcdc.replication.slots import get_slot
from pgcdc.targets import DeltaTarget
from spark.helpers import assert_identical, pipeline_config, run_pipeline

pytestmark = pytest.mark.server

VERSION = 18


def _invalidate(db: Any, slot: str) -> None:
    """WAL the slot may not keep (an unpublished table's), then checkpoints: it is lost."""
    for _ in range(40):
        db.execute("INSERT INTO filler SELECT g, repeat('x', 500) FROM generate_series(1, 3000) g")
        db.execute("SELECT pg_switch_wal()")
        db.execute("CHECKPOINT")
        if get_slot(db.dsn, slot).invalidated:
            return
    raise AssertionError(f"slot {slot} still valid: {get_slot(db.dsn, slot)}")


def test_a_lost_slot_stops_the_pipeline_or_is_recovered(spark: Any, tmp_path: Path) -> None:
    from pgcdc.pipeline import SlotLost

    settings = {"max_slot_wal_keep_size": "2MB", "wal_keep_size": 0, "max_wal_size": "64MB"}
    try:
        server = EmbeddedServer(VERSION, settings=settings).start()
    except EmbeddedServerError as exc:
        pytest.skip(f"PostgreSQL {VERSION} does not start here: {exc}")
    try:
        db = server.create_database()
        db.execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE f (x int, y text);"
            "ALTER TABLE f REPLICA IDENTITY FULL; CREATE TABLE filler (id int, pad text);"
            "CREATE PUBLICATION lost_pub FOR TABLE t, f"
        )
        db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g")
        db.execute("INSERT INTO f SELECT g % 20, 'y' FROM generate_series(1, 60) g")
        lake = tmp_path / "lake"
        tables = {"public.t": ["mirror", "history"], "public.f": ["mirror", "history"]}
        config = pipeline_config(db, "lost_slot", "lost_pub", lake, tables)
        config["source"]["create_slot"] = True
        run_pipeline(spark, config)
        db.execute("UPDATE t SET v = 'streamed' WHERE id <= 10; DELETE FROM f WHERE x = 1")
        run_pipeline(spark, config)
        assert_identical(db, config)
        # the pipeline is stopped; the source changes and the slot is invalidated
        db.execute("UPDATE t SET v = 'while lost' WHERE id BETWEEN 100 AND 119")
        db.execute("DELETE FROM t WHERE id > 290; INSERT INTO t VALUES (1000, 'new')")
        db.execute("DELETE FROM f WHERE x = 2; INSERT INTO f VALUES (99, 'z'), (99, 'z')")
        _invalidate(db, "lost_slot")
        with pytest.raises(SlotLost, match=r'slot "lost_slot" was invalidated \(.*recover_lost'):
            run_pipeline(spark, config)
        config["source"]["recover_lost_slot"] = True
        run_pipeline(spark, config)
        assert_identical(db, config)
        slot = get_slot(db.dsn, "lost_slot")
        assert not slot.invalidated
        history = DeltaTarget(str(lake / "public.t__history"), "history", app_id="pgcdc:test")
        versions: dict[int, int] = {}
        for row in history.to_arrow().to_pylist():
            versions[row["id"]] = versions.get(row["id"], 0) + 1
        assert versions[50] == 1  # unchanged while lost: no new version
        assert versions[105] == 2 and versions[1000] == 1 and versions[295] == 1
        # and it streams on from the new slot
        time.sleep(0.1)
        db.execute("UPDATE t SET v = 'after' WHERE id = 1; INSERT INTO f VALUES (7, 'after')")
        run_pipeline(spark, config)
        assert_identical(db, config)
    finally:
        server.stop("immediate")
