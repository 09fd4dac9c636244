"""The pipeline survives a failover (PostgreSQL 17+): its slot is a failover slot
(``[source] failover = true``) synchronized to a physical standby made with pg_basebackup;
under a steady write load the primary stops and the standby is promoted; with a multi-host
conninfo asking for the read-write server, the pipeline reconnects to the new primary and
goes on, and every target equals the new primary's table: nothing lost, nothing duplicated."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.embedded import EmbeddedServer, available_versions
from replication.helpers import wait_for
from replication.test_failover import Writer, synced_slot
from spark.helpers import assert_identical, pipeline_config

pytestmark = pytest.mark.server


@pytest.fixture
def primary() -> Iterator[EmbeddedServer]:
    if 18 not in available_versions():
        pytest.skip("PostgreSQL 18 not installed")
    with EmbeddedServer(18) as server:
        yield server


class Source:
    """What `assert_identical` needs of a database: its conninfo."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn


def test_the_pipeline_goes_on_after_a_standby_is_promoted(
    spark: Any, primary: EmbeddedServer, tmp_path: Path
) -> None:
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import parse_config

    db = primary.create_database()
    db.execute("CREATE TABLE t (batch int, i int, PRIMARY KEY (batch, i)); CREATE TABLE c (n int)")
    db.execute("INSERT INTO t SELECT 0, g FROM generate_series(1, 100) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    with primary.start_standby(dbname=db.dbname) as standby:
        both = (
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
            f"dbname={db.dbname} target_session_attrs=read-write connect_timeout=5"
        )
        config = pipeline_config(
            db, "fo_slot", "pub", tmp_path / "lake", {"public.t": ["mirror", "history"]}
        )
        config["source"].update(conninfo=both, create_slot=True, failover=True)
        config["trigger"] = {"available_now": False, "interval": "0.3 seconds"}
        pipeline = Pipeline(parse_config(config), spark)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                pipeline.run()
            except BaseException as exc:
                failure.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        writer = Writer(both)
        runner.start()
        writer.start()
        try:
            wait_for(lambda: pipeline.stats.batches > 0 or failure, timeout=120, what="a batch")
            assert not failure, failure

            # the standby's copy of the slot becomes persistent once the slot decodes a
            # running-transactions record past what the standby guarantees
            def ready() -> bool:
                row = synced_slot(standby, "fo_slot")
                if row and row[0] and not row[1]:
                    return True
                db.execute("SELECT pg_log_standby_snapshot()")
                return False

            wait_for(ready, timeout=90, interval=0.5, what="a persistent copy on the standby")
            wait_for(lambda: len(writer.acked) >= 100, timeout=60, what="100 commits")
            db.close()
            primary.stop("fast")
            standby.promote()
            promoted_at = len(writer.acked)
            wait_for(lambda: len(writer.acked) >= promoted_at + 100, timeout=60, what="commits")
        finally:
            writer.stopping.set()
            writer.join(30)
        assert writer.error is None and writer.failures > 0
        new_primary = Source(standby.dsn_for(db.dbname))
        acked = set(writer.acked)

        def caught_up() -> bool:
            assert not failure, failure
            with psycopg.connect(new_primary.dsn) as conn:
                count = conn.execute("SELECT count(DISTINCT batch) FROM t").fetchone()
            from pgcdc.targets import DeltaTarget

            mirror = DeltaTarget(str(tmp_path / "lake" / "public.t"), "mirror", app_id="pgcdc:test")
            batches = set(mirror.to_arrow().column("batch").to_pylist()) if mirror.exists else set()
            return count is not None and len(batches) >= count[0] and acked <= batches

        try:
            wait_for(caught_up, timeout=120, interval=1, what="the mirror to hold every batch")
            time.sleep(1)  # a batch in flight lands
        finally:
            pipeline.stop()
            runner.join(120)
        assert not failure, failure
        assert_identical(new_primary, config)  # type: ignore[arg-type]
