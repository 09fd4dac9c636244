"""The building blocks of pgcdc on a cluster, each proven on real servers started here: a
standalone Spark cluster and a Spark Connect server from the pyspark wheel (work items
dispatched with mapInArrow, Python workers reused between jobs, executors that cannot read
the driver's temporary files), and delta-rs on an S3 API (moto) and on Azure Blob
(Azurite): create, append, merge, read, state files, and commits that two writers cannot
both make at the same version."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pgcdc

from .deltaops import race_appends, stale_append
from .jobs import DIGEST_SCHEMA, READ_SCHEMA, digest_items, dispatch, read_paths
from .objectstores import MotoS3, state_filesystem
from .spark import TESTS_DIR, ConnectServer, StandaloneCluster

DRIVER_TIMEOUT = 300


def run_driver(spec: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Run ``clusters.driver`` in a child process; its JSON answer."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "clusters.driver", str(spec_file)],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(TESTS_DIR)},
    )
    assert done.returncode == 0, f"driver failed:\n{done.stderr[-4000:]}"
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def assert_digests(rows: list[dict[str, Any]], expected: dict[str, str], driver_pid: int) -> None:
    assert {str(r["id"]): r["sha256"] for r in rows} == expected
    assert all(r["pid"] != driver_pid for r in rows)
    assert {r["pgcdc"] for r in rows} == {pgcdc.__file__}, "executors import another pgcdc"


def assert_workers_reused(rounds: list[list[dict[str, Any]]]) -> None:
    """The second job ran in Python workers of the first, which kept their module state."""
    first = {r["pid"]: r["worker_batches"] for r in rounds[0]}
    for row in rounds[1]:
        assert row["pid"] in first, f"job 2 ran in a new Python worker {row['pid']}: {first}"
        assert row["worker_batches"] > first[row["pid"]]


# --- standalone cluster -----------------------------------------------------------------


def test_standalone_cluster_runs_map_in_arrow_on_the_workers(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    sizes = [10, 1000, 1_000_000, 3]
    answer = run_driver(
        {"conf": standalone_cluster.driver_conf(), "job": "digest", "sizes": sizes, "rounds": 2},
        tmp_path,
    )
    for rows in answer["rounds"]:
        assert_digests(rows, answer["expected"], answer["driver_pid"])
        assert {r["size"] for r in rows} == set(sizes)
        for row in rows:  # each task ran in a worker's own directories
            assert row["cwd"].startswith(str(standalone_cluster.work_root / "worker-"))
            assert row["tmpdir"].startswith(str(standalone_cluster.work_root / "worker-"))
    assert_workers_reused(answer["rounds"])


def test_standalone_workers_cannot_read_the_driver_tmp(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    if not standalone_cluster.private_tmp:
        pytest.skip("no private /tmp for the workers here (unshare --mount not permitted)")
    readable = Path(pgcdc.__file__)  # on every node, like the installed code
    answer = run_driver(
        {"conf": standalone_cluster.driver_conf(), "job": "read", "paths": [str(readable)]},
        tmp_path,
    )
    outcomes = {r["path"]: r["outcome"] for r in answer["rows"]}
    assert answer["secret"].startswith(tempfile.gettempdir())
    assert answer["driver_reads"]
    assert outcomes[answer["secret"]] == "FileNotFoundError"
    assert outcomes[str(readable)] == f"read {readable.stat().st_size} bytes"


# --- Spark Connect ------------------------------------------------------------------------


@pytest.fixture
def remote(connect_server: ConnectServer) -> Any:
    """A Spark Connect client session in the test's process (no JVM here). Making one marks
    the whole process as a Connect client (pyspark sets SPARK_CONNECT_MODE_ENABLED for good):
    the mark is taken back afterwards, or the later tests' classic session finds no session."""
    from pyspark.sql import SparkSession

    marks = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
    before = {name: os.environ.get(name) for name in marks}
    session = SparkSession.builder.remote(connect_server.url).create()
    yield session
    session.stop()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_connect_runs_map_in_arrow(remote: Any, connect_server: ConnectServer) -> None:
    items = [(i, os.urandom(size)) for i, size in enumerate([5, 2000, 3_000_000])]
    expected = {str(i): hashlib.sha256(p).hexdigest() for i, p in items}
    rounds = [dispatch(remote, items, digest_items, DIGEST_SCHEMA).to_pylist() for _ in range(2)]
    for rows in rounds:
        assert_digests(rows, expected, os.getpid())
        assert all(r["tmpdir"].startswith(str(connect_server.work_root)) for r in rows)
    assert_workers_reused(rounds)


