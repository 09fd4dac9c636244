"""pgcdc on Spark: the ``pgoutput`` data source, the change envelope's Spark schema, typed
per-table DataFrames, reading targets into Spark, sessions (`pgcdc.spark.session`), running a
pipeline on a session one has (`run`; ``spark-submit``: `pgcdc.spark.submit`), and the work
dispatched to executors (`pgcdc.spark.dispatch`). (The pipeline that applies a stream to
targets is `pgcdc.pipeline`; it runs its work on Spark through this package.)"""

from __future__ import annotations

from pgcdc.spark.envelope import ENVELOPE_SCHEMA
from pgcdc.spark.read import read_target
from pgcdc.spark.source import PgoutputDataSource, register
from pgcdc.spark.submit import run
from pgcdc.spark.typed import table_changes

__all__ = [
    "ENVELOPE_SCHEMA",
    "PgoutputDataSource",
    "read_target",
    "register",
    "run",
    "table_changes",
]
