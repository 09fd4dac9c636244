"""Reading a Delta table that `DeltaTarget` wrote into Spark, with or without Delta's jars.

With Delta Lake on Spark's classpath this is ``spark.read.format("delta").load(path)``.
Without it (the usual case here: no Maven), the table's current snapshot is read as the
Parquet files its log lists, with the schema from the log: files written before a column was
added read it as NULL, and a table with no files yet gives an empty DataFrame.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.pandas.types import from_arrow_schema

from pgcdc.errors import TargetError

__all__ = ["read_target"]

#: Table features a plain Parquet read would get wrong.
_UNREADABLE = frozenset({"deletionVectors", "columnMapping"})


def _missing_delta(exc: Exception) -> bool:
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    name = condition() if condition is not None else None
    return name == "DATA_SOURCE_NOT_FOUND" or (name is None and "DATA_SOURCE_NOT_FOUND" in str(exc))


def read_target(spark: Any, path: str, *, storage_options: dict[str, str] | None = None) -> Any:
    """The table at `path` as a Spark DataFrame (its current version)."""
    try:
        frame = spark.read.format("delta").load(path)
        frame.schema  # noqa: B018 -- Spark Connect resolves the source only when asked
        return frame
    except Exception as exc:
        if not _missing_delta(exc):
            raise
    table = DeltaTable(path, storage_options=storage_options)
    features = set(table.protocol().reader_features or ())
    if features & _UNREADABLE:
        raise TargetError(
            f"{path} uses {sorted(features & _UNREADABLE)}: read it with Delta Lake for Spark"
        )
    schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
    files = table.file_uris()
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*files)
