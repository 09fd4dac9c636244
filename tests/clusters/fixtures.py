"""pytest fixtures for real clusters and object stores, each started on first use and stopped
at the end of the session: ``standalone_cluster``, ``connect_server``, ``moto_s3``,
``azurite``. Their logs stay under pytest's base temporary directory (``cluster_logs``).

``tests/conftest.py`` registers this module as a plugin (``pytest_plugins``), so every test
of the suite shares these servers; a failed test that used one of them gets the servers' last
log lines (and the executors' stderr) in its report.

Resources on this 2-core machine: the standalone cluster is a master and two workers (JVMs
of 384 MB heap) whose executors get 1 GB each while an application runs; the Connect server
is one JVM (1 GB heap) running ``local[2]``. A standalone application holds the workers'
only cores while it lives: two drivers on the cluster at once run one after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .objectstores import Azurite, MotoS3
from .processes import ServerProcess, StartError, tail
from .spark import ConnectServer, StandaloneCluster, private_tmp_supported

T = TypeVar("T")

__all__ = ["azurite", "cluster_logs", "connect_server", "moto_s3", "standalone_cluster"]


@pytest.fixture(scope="session")
def cluster_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logs of every server these fixtures start (kept by pytest's temp retention)."""
    return tmp_path_factory.mktemp("cluster-logs", numbered=False)


def _started(start: Callable[[], T]) -> T:
    """``start()``, or the test fails with the server's own last log lines (no traceback)."""
    try:
        return start()
    except StartError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def standalone_cluster(cluster_logs: Path) -> Iterator[StandaloneCluster]:
    """A standalone master and two one-core workers on 127.0.0.1. Each worker has its own
    working directory and TMPDIR and, where ``unshare --mount`` works (root, or a user
    namespace), a private empty /tmp: its executors cannot read the driver's temporary
    files. ``cluster.private_tmp`` says which. Drive it from a child process
    (``clusters.driver``): a classic session needs a JVM of its own."""
    cluster = _started(
        StandaloneCluster(
            log_dir=cluster_logs / "standalone", private_tmp=private_tmp_supported() is None
        ).start
    )
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def connect_server(cluster_logs: Path) -> Iterator[ConnectServer]:
    """A Spark Connect server (``local[2]``) on 127.0.0.1; ``server.url`` is the ``sc://``
    address for ``SparkSession.builder.remote``. Like a remote server, it runs with its own
    working directory, TMPDIR and (where possible) a private /tmp."""
    server = _started(
        ConnectServer(
            log_dir=cluster_logs / "connect", private_tmp=private_tmp_supported() is None
        ).start
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_s3(cluster_logs: Path) -> Iterator[MotoS3]:
    """moto's S3 API server; ``moto_s3.new_root()`` makes a bucket, ``storage_options`` are
    delta-rs'."""
    server = _started(MotoS3(log_dir=cluster_logs / "moto").start)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite(cluster_logs: Path) -> Iterator[Azurite]:
    """Azurite's Blob service (installed by npm on first use); ``azurite.new_root()`` makes
    a container, ``storage_options`` are delta-rs'."""
    server = _started(Azurite(log_dir=cluster_logs / "azurite").start)
    yield server
    server.stop()


_SERVERS = ("standalone_cluster", "connect_server", "moto_s3", "azurite")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in _SERVERS:
            server = funcargs.get(name)
            if server is None:
                continue
            procs = [
                getattr(server, "master", None),
                *getattr(server, "worker_procs", ()),
                getattr(server, "proc", None),
            ]
            parts = [
                f"--- {proc.log}\n{tail(proc.log, 30)}"
                for proc in procs
                if isinstance(proc, ServerProcess)
            ]
            if name == "standalone_cluster":
                parts.append(server.executor_logs())
            report.sections.append((f"{name} logs", "\n".join(parts)))
    return report