def test_connect_server_cannot_read_the_client_tmp(
    remote: Any, connect_server: ConnectServer, tmp_path: Path
) -> None:
    if not connect_server.private_tmp:
        pytest.skip("no private /tmp for the Connect server here (unshare --mount not permitted)")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"client only")
    rows = dispatch(remote, [(1, str(secret).encode())], read_paths, READ_SCHEMA).to_pylist()
    assert str(secret).startswith(tempfile.gettempdir())
    assert rows[0]["outcome"] == "FileNotFoundError"


def test_connect_session_has_no_spark_context(remote: Any) -> None:
    """Why the pipeline must not use RDDs: the Connect client has no SparkContext."""
    from pyspark.errors import PySparkAttributeError

    with pytest.raises(PySparkAttributeError, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        _ = remote.sparkContext


# --- object stores ------------------------------------------------------------------------

STORES = ["moto_s3", "azurite"]


@pytest.fixture(params=STORES, ids=["s3", "azure"])
def store(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


def test_delta_create_append_merge_read(store: Any) -> None:
    from deltalake import DeltaTable, write_deltalake

    options = store.storage_options
    uri = f"{store.new_root()}/mirror/public.items"
    first = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    write_deltalake(uri, first, storage_options=options)
    write_deltalake(
        uri,
        pa.table({"id": pa.array([4], pa.int64()), "v": ["d"]}),
        mode="append",
        storage_options=options,
    )
    changes = pa.table(
        {"id": pa.array([2, 3, 5], pa.int64()), "v": ["B", None, "e"], "op": ["u", "d", "i"]}
    )
    table = DeltaTable(uri, storage_options=options)
    metrics = (
        table.merge(changes, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete("s.op = 'd'")
        .when_matched_update({"v": "s.v"})
        .when_not_matched_insert({"id": "s.id", "v": "s.v"})
        .execute()
    )
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_deleted"]) == (1, 1)
    assert metrics["num_target_rows_inserted"] == 1
    reread = DeltaTable(uri, storage_options=options)
    assert reread.version() == 2
    assert reread.to_pyarrow_table().sort_by("id").to_pylist() == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "B"},
        {"id": 4, "v": "d"},
        {"id": 5, "v": "e"},
    ]


def test_a_stale_writer_commits_the_next_version(store: Any) -> None:
    version, keys = stale_append(f"{store.new_root()}/t", store.storage_options)
    assert (version, keys) == (2, [0, 1, 2])


def test_a_writer_that_lost_the_race_retries(store: Any) -> None:
    """delta-rs 1.6 writes ``_delta_log/N.json`` with ``If-None-Match: *``: of the writers
    that all read version 0, each commits a version of its own (none is lost or shared)."""
    race = race_appends(f"{store.new_root()}/t", store.storage_options, writers=4)
    assert race.errors == []
    assert (race.version, race.keys) == (4, [0, 1, 2, 3, 4])


def test_a_store_without_conditional_writes_loses_commits(cluster_logs: Path) -> None:
    """The negative control of the test above: it can fail. When the server ignores
    ``If-None-Match``, racing writers overwrite each other's ``_delta_log`` entries and
    commits are lost, though every writer was told it succeeded. (delta-rs looks for a
    newer version before it writes, so a writer whose snapshot is merely stale is caught
    even then: only a race shows the difference.)"""
    server = MotoS3(log_dir=cluster_logs / "moto-unsafe", ignore_conditional_writes=True)
    server.start()
    try:
        races = []
        for _ in range(3):  # a race can come out clean by luck; three in a row do not
            race = race_appends(f"{server.new_root()}/t", server.storage_options, writers=6)
            races.append(race)
            if race.keys != list(range(7)):
                break
    finally:
        server.stop()
    assert all(race.errors == [] for race in races)
    assert races[-1].keys != list(range(7)), "no commit was lost in three races"
    assert races[-1].version < 6


def test_state_files_beside_the_tables(store: Any) -> None:
    fs = state_filesystem(store.new_root(), store.storage_options)
    assert fs.get_file_info("state/pipeline.json").type.name == "NotFound"
    for lsn in ("0/16B3748", "0/16B37A0"):
        with fs.open_output_stream("state/pipeline.json") as f:
            f.write(json.dumps({"confirmed_lsn": lsn}).encode())
    with fs.open_input_stream("state/pipeline.json") as f:
        assert json.loads(f.read()) == {"confirmed_lsn": "0/16B37A0"}
    import pyarrow.fs as pafs

    assert [i.path for i in fs.get_file_info(pafs.FileSelector("state"))] == ["state/pipeline.json"]
    fs.delete_file("state/pipeline.json")
    assert fs.get_file_info("state/pipeline.json").type.name == "NotFound"
