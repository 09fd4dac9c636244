"""Spark Declarative Pipelines: examples/sdp, run by ``spark-pipelines run`` (which starts a
Spark Connect server of its own), streams a slot's changes through the ``pgoutput`` source
into the ``pgcdc`` sink's mirror, history and change log targets. Every run exits 0 (pyspark
4.3's UNKNOWN_RESPONSE is worked around by `pgcdc.spark.sdp.register`), a run killed with its
server right after the sink's commit is replayed and skipped, and the targets end equal to
their source, each change once."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from clusters.spark import spark_env
from pgcdc.embedded import Database
from pgcdc.pipeline.verify import compare_history, compare_mirror
from pgcdc.targets import DeltaTarget
from replication.helpers import unique

pytestmark = [pytest.mark.server, pytest.mark.parametrize("pg_server", [18], indirect=True)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "sdp"
CRASH = Path(__file__).with_name("sdp_crash.py")
#: One `spark-pipelines run` (a JVM and a Connect server start) on a loaded 2-core machine.
RUN_TIMEOUT = 300
TABLES = ("public.items", "public.tags")


def spark_pipelines(project: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    command = Path(sys.executable).with_name("spark-pipelines")
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(command), "run"],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def run(project: Path, env: dict[str, str], log: Path) -> None:
    """One run, to its end: exit status 0."""
    proc = spark_pipelines(project, env, log)
    try:
        status = proc.wait(RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"spark-pipelines run hung:\n{_tail(log)}") from None
    assert status == 0, f"spark-pipelines run exited {status}:\n{_tail(log)}"
    assert "Run is COMPLETED" in log.read_text(), _tail(log)


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def items_mirror(lake: Path) -> DeltaTarget:
    return DeltaTarget(str(lake / "public.items"), "mirror", app_id="pgcdc:sdp-example")


def assert_targets_equal(db: Database, lake: Path) -> None:
    for table in TABLES:
        mirror = DeltaTarget(str(lake / table), "mirror", app_id="pgcdc:sdp-example")
        verdict = compare_mirror(db.dsn, table, mirror.to_arrow())
        assert verdict.equal, f"{verdict} missing={verdict.missing} extra={verdict.extra}"
        history = DeltaTarget(str(lake / f"{table}__history"), "history", app_id="x")
        verdict = compare_history(db.dsn, table, history.to_arrow())
        assert verdict.equal, f"{verdict} missing={verdict.missing} extra={verdict.extra}"
        log = DeltaTarget(str(lake / f"{table}__changelog"), "changelog", app_id="x").to_arrow()
        sequence = log.column("sequence").to_pylist()
        assert len(set(map(tuple, (s.values() for s in sequence)))) == len(sequence), table


def test_the_sdp_example_streams_into_pgcdc_sinks_exactly_once(
    pg: Database, tmp_path: Path
) -> None:
    pg.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10, 2));"
        "CREATE TABLE tags (item int, tag text, PRIMARY KEY (item, tag))"
    )
    slot, publication = unique("sdp"), unique("pub")
    pg.execute(f"CREATE PUBLICATION {publication} FOR TABLE items, tags")
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("lake"))
    spec = project / "spark-pipeline.yml"
    storage = f"storage: {(tmp_path / 'storage').as_uri()}"
    spec.write_text(re.sub(r"(?m)^storage: .*$", storage, spec.read_text()))
    lake = tmp_path / "lake"
    env = {
        **os.environ,
        **spark_env(),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PGCDC_CONNINFO": pg.dsn,
        "PGCDC_PUBLICATION": publication,
        "PGCDC_SLOT": slot,
        "PGCDC_LAKE": str(lake),
    }

    # 1. What committed before a run is its batch (the slot exists: the sink has no copy).
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(
        "INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 200) g;"
        "INSERT INTO tags SELECT g, t FROM generate_series(1, 50) g, "
        "unnest(ARRAY['new', 'sale']) t"
    )
    pg.execute("UPDATE items SET price = price * 2 WHERE id <= 50")
    pg.execute("DELETE FROM items WHERE id > 190")
    run(project, env, tmp_path / "run-1.log")
    assert_targets_equal(pg, lake)

    # 2. DDL, then a run whose server dies right after the sink's commit, before Spark
    #    records the batch: the next run runs the same batch again and the targets skip it.
    pg.execute(
        "ALTER TABLE items ADD COLUMN stock int DEFAULT 5;"
        "UPDATE items SET stock = id, name = upper(name) WHERE id <= 20;"
        "DELETE FROM tags WHERE tag = 'sale' AND item > 25"
    )
    shutil.copy(CRASH, project / "transformations" / "zz_crash.py")
    marker = tmp_path / "crash"
    marker.touch()
    crashing = spark_pipelines(
        project, {**env, "PGCDC_SDP_CRASH": str(marker)}, tmp_path / "run-2.log"
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not Path(f"{marker}.done").exists():  # (the client hangs once its server died)
            assert crashing.poll() is None, f"run 2 ended:\n{_tail(tmp_path / 'run-2.log')}"
            assert time.monotonic() < deadline, "the sink's crash never came"
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        os.killpg(crashing.pid, signal.SIGKILL)
        crashing.wait(30)
    (project / "transformations" / "zz_crash.py").unlink()
    stock = {r["stock"] for r in items_mirror(lake).to_arrow().to_pylist()}
    assert stock >= {5, 20}, "the crashed run's commit is not in the targets"
    (checkpoint,) = (tmp_path / "storage").glob("_checkpoints/lake/*/*")
    planned = {p.name for p in (checkpoint / "offsets").glob("[0-9]*")}
    done = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
    assert planned - done == {Path(f"{marker}.done").read_text()}, (planned, done)
    pg.execute("UPDATE items SET stock = 0 WHERE id = 7")
    run(project, env, tmp_path / "run-3.log")  # that batch again (skipped), then the update
    assert_targets_equal(pg, lake)
    rows = DeltaTarget(str(lake / "public.items__changelog"), "changelog", app_id="x").to_arrow()
    assert pc.sum(pc.equal(rows.column("op"), "insert")).as_py() == 200
    assert {r["id"]: r["stock"] for r in items_mirror(lake).to_arrow().to_pylist()}[7] == 0
