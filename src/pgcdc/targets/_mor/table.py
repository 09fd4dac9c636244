"""A Delta table that pgcdc writes merge-on-read: the DeltaTable the target keeps open, the
live files with their deletion vectors (pgcdc's own replay of the log, kept in step with the
DeltaTable's version), and what the writer checks before it writes a commit by hand."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder

from pgcdc.errors import TargetError
from pgcdc.targets._mor.decoded import DecodedColumns, decoded_columns
from pgcdc.targets._mor.format import (
    DeletionVector,
    Rows,
    descriptor_rows,
    no_rows,
    unique_id,
)
from pgcdc.targets._mor.log import LogGap, LogState, update

__all__ = [
    "DeletionVectorsUnsupported",
    "MergeOnReadTable",
    "enable_deletion_vectors",
    "local_dir",
    "logical_row_count",
    "partition_scalar",
    "retention_ms",
]

#: Writer features whose rules a hand-written DV commit keeps (each under the condition
#: `_active_feature` checks): anything else makes the table unwritable here.
_WRITER_FEATURES = frozenset(
    {
        "deletionVectors",
        "appendOnly",
        "invariants",
        "checkConstraints",
        "generatedColumns",
        "changeDataFeed",
        "columnMapping",
        "timestampNtz",
        "variantType",
        "domainMetadata",
        "vacuumProtocolCheck",
    }
)
_READER_FEATURES = frozenset(
    {"deletionVectors", "timestampNtz", "variantType", "columnMapping", "vacuumProtocolCheck"}
)
#: delta.deletedFileRetentionDuration when the table sets none (the protocol's default).
_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
_UNITS_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}


class DeletionVectorsUnsupported(TargetError):
    """This table cannot be written merge-on-read by pgcdc (where it lives, or a table
    feature a hand-written commit would break): the caller merges copy-on-write instead."""


def local_dir(table: DeltaTable) -> str:
    """The directory of a table on the local file system, or DeletionVectorsUnsupported."""
    uri = table.table_uri
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else uri
    raise DeletionVectorsUnsupported(
        f"{uri}: deletion vectors are written on local file systems only; an object store "
        "needs a put-if-absent commit (S3 conditional writes with If-None-Match, Azure's "
        "If-None-Match: *) that pgcdc does not make yet"
    )


def _active_feature(feature: str, configuration: Mapping[str, str | None], schema: Any) -> bool:
    """Whether a supported feature holds rules this table uses (that pgcdc would not keep)."""
    if feature == "appendOnly":
        return (configuration.get("delta.appendOnly") or "").lower() == "true"
    if feature == "changeDataFeed":
        return (configuration.get("delta.enableChangeDataFeed") or "").lower() == "true"
    if feature == "columnMapping":
        return (configuration.get("delta.columnMapping.mode") or "none").lower() != "none"
    if feature == "checkConstraints":
        return any(k.startswith("delta.constraints.") for k in configuration)
    if feature in ("invariants", "generatedColumns"):
        key = "delta.invariants" if feature == "invariants" else "delta.generationExpression"
        return key in str(schema)
    return False


def writable_problem(table: DeltaTable) -> str | None:
    """Why pgcdc cannot write DVs into `table` (None: it can)."""
    protocol = table.protocol()
    configuration = table.metadata().configuration
    readers = set(protocol.reader_features or ())
    writers = set(protocol.writer_features or ())
    if "deletionVectors" not in readers or "deletionVectors" not in writers:
        return "the table does not have the deletionVectors feature"
    if (configuration.get("delta.enableDeletionVectors") or "").lower() != "true":
        return "delta.enableDeletionVectors is not true"
    unknown = sorted((readers - _READER_FEATURES) | (writers - _WRITER_FEATURES))
    if unknown:
        return f"table features pgcdc does not write by hand: {', '.join(unknown)}"
    schema = table.schema().to_json()
    active = sorted(f for f in writers if _active_feature(f, configuration, schema))
    if active:
        return f"table features in use that a deletion vector commit would break: {active}"
    return None


def enable_deletion_vectors(table: DeltaTable) -> None:
    """Gives `table` the deletionVectors feature (protocol reader 3 / writer 7) and
    ``delta.enableDeletionVectors = true``; nothing when it has both."""
    protocol = table.protocol()
    has = "deletionVectors" in (protocol.reader_features or ()) and "deletionVectors" in (
        protocol.writer_features or ()
    )
    enabled = table.metadata().configuration.get("delta.enableDeletionVectors")
    if has and (enabled or "").lower() == "true":
        return
    table.alter.set_table_properties(
        {"delta.enableDeletionVectors": "true"}, raise_if_not_exists=False
    )


def retention_ms(configuration: Mapping[str, str | None]) -> int:
    """delta.deletedFileRetentionDuration in milliseconds ("interval 15 minutes")."""
    text = configuration.get("delta.deletedFileRetentionDuration")
    if not text:
        return _DEFAULT_RETENTION_MS
    words = text.lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    if len(words) != 2 or words[1].rstrip("s") not in _UNITS_MS:
        raise TargetError(f"delta.deletedFileRetentionDuration {text!r}: not an interval")
    return int(float(words[0]) * _UNITS_MS[words[1].rstrip("s")])


class MergeOnReadTable:
    """The Delta table `table` (a DeltaTable kept open between batches) as pgcdc writes it
    with deletion vectors; refuses a table it cannot write (DeletionVectorsUnsupported)."""

    def __init__(self, table: DeltaTable, decoded: DecodedColumns | None = None) -> None:
        self.table = table
        self.table_dir = local_dir(table)
        problem = writable_problem(table)
        if problem is not None:
            raise DeletionVectorsUnsupported(f"{table.table_uri}: {problem}")
        self.state = LogState.read(self.table_dir, table.version())
        self._deleted: dict[str, Rows] = {}  # DV unique id -> its rows
        #: Live file -> its rows: files never change, and a batch asks for every file it
        #: touches (each answer would parse the file's statistics again).
        self._records: dict[str, int] = {}
        self._decoded = decoded_columns() if decoded is None else decoded
        self._schema: tuple[int, pa.Schema] | None = None  # (version, its schema)

    @property
    def uri(self) -> str:
        return str(self.table.table_uri)

    def sync(self) -> None:
        """Brings the live files to the DeltaTable's version (read on from where they were;
        anew when the DeltaTable went back or the commits in between were cleaned up)."""
        version = self.table.version()
        if version == self.state.version:
            return
        if version > self.state.version:
            try:
                self.state.advance(version)
                return
            except LogGap:
                pass
        self.state = LogState.read(self.table_dir, version)

    def refresh(self) -> None:
        """Reads what other writers committed (`update_incremental`) and follows it."""
        update(self.table, os.path.join(self.table_dir, "_delta_log"))
        self.sync()

    # -- files ---------------------------------------------------------------------------

    def file_path(self, log_path: str) -> str:
        """The local path of a data file named in the log (a relative URI or file:// URI)."""
        return _file_path(self.table_dir, log_path)

    def deletion_vector(self, path: str) -> DeletionVector | None:
        dv = self.state.adds[path].get("deletionVector")
        return None if not dv else DeletionVector.from_action(dv)

    def deleted_rows(self, path: str) -> Rows:
        """The rows of live file `path` its deletion vector marks deleted."""
        action = self.state.adds[path].get("deletionVector")
        if not action:
            return no_rows()
        key = unique_id(action)
        rows = self._deleted.get(key)
        if rows is None:
            dv = DeletionVector.from_action(action)
            rows = self._deleted[key] = descriptor_rows(self.table_dir, dv)
        return rows

    def remember_deleted(self, dv: DeletionVector, rows: Rows) -> None:
        """The rows of a DV this process wrote (its file need not be read back)."""
        self._deleted[dv.unique_id] = rows

    def remember_written(self, path: str, rows: pa.Table) -> None:
        """The rows of a data file this process wrote (`path` as the log names it; every
        column, in the table's types), kept decoded for the batches that read them."""
        for name in rows.column_names:
            self._decoded.put(self.table_dir, path, name, rows.column(name), written=True)

    def forget_deleted(self) -> None:
        """Drops cached DVs no live file uses, and the columns of files no longer live."""
        live = {
            unique_id(dv) for add in self.state.adds.values() if (dv := add.get("deletionVector"))
        }
        for key in [k for k in self._deleted if k not in live]:
            del self._deleted[key]
        for path in [p for p in self._records if p not in self.state.adds]:
            del self._records[path]
        self._decoded.forget(self.table_dir, self.state.adds)

    def num_records(self, path: str) -> int:
        """The rows of live file `path` (deleted ones included): its statistics, else its
        Parquet footer."""
        count = self._records.get(path)
        if count is None:
            count = self._records[path] = _num_records(self.table_dir, self.state.adds[path])
        return count

    def live_rows(self) -> int:
        """The rows a reader sees: every live file's rows less its DV's cardinality."""
        return _live_rows(self.table_dir, self.state)

    def read_file(self, path: str, names: Sequence[str], rows: Rows | None = None) -> pa.Table:
        """Columns of a data file cast to the table's types (a column the file predates is
        null; partition columns come from the log). All rows, or the `rows` given: those
        come from whole columns kept decoded (`DecodedColumns`), decoded and kept here if
        they fit, else from the row groups that hold them."""
        add = self.state.adds[path]
        schema = self.arrow_schema()
        whole: dict[str, pa.ChunkedArray] = {}
        for name in names:
            kind = schema.field(name).type
            kept = self._decoded.get(self.table_dir, path, name, kind, values=rows is not None)
            if kept is not None:
                whole[name] = kept
        missing = [n for n in names if n not in whole]
        present: set[str] = set()
        part: pa.Table | None = None
        if missing:
            parquet = pq.ParquetFile(self.file_path(path))
            present = set(parquet.schema_arrow.names)
            wanted = [n for n in missing if n in present]
            keep = rows is not None and self._decoded.fits(parquet, wanted)
            if rows is None or keep:
                data = parquet.read(columns=wanted)
                for name in wanted:
                    whole[name] = data.column(name).cast(schema.field(name).type)
                    if keep:
                        self._decoded.put(self.table_dir, path, name, whole[name], written=False)
            else:
                part = _read_rows(parquet, wanted, rows, schema)
        count = self.num_records(path) if rows is None else len(rows)
        taken = None if rows is None else pa.array(rows.astype(np.int64))
        arrays = []
        for name in names:
            kind = schema.field(name).type
            if name in whole:
                arrays.append(whole[name] if taken is None else whole[name].take(taken))
            elif part is not None and name in present:
                arrays.append(part.column(name))
            elif name in (add.get("partitionValues") or {}):
                value = partition_scalar(add["partitionValues"][name], kind)
                arrays.append(pa.repeat(value, count))
            else:
                arrays.append(pa.nulls(count, kind))
        return pa.Table.from_arrays(arrays, names=list(names))

    @property
    def configuration(self) -> Mapping[str, str | None]:
        return self.table.metadata().configuration

    @property
    def partition_columns(self) -> list[str]:
        return list(self.table.metadata().partition_columns)

    def arrow_schema(self) -> pa.Schema:
        """The table's schema (as of its version: a schema changes only in a commit)."""
        version = self.table.version()
        if self._schema is None or self._schema[0] != version:
            self._schema = (version, pa.schema(self.table.schema().to_arrow()))
        return self._schema[1]

    def now_ms(self) -> int:
        return int(time.time() * 1000)


def _file_path(table_dir: str, log_path: str) -> str:
    parsed = urlparse(log_path)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return os.path.join(table_dir, unquote(log_path))


def _num_records(table_dir: str, add: dict[str, Any]) -> int:
    """The rows of a file (deleted ones included): its statistics, else its footer."""
    value = json.loads(add["stats"]).get("numRecords") if add.get("stats") else None
    if value is not None:
        return int(value)
    return int(pq.read_metadata(_file_path(table_dir, add["path"])).num_rows)


def _live_rows(table_dir: str, state: LogState) -> int:
    total = 0
    for add in state.adds.values():
        dv = add.get("deletionVector")
        total += _num_records(table_dir, add) - (int(dv["cardinality"]) if dv else 0)
    return total


def _read_rows(
    parquet: pq.ParquetFile, names: list[str], rows: Rows, schema: pa.Schema
) -> pa.Table:
    """Rows `rows` (any order) of a Parquet file, reading only their row groups, its columns
    cast to the table's types first (a file written from DataFusion's results holds
    string_view columns, which Arrow's take does not handle)."""
    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    starts = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    wanted = rows.astype(np.int64)
    group = np.searchsorted(starts, wanted, side="right") - 1
    groups = np.unique(group)
    data = parquet.read_row_groups(groups.tolist(), columns=names)
    data = pa.Table.from_arrays(
        [data.column(n).cast(schema.field(n).type) for n in names], names=names
    )
    read_starts = np.r_[0, np.cumsum([sizes[g] for g in groups])].astype(np.int64)
    local = read_starts[np.searchsorted(groups, group)] + (wanted - starts[group])
    return data.take(pa.array(local))


def partition_scalar(text: str | None, kind: pa.DataType) -> pa.Scalar:
    """A partition value of the log (a string, or null) as a value of the column's type."""
    if text is None:
        return pa.scalar(None, kind)
    if pa.types.is_timestamp(kind):
        value = dt.datetime.fromisoformat(text)
        if value.tzinfo is None and kind.tz is not None:
            value = value.replace(tzinfo=dt.UTC)
        return pa.scalar(value, kind)
    return pa.array([text]).cast(kind)[0]


def logical_row_count(table: DeltaTable) -> int:
    """The rows a reader of `table` sees: what `state()`-like callers need instead of
    `count()` or the sum of `num_records`, which count rows deletion vectors delete."""
    if "deletionVectors" not in (table.protocol().reader_features or ()):
        return int(table.count())
    try:
        directory = local_dir(table)
    except DeletionVectorsUnsupported:
        result = QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t")
        return int(pa.table(result).column("n")[0].as_py())
    return _live_rows(directory, LogState.read(directory, table.version()))
