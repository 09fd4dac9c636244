"""The pipeline on real clusters started from the pyspark wheel (tests/clusters): a standalone
master with two one-core workers, and a Spark Connect server, each with a private /tmp.

On each, `pgcdc run`'s pipeline runs in a process of its own with ``[spark]`` pointing at the
cluster (``master``) or the server (``remote``): the initial copy (chunks read by the
executors from PostgreSQL), streaming with DDL (every batch a Spark job:
``inline_max_changes = 0``), a table quarantined by a change its target cannot take, a
``kill -9`` of the pipeline's whole process group between a batch's Delta commits and the slot
confirm, a restart that skips what the targets hold, and a recopy of the quarantined table
while the others stream (on the standalone cluster, run by ``spark-submit`` with pgcdc's
script); every target ends equal to its source. The driver's spool lives in
its own /tmp, which the executors cannot see (the probe says so): the changes reached them
inside their work.

The lake is under ``WORK_ROOT`` (/var/tmp), storage that the driver and the executors share,
as they would share an object store.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgcdc.spark.submit as submit
from clusters.spark import (
    WORK_ROOT,
    ConnectServer,
    StandaloneCluster,
    private_tmp_supported,
    spark_env,
    spark_home,
)
from pgcdc.embedded import Database
from pgcdc.pipeline import InitialCopy, Quarantine, request_recopy
from pgcdc.pipeline.config import parse_config
from pgcdc.storage import open_file_io
from replication.helpers import unique
from spark.helpers import assert_identical, pipeline_config, verdicts

pytestmark = [pytest.mark.server, pytest.mark.parametrize("pg_server", [18], indirect=True)]

CHILD = Path(__file__).with_name("pipeline_child.py")
#: A run of the pipeline on a loaded 2-core machine (its session's start included).
RUN_TIMEOUT = 420

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text);
CREATE TABLE b (id int PRIMARY KEY, n bigint);
CREATE TABLE q (id int PRIMARY KEY, n int);
INSERT INTO a SELECT g, repeat('a', 200) || g FROM generate_series(1, 3000) g;
INSERT INTO b SELECT g, g FROM generate_series(1, 500) g;
INSERT INTO q SELECT g, g FROM generate_series(1, 20) g;
"""
TABLES = {
    "public.a": ["mirror", "history"],
    "public.b": ["mirror", "changelog"],
    "public.q": {"modes": ["mirror"], "on_error": "quarantine"},
}


