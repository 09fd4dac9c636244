"""Columns of data files kept decoded between batches.

A merge-on-read batch reads values of rows it replaces: the unchanged TOAST values of a
mirror's updates, every column of the versions a history closes. A few rows of a file cost
the decoding of the row groups that hold them, and a file the copy wrote is one row group,
so each batch decoded whole columns again (a 2 M-row history, most of its table per batch).
Data files never change once written, so a column decoded once serves every later batch
from memory: `DecodedColumns` keeps whole columns (in the table's types) under one byte
budget for the process, least recently used out first. What a batch writes goes in as
written, so the next batch's reads of those rows decode nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DECODED_BYTES", "DecodedColumns", "decoded_columns"]

#: The bytes of decoded columns a process keeps (all its merge-on-read targets together).
DECODED_BYTES = 256 << 20
#: The share of the budget one file's columns may take: a larger file is read by row
#: groups each time, as before (one file must not push every other one out).
_LARGEST_SHARE = 4

_Key = tuple[str, str, str]  # table directory, the file's log path, column


class DecodedColumns:
    """Whole columns of data files, by table, file and name; thread-safe."""

    def __init__(self, budget: int = DECODED_BYTES) -> None:
        self.budget = budget
        self._columns: OrderedDict[_Key, tuple[pa.ChunkedArray, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(
        self, table_dir: str, path: str, name: str, kind: pa.DataType
    ) -> pa.ChunkedArray | None:
        """The column when it is kept in type `kind` (one of another type, kept before the
        table's column changed type, is dropped)."""
        key = (table_dir, path, name)
        with self._lock:
            entry = self._columns.get(key)
            if entry is None:
                return None
            if entry[0].type != kind:
                self._drop(key)
                return None
            self._columns.move_to_end(key)
            return entry[0]

    def fits(self, parquet: pq.ParquetFile, names: Collection[str]) -> bool:
        """Whether columns `names` of a file, decoded, are small enough to keep (their
        uncompressed size in the footer; strings decode to about that)."""
        metadata = parquet.metadata
        size = 0
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            for i in range(group.num_columns):  # leaf columns: a nested one is "name.x.y"
                chunk = group.column(i)
                if chunk.path_in_schema.split(".")[0] in names:
                    size += chunk.total_uncompressed_size
        return size * _LARGEST_SHARE <= self.budget

    def put(self, table_dir: str, path: str, name: str, column: pa.ChunkedArray) -> None:
        size = column.get_total_buffer_size()
        if size * _LARGEST_SHARE > self.budget:
            return
        key = (table_dir, path, name)
        with self._lock:
            if key in self._columns:
                self._drop(key)
            self._columns[key] = (column, size)
            self._bytes += size
            while self._bytes > self.budget:
                self._drop(next(iter(self._columns)))

    def forget(self, table_dir: str, live: Collection[str]) -> None:
        """Drops the columns of table `table_dir`'s files that are not in `live`."""
        with self._lock:
            for key in [k for k in self._columns if k[0] == table_dir and k[1] not in live]:
                self._drop(key)

    def _drop(self, key: _Key) -> None:
        self._bytes -= self._columns.pop(key)[1]


_SHARED = DecodedColumns()


def decoded_columns() -> DecodedColumns:
    """The process's columns (every merge-on-read table's by default)."""
    return _SHARED
