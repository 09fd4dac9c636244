"""pgcdc on Spark: the ``pgoutput`` data source, the change envelope, typed per-table
DataFrames and the pipeline that applies a stream to Delta targets."""

from __future__ import annotations

from pgcdc.spark.envelope import ENVELOPE_SCHEMA
from pgcdc.spark.source import PgoutputDataSource, register
from pgcdc.spark.typed import table_changes

__all__ = ["ENVELOPE_SCHEMA", "PgoutputDataSource", "register", "table_changes"]
