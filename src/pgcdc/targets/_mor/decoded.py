"""Columns of data files kept decoded between batches.

A merge-on-read batch reads values of rows it replaces: the unchanged TOAST values of a
mirror's updates, every column of the versions a history closes. A few rows of a file cost
the decoding of the row groups that hold them, and a file the copy wrote is one row group,
so each batch decoded whole columns again (a 2 M-row history, most of its table per batch).
Data files never change once written, so a column decoded once serves every later batch
from memory: `DecodedColumns` keeps whole columns (in the table's types) under one byte
budget for the process (`READ_CACHE_BYTES` unless set: the pipeline's ``target.read_cache``),
least recently used out first.

What a batch writes goes in as written, but into a small segment of its own (an eighth of
the budget): the next batch builds its key index from it, and a hot key's rows are read
back from it, but most rows written are not read again (a history's closed versions never
are), and without the segment they would push out the columns that are. A value read from
the segment moves the file's column to the main part.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

import pyarrow as pa
import pyarrow.parquet as pq

from pgcdc.targets.base import READ_CACHE_BYTES

__all__ = ["DecodedColumns", "decoded_columns"]

#: The share of the budget one file's columns may take: a larger file is read by row
#: groups each time, as before (one file must not push every other one out).
_LARGEST_SHARE = 4
#: The share of the budget the columns of files written here take until read (see above).
_WRITTEN_SHARE = 8

_Key = tuple[str, str, str]  # table directory, the file's log path, column


class DecodedColumns:
    """Whole columns of data files, by table, file and name; thread-safe."""

    def __init__(self, budget: int = READ_CACHE_BYTES) -> None:
        self._budget = budget
        #: Columns read back at least once, and columns of files written here (in that
        #: order of eviction: the written ones first), least recently used first.
        self._read: OrderedDict[_Key, tuple[pa.ChunkedArray, int]] = OrderedDict()
        self._written: OrderedDict[_Key, tuple[pa.ChunkedArray, int]] = OrderedDict()
        self._files: dict[str, dict[str, set[str]]] = {}  # table -> file -> columns kept
        self._read_bytes = 0
        self._written_bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._read_bytes + self._written_bytes

    @property
    def budget(self) -> int:
        return self._budget

    @budget.setter
    def budget(self, budget: int) -> None:
        with self._lock:
            self._budget = budget
            self._shrink()

    def get(
        self, table_dir: str, path: str, name: str, kind: pa.DataType, *, values: bool = True
    ) -> pa.ChunkedArray | None:
        """The column when it is kept in type `kind` (one of another type, kept before the
        table's column changed type, is dropped). `values`: rows of it are read (a
        written file's column moves to the main part), not only its keys indexed."""
        key = (table_dir, path, name)
        with self._lock:
            entry = self._read.get(key)
            part = self._read
            if entry is None:
                entry = self._written.get(key)
                part = self._written
            if entry is None:
                return None
            if entry[0].type != kind:
                self._drop(key)
                return None
            column = entry[0]
            if values and column.num_chunks > 1:
                column = _one_chunk(column)
            if part is self._written and values:
                self._drop(key)
                self._add(key, column, entry[1], written=False)
                self._shrink()
            else:
                part[key] = (column, entry[1])
                part.move_to_end(key)
            return column

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
        return size * _LARGEST_SHARE <= self._budget

    def put(
        self, table_dir: str, path: str, name: str, column: pa.ChunkedArray, *, written: bool
    ) -> None:
        """Keeps a column: one read back (`written` False), or of a file written here."""
        size = column.get_total_buffer_size()
        if size * (_WRITTEN_SHARE if written else _LARGEST_SHARE) > self._budget:
            return
        key = (table_dir, path, name)
        with self._lock:
            self._drop(key)
            self._add(key, column, size, written=written)
            self._shrink()

    def forget(self, table_dir: str, live: Collection[str]) -> None:
        """Drops the columns of table `table_dir`'s files that are not in `live`."""
        with self._lock:
            files = self._files.get(table_dir, {})
            for path in [p for p in files if p not in live]:
                for name in list(files[path]):
                    self._drop((table_dir, path, name))

    def _add(self, key: _Key, column: pa.ChunkedArray, size: int, *, written: bool) -> None:
        if written:
            self._written[key] = (column, size)
            self._written_bytes += size
        else:
            self._read[key] = (column, size)
            self._read_bytes += size
        table_dir, path, name = key
        self._files.setdefault(table_dir, {}).setdefault(path, set()).add(name)

    def _shrink(self) -> None:
        while self._written_bytes * _WRITTEN_SHARE > self._budget:
            self._drop(next(iter(self._written)))
        while self.nbytes > self._budget:
            self._drop(next(iter(self._written or self._read)))

    def _drop(self, key: _Key) -> None:
        if key in self._read:
            self._read_bytes -= self._read.pop(key)[1]
        elif key in self._written:
            self._written_bytes -= self._written.pop(key)[1]
        else:
            return
        table_dir, path, name = key
        files = self._files[table_dir]
        files[path].discard(name)
        if not files[path]:
            del files[path]
            if not files:
                del self._files[table_dir]


def _one_chunk(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The column in one chunk, when its values fit one (Arrow's `take` from several chunks
    joins them first: a copy of the whole column for each batch's few rows)."""
    try:
        return pa.chunked_array([column.combine_chunks()], column.type)
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # over 2 GB of string values
        return column


_SHARED = DecodedColumns()


def decoded_columns() -> DecodedColumns:
    """The process's columns (every merge-on-read table's by default)."""
    return _SHARED