class Child:
    """`pipeline_child.py` in a process group of its own, its output lines read as they
    come."""

    def __init__(self, config: dict[str, Any], log: Path, *flag: str) -> None:
        self.log = log
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), json.dumps(config), *flag],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
                env={**os.environ, **spark_env()},
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = RUN_TIMEOUT) -> str:
        """The next output line starting with `prefix`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(
            f"no line {prefix!r} from the pipeline (exit {self.proc.poll()}); it said "
            f"{self.seen[-5:]}; its stderr ends:\n{_tail(self.log)}"
        )

    def finish(self, timeout: float = RUN_TIMEOUT) -> int:
        """Its exit status, once it ended; its remaining lines are in `seen`."""
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the pipeline did not end; stderr:\n{_tail(self.log)}") from None
        time.sleep(0.2)  # the reader's last lines
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return status

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def lake() -> Iterator[Path]:
    """A lake the driver and the executors both see (not under the private /tmp)."""
    path = Path(tempfile.mkdtemp(prefix="pgcdc-lake-", dir=WORK_ROOT))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_to_the_end(config: dict[str, Any], log: Path) -> list[str]:
    """A run that catches up (available-now) and stops cleanly; its output lines."""
    child = Child(config, log)
    status = child.finish()
    assert status == 0, f"the pipeline failed ({status}):\n{_tail(log)}"
    assert child.seen[-1] == "caught up", child.seen
    return child.seen


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    pairs = (f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
    return "{ " + ", ".join(pairs) + " }"


def toml_text(config: dict[str, Any]) -> str:
    """`config` (as parsed TOML) written as TOML: sections, inline tables below them."""
    scalars = {k: v for k, v in config.items() if not isinstance(v, dict)}
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in scalars.items()]
    for section, values in config.items():
        if section not in scalars:
            lines.append(f"[{section}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def spark_submit(cluster: StandaloneCluster, config: dict[str, Any], logs: Path) -> list[str]:
    """The pipeline run by ``spark-submit`` on `cluster`, through pgcdc's script
    (`pgcdc.spark.submit`), to its end (available-now); its output lines."""
    path = logs / "pipeline.toml"
    path.write_text(toml_text({k: v for k, v in config.items() if k != "spark"}))
    conf = cluster.driver_conf("pgcdc-spark-submit")
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", conf.pop("spark.master")]
    argv += ["--name", conf.pop("spark.app.name")]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    with open(logs / "spark-submit.log", "w") as stderr:
        done = subprocess.run(
            [*argv, submit.__file__, str(path)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=RUN_TIMEOUT,
            env={**os.environ, **spark_env()},
            start_new_session=True,
        )
    assert done.returncode == 0, f"spark-submit failed:\n{_tail(logs / 'spark-submit.log')}"
    lines = done.stdout.splitlines()
    assert lines and lines[-1].startswith("Stopped cleanly after "), lines
    return lines


def scenario(
    db: Database,
    spark: dict[str, Any],
    lake: Path,
    logs: Path,
    private_tmp: bool,
    cluster: StandaloneCluster | None = None,
) -> None:
    """See the module (with `cluster`, the last run is ``spark-submit``'s on it)."""
    db.execute(SCHEMA)
    slot, publication = unique("cluster"), unique("pub")
    db.execute(f"CREATE PUBLICATION {publication} FOR TABLE a, b, q")
    config = pipeline_config(db, slot, publication, lake, TABLES, inline_max_changes=0)
    config["source"]["create_slot"] = True
    config["snapshot"] = {"chunk_blocks": 16}  # a's 3,000 rows: several chunks
    config["spark"] = spark
    state = open_file_io(parse_config(config).state_path)

    # 1. Copy, stream, and die with the whole process group after the second batch's
    #    commits, before its slot confirm.
    continuous = {**config, "trigger": {**config["trigger"], "available_now": False}}
    continuous["trigger"]["interval"] = "0.3 seconds"
    first = Child(continuous, logs / "run-1.log", "--kill-group-after-batches", "2")
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while InitialCopy.status_of(state) != "done":
            assert first.proc.poll() is None, f"the copy failed:\n{_tail(first.log)}"
            assert time.monotonic() < deadline, "the initial copy did not finish"
            time.sleep(0.5)
        db.execute("UPDATE a SET v = 'one' WHERE id <= 100; INSERT INTO b VALUES (501, 501)")
        first.wait_for("batch 0")
        probe = json.loads(first.wait_for("probe ").removeprefix("probe "))
        db.execute(
            "ALTER TABLE a ADD COLUMN w int DEFAULT 7;"
            "UPDATE a SET w = 8, v = 'two' WHERE id BETWEEN 50 AND 150;"
            "DELETE FROM b WHERE id <= 10; ALTER TABLE b ADD COLUMN note text;"
            "UPDATE b SET note = 'n' || id WHERE id <= 40;"
            # a key type change the mirror cannot follow: q is set aside, the others go on
            "ALTER TABLE q ALTER id TYPE text USING 'k' || id; UPDATE q SET n = 30 WHERE id = 'k3'"
        )
        first.wait_for("batch 1")
        assert first.finish() == -signal.SIGKILL
    finally:
        first.kill()
    assert probe["driver"], probe
    if private_tmp:  # the executors do not see the driver's /tmp, where its spool is
        assert probe["spool"].startswith(tempfile.gettempdir()), probe
        assert probe["tasks"] and not any(probe["tasks"]), probe

    # 2. While it is down, more changes; the restart replays the killed batch (skipped) and
    #    catches up; q stays quarantined.
    db.execute("UPDATE a SET v = 'three' WHERE id > 2900; INSERT INTO b VALUES (600, 600, 'x')")
    db.execute("UPDATE q SET n = 40 WHERE id = 'k4'")
    lines = run_to_the_end(config, logs / "run-2.log")
    skipped = sum(int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("batch "))
    assert skipped > 0, f"the killed batch's changes were not skipped: {lines}"
    records = Quarantine(state).records()
    assert records["public.q"].status == "quarantined", records
    others = {k: v for k, v in TABLES.items() if k != "public.q"}
    results = verdicts(db, {**config, "tables": others})
    assert results and all(v.equal for v in results), [str(v) for v in results]

    # 3. The quarantined table copied again while the others stream: all equal.
    request_recopy(parse_config(config), "public.q")
    db.execute("UPDATE q SET n = 60 WHERE id = 'k6'; UPDATE b SET n = -1 WHERE id = 600")
    if cluster is not None:
        spark_submit(cluster, config, logs)
    else:
        run_to_the_end(config, logs / "run-3.log")
    assert Quarantine(state).records() == {}
    assert_identical(db, config)
    if not private_tmp:
        pytest.skip(
            "all equal, but no proof that the tasks did without the driver's files: "
            f"the workers share its /tmp ({private_tmp_supported()})"
        )


def test_the_pipeline_on_a_standalone_cluster(
    standalone_cluster: StandaloneCluster, pg: Database, lake: Path, tmp_path: Path
) -> None:
    conf = standalone_cluster.driver_conf("pgcdc-cluster-pipeline")
    master = conf.pop("spark.master")
    del conf["spark.app.name"]
    spark = {"master": master, "conf": conf}
    scenario(pg, spark, lake, tmp_path, standalone_cluster.private_tmp, standalone_cluster)


def test_the_pipeline_on_a_spark_connect_server(
    connect_server: ConnectServer, pg: Database, lake: Path, tmp_path: Path
) -> None:
    scenario(pg, {"remote": connect_server.url}, lake, tmp_path, connect_server.private_tmp)
