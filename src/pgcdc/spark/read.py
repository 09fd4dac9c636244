"""Reading a Delta table that `DeltaTarget` wrote into Spark, with or without Delta's jars.

With Delta Lake on Spark's classpath this is ``spark.read.format("delta").load(path)``.
Without it (the usual case here: no Maven), the table's current snapshot is read as the
Parquet files its log lists, with the schema from the log: files written before a column was
added read it as NULL, and a table with no files yet gives an empty DataFrame. The rows that
deletion vectors mark deleted (pgcdc writes a local table's changes so) are left out: the
deleted (file, row) pairs, read from the log by delta-rs, are anti-joined on Spark's
``_metadata.file_name`` and ``_metadata.row_index``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.pandas.types import from_arrow_schema

from pgcdc.errors import TargetError

__all__ = ["read_target"]

#: Table features a plain Parquet read would get wrong.
_UNREADABLE = frozenset({"columnMapping"})
_FILE, _ROW = "__pgcdc_file", "__pgcdc_row"


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
    frame = spark.read.schema(schema).parquet(*files)
    deleted = _deleted_rows(table) if "deletionVectors" in features else None
    if deleted is None or deleted.num_rows == 0:
        return frame
    from pyspark.sql import functions as F

    tagged = frame.select(
        "*",
        F.col("_metadata.file_name").alias(_FILE),
        F.col("_metadata.row_index").alias(_ROW),
    )
    gone = spark.createDataFrame(deleted)
    return tagged.join(gone, on=[_FILE, _ROW], how="left_anti").drop(_FILE, _ROW)


def _deleted_rows(table: DeltaTable) -> pa.Table:
    """(file name, row index) of every row a deletion vector marks deleted."""
    vectors = pa.table(table.deletion_vectors())
    names: list[str] = []
    rows: list[np.ndarray] = []
    for path, keep in zip(
        vectors.column("filepath").to_pylist(), vectors.column("selection_vector"), strict=True
    ):
        mask = np.asarray(keep.values.to_numpy(zero_copy_only=False), dtype=bool)
        gone = np.flatnonzero(~mask)  # rows past the vector's end are kept
        names += [path.rstrip("/").rsplit("/", 1)[-1]] * len(gone)
        rows.append(gone)
    index = np.concatenate(rows) if rows else np.empty(0, np.int64)
    return pa.table({_FILE: pa.array(names, pa.string()), _ROW: pa.array(index, pa.int64())})
