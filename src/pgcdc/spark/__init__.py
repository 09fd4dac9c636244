"""pgcdc on Spark: the ``pgoutput`` data source, the change envelope's Spark schema, typed
per-table DataFrames, reading targets into Spark, and local sessions. (The pipeline that
applies a stream to targets is `pgcdc.pipeline`; it runs its work on Spark through this
package.)"""

from __future__ import annotations

from pgcdc.spark.envelope import ENVELOPE_SCHEMA
from pgcdc.spark.read import read_target
from pgcdc.spark.source import PgoutputDataSource, register
from pgcdc.spark.typed import table_changes

__all__ = ["ENVELOPE_SCHEMA", "PgoutputDataSource", "read_target", "register", "table_changes"]
