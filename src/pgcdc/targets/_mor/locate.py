"""Finding the live rows of given keys in a Delta table: (file, row index) pairs.

Files are pruned by their partition values and min/max statistics; a file that may hold a
key is searched in its key index: the file's key numbers sorted (`keys.key_codes`), built
the first time the file is searched and kept while the file is live (data files never
change; a file's deletion vector does, and is applied at each search). With a
`RowCondition` only the rows that meet it count (a history's current versions: its end
column null); the index then holds only those rows, and files whose statistics say none
meet it are never read.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.targets._mor.format import Rows, contains, sorted_rows
from pgcdc.targets._mor.keys import key_codes, same_keys
from pgcdc.targets._mor.table import MergeOnReadTable, partition_scalar

__all__ = ["Matches", "RowCondition", "RowLocator"]

_I64 = npt.NDArray[np.int64]
_EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class RowCondition:
    """Rows that count: their `null` columns are null and their `equal` columns hold the
    given values (e.g. a history's current versions: ``RowCondition(null=("__END_AT",))``)."""

    null: tuple[str, ...] = ()
    equal: tuple[tuple[str, Any], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.null, *(name for name, _ in self.equal))


@dataclass(frozen=True, slots=True)
class Matches:
    """The live rows found: match i is row `row[i]` of file `paths[file[i]]`, found for key
    row `key_row[i]`; `values` holds the rows' columns asked for (match order), or None."""

    paths: tuple[str, ...]
    key_row: _I64
    file: _I64
    row: Rows
    values: pa.Table | None = None

    def __len__(self) -> int:
        return len(self.key_row)

    def by_file(self) -> dict[str, Rows]:
        """The rows found per file (what `commit_delete_and_append` removes)."""
        out = {}
        for i, path in enumerate(self.paths):
            rows = self.row[self.file == i]
            if rows.size:
                out[path] = sorted_rows(rows)
        return out

    def found(self, key_count: int) -> npt.NDArray[np.bool_]:
        """Per key row asked for: whether a live row has it."""
        mask = np.zeros(key_count, np.bool_)
        mask[self.key_row] = True
        return mask


@dataclass(slots=True)
class _Index:
    codes: npt.NDArray[Any]  # sorted key numbers of the rows that count
    positions: npt.NDArray[np.uint32] | None  # their row indexes in the file (None: 0, 1, ...)
    keys: list[pa.Array] | None  # the key columns (file order) to check hash matches
    #: No key number twice (a file pgcdc wrote: a batch's rows, a copy, a rewrite of live
    #: rows): a key is found with one search, not two.
    unique: bool = False

    def rows(self, at: npt.NDArray[np.int64]) -> Rows:
        """The row indexes of the index's entries `at`."""
        return (at if self.positions is None else self.positions[at]).astype(np.uint64)


@dataclass(slots=True)
class _Bounds:
    skip: bool  # the file holds no row that meets the condition
    partition: dict[str, pa.Scalar] = field(default_factory=dict)  # key columns' values
    ranges: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key columns' min/max


class RowLocator:
    """The live rows of keys of `key_columns` (and `condition`) in `table`, kept with the
    table between batches."""

    def __init__(
        self,
        table: MergeOnReadTable,
        key_columns: Sequence[str],
        condition: RowCondition | None = None,
    ) -> None:
        if not key_columns:
            raise ValueError("a row locator needs at least one key column")
        self.table = table
        self.key_columns = tuple(key_columns)
        self.condition = condition or RowCondition()
        schema = table.arrow_schema()
        missing = [c for c in (*self.key_columns, *self.condition.columns) if c not in schema.names]
        if missing:
            raise KeyError(f"{table.table_dir}: no column {', '.join(missing)}")
        self.schema = schema
        partitions = set(table.partition_columns)
        self._data_keys = [c for c in self.key_columns if c not in partitions]
        self._partition_keys = [c for c in self.key_columns if c in partitions]
        self._indexes: dict[str, _Index] = {}
        self._bounds: dict[str, _Bounds] = {}

    # -- the search -----------------------------------------------------------------------

    def locate(self, keys: pa.Table, columns: Sequence[str] | None = ()) -> Matches:
        """The live rows holding the keys of `keys` (its key columns: typed, one row per key)
        that meet the condition, with the `columns` asked for (None: all) as `values`."""
        self.table.sync()
        self._forget_dead()
        batch = [keys.column(c).cast(self.schema.field(c).type) for c in self.key_columns]
        data = [batch[self.key_columns.index(c)] for c in self._data_keys]
        codes = key_codes(data) if data else None
        found_key: list[_I64] = []
        found_file: list[_I64] = []
        found_row: list[Rows] = []
        paths: list[str] = []
        hashed: list[tuple[int, _Index]] = []  # files whose matches are by hash: checked last
        for path, key_rows in self._candidates(batch):
            index = self._index(path)
            if codes is None:  # every key column is a partition column
                every = index.rows(np.arange(len(index.codes)))
                rows = np.repeat(every, len(key_rows))
                key_hit = np.tile(key_rows, len(every))
            else:
                if index.keys is None and not codes.exact:  # a file without null keys
                    key_rows = key_rows[_no_null_key(data, key_rows)]
                key_hit, rows = self._search(index, codes.codes, key_rows)
            deleted = self.table.deleted_rows(path)
            if deleted.size and rows.size:
                live = ~contains(deleted, rows)
                key_hit, rows = key_hit[live], rows[live]
            if rows.size:
                found_key.append(key_hit)
                found_file.append(np.full(rows.size, len(paths), np.int64))
                found_row.append(rows)
                if codes is not None and index.keys is not None:
                    hashed.append((len(paths), index))
                paths.append(path)
        if not paths:
            empty = Matches((), np.empty(0, np.int64), np.empty(0, np.int64), sorted_rows([]))
            return empty if columns == () else _with_values(empty, self._empty_values(columns))
        matches = Matches(
            tuple(paths),
            np.concatenate(found_key),
            np.concatenate(found_file),
            np.concatenate(found_row).astype(np.uint64),
        )
        if hashed:
            matches = _same_keys_only(matches, data, hashed)
        if columns == ():
            return matches
        return _with_values(matches, self._values(matches, columns))

    def _search(self, index: _Index, codes: npt.NDArray[Any], key_rows: _I64) -> tuple[_I64, Rows]:
        """The entries of `index` with the numbers of the batch's `key_rows`: (key row, row
        of the file) pairs, unchecked."""
        wanted = codes[key_rows]
        start = np.searchsorted(index.codes, wanted, side="left")
        if index.unique:
            inside = np.flatnonzero(start < len(index.codes))
            hit = inside[index.codes[start[inside]] == wanted[inside]]
            key_hit, rows = key_rows[hit], index.rows(start[hit])
        else:
            end = np.searchsorted(index.codes, wanted, side="right")
            key_hit, rows = self._runs(index, key_rows, start, end)
        return key_hit, rows

    @staticmethod
    def _runs(index: _Index, key_rows: _I64, start: _I64, end: _I64) -> tuple[_I64, Rows]:
        """Each key row with every entry of its run [start, end) of the index."""
        counts = end - start
        if not counts.any():
            return np.empty(0, np.int64), sorted_rows([])
        key_hit = np.repeat(key_rows, counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return key_hit, index.rows(np.repeat(start, counts) + offsets)

    def warm(self, values: bool) -> None:
        """Each live file that may hold rows of the condition indexed, and with `values` its
        columns decoded (kept if they fit the budget: `DecodedColumns`)."""
        self.table.sync()
        self._forget_dead()
        names = self._value_names(None)
        for path in list(self.table.state.adds):
            if self._file_bounds(path).skip:
                continue
            index = self._index(path)
            if values and len(index.codes):
                self.table.read_file(path, names, index.rows(np.zeros(1, np.int64)))

    # -- which files -----------------------------------------------------------------------

    def _candidates(self, batch: list[pa.ChunkedArray]) -> Iterable[tuple[str, _I64]]:
        """The live files that may hold keys of the batch, each with those key rows."""
        count = len(batch[0]) if batch else 0
        all_rows = np.arange(count, dtype=np.int64)
        if count == 0:
            return
        prunable = {c: _prune_values(batch[self.key_columns.index(c)]) for c in self._data_keys}
        order = None
        if len(self._data_keys) == 1:  # one integer key column: found by a sorted search
            values = prunable[self._data_keys[0]]
            if isinstance(values, np.ndarray):
                order = np.argsort(values, kind="stable")
                ordered = values[order]
        for path in list(self.table.state.adds):
            bounds = self._file_bounds(path)
            if bounds.skip:
                continue
            rows = all_rows
            mask: npt.NDArray[np.bool_] | None = None
            for name, value in bounds.partition.items():
                column = batch[self.key_columns.index(name)]
                equal = (
                    pc.fill_null(pc.equal(column, value), False)
                    if value.is_valid
                    else (pc.is_null(column))
                )
                hit = np.asarray(equal.to_numpy(zero_copy_only=False), np.bool_)
                mask = hit if mask is None else mask & hit
            for name, (low, high) in bounds.ranges.items():
                values = prunable[name]
                if values is None:
                    continue
                if order is not None and mask is None:  # one key column: a sorted search
                    start = np.searchsorted(ordered, low, side="left")
                    end = np.searchsorted(ordered, high, side="right")
                    rows = np.sort(order[start:end])
                    continue
                if isinstance(values, np.ndarray):
                    hit = (values >= low) & (values <= high)
                else:
                    hit = np.asarray(
                        pc.fill_null(
                            pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high)),
                            True,
                        ).to_numpy(zero_copy_only=False),
                        np.bool_,
                    )
                mask = hit if mask is None else mask & hit
            if mask is not None:
                rows = rows[mask[rows]]
            if rows.size:
                yield path, rows

    def _file_bounds(self, path: str) -> _Bounds:
        bounds = self._bounds.get(path)
        if bounds is None:
            bounds = self._bounds[path] = self._read_bounds(self.table.state.adds[path])
        return bounds

    def _read_bounds(self, add: dict[str, Any]) -> _Bounds:
        partition_values = add.get("partitionValues") or {}
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        nulls, mins, maxes = (stats.get(k) or {} for k in ("nullCount", "minValues", "maxValues"))
        for name in self.condition.null:
            if name in partition_values:
                if partition_values[name] is not None:
                    return _Bounds(True)
            elif nulls.get(name) == 0:
                return _Bounds(True)
        for name, wanted in self.condition.equal:
            if name in partition_values:
                value = partition_scalar(partition_values[name], self.schema.field(name).type)
                if value.as_py() != wanted:
                    return _Bounds(True)
        bounds = _Bounds(False)
        for name in self._partition_keys:
            kind = self.schema.field(name).type
            bounds.partition[name] = partition_scalar(partition_values.get(name), kind)
        for name in self._data_keys:
            if name in mins and name in maxes:  # bounds of the values that are not null
                stat_range = _stat_range(mins[name], maxes[name], self.schema.field(name).type)
                if stat_range is not None:
                    bounds.ranges[name] = stat_range
        return bounds

    # -- the index of one file ------------------------------------------------------------

    def _index(self, path: str) -> _Index:
        index = self._indexes.get(path)
        if index is None:
            index = self._indexes[path] = self._build_index(path)
        return index

    def _build_index(self, path: str) -> _Index:
        wanted = [
            *self._data_keys,
            *(c for c in self.condition.columns if c not in self._data_keys),
        ]
        data = self.table.read_file(path, wanted)
        count = data.num_rows
        keep = np.ones(count, np.bool_)
        for name in self.condition.null:
            keep &= np.asarray(data.column(name).is_null().to_numpy(), np.bool_)
        for name, value in self.condition.equal:
            equal = pc.fill_null(pc.equal(data.column(name), value), False)
            keep &= np.asarray(equal.to_numpy(), np.bool_)
        rows = np.flatnonzero(keep).astype(np.uint32)
        if not self._data_keys:  # every key column is a partition column: no numbers
            return _Index(np.zeros(len(rows), np.int64), rows, None)
        key_arrays = [data.column(c).combine_chunks() for c in self._data_keys]
        codes = key_codes(key_arrays)
        check = None if codes.exact else key_arrays
        every = len(rows) == count
        kept = codes.codes if every else codes.codes[rows]
        if bool(np.all(kept[1:] >= kept[:-1])):  # a file written in key order: no sort
            return _Index(kept, None if every else rows, check, _unique(kept))
        order = np.argsort(kept, kind="stable")
        return _Index(kept[order], rows[order], check, _unique(kept[order]))

    def _forget_dead(self) -> None:
        live = self.table.state.adds
        for cache in (self._indexes, self._bounds):
            for path in [p for p in cache if p not in live]:
                del cache[path]

    # -- values -----------------------------------------------------------------------------

    def _value_names(self, columns: Sequence[str] | None) -> list[str]:
        return list(self.schema.names) if columns is None else list(columns)

    def _empty_values(self, columns: Sequence[str] | None) -> pa.Table:
        names = self._value_names(columns)
        return pa.schema([self.schema.field(n) for n in names]).empty_table()

    def _values(self, matches: Matches, columns: Sequence[str] | None) -> pa.Table:
        names = self._value_names(columns)
        parts = []
        order = []
        for i, path in enumerate(matches.paths):
            at = np.flatnonzero(matches.file == i)
            parts.append(self.table.read_file(path, names, matches.row[at]))
            order.append(at)
        table = pa.concat_tables(parts)
        placed = np.empty(len(matches), np.int64)
        placed[np.concatenate(order)] = np.arange(len(matches))
        schema = pa.schema([self.schema.field(n) for n in names])
        return table.take(pa.array(placed)).cast(schema)


def _same_keys_only(
    matches: Matches, data: list[pa.ChunkedArray], checked: list[tuple[int, _Index]]
) -> Matches:
    """`matches` without those in files indexed by hash (`checked`: their places in
    `matches.paths`, their indexes) whose key is not the batch's, the values compared for
    all those files at once (their key columns chunks of one column), not file by file."""
    first = np.full(len(matches.paths), -1, np.int64)  # a file's first row in the chunks
    chunks: list[list[pa.Array]] = [[] for _ in data]
    offset = 0
    for at, index in checked:
        assert index.keys is not None
        first[at] = offset
        offset += len(index.keys[0])
        for j, column in enumerate(data):
            key = index.keys[j]
            chunks[j].append(key if key.type == column.type else key.cast(column.type))
    sub = np.flatnonzero(first[matches.file] >= 0)
    right = [pa.chunked_array(c, column.type) for c, column in zip(chunks, data, strict=True)]
    rows = matches.row[sub].astype(np.int64) + first[matches.file[sub]]
    same = same_keys(data, matches.key_row[sub], right, rows)
    if same.all():
        return matches
    keep = np.ones(len(matches), np.bool_)
    keep[sub[~same]] = False
    return Matches(matches.paths, matches.key_row[keep], matches.file[keep], matches.row[keep])


def _unique(ordered: npt.NDArray[Any]) -> bool:
    return bool(np.all(ordered[1:] != ordered[:-1]))


def _with_values(matches: Matches, values: pa.Table) -> Matches:
    return Matches(matches.paths, matches.key_row, matches.file, matches.row, values)


def _prune_values(column: pa.ChunkedArray) -> npt.NDArray[np.int64] | pa.Array | None:
    """A key column in the form its min/max bounds compare with: integers (integer-like
    types without nulls), strings, or None (not pruned)."""
    kind = column.type
    array = column.combine_chunks()
    if array.null_count:
        return None
    timestamp = pa.types.is_timestamp(kind) and kind.unit == "us"
    if (
        (pa.types.is_integer(kind) and not pa.types.is_uint64(kind))
        or pa.types.is_date32(kind)
        or timestamp
    ):
        view = (
            array
            if pa.types.is_integer(kind)
            else array.view(pa.int32() if pa.types.is_date32(kind) else pa.int64())
        )
        return np.asarray(view.to_numpy(zero_copy_only=False), np.int64)
    if pa.types.is_decimal128(kind) and kind.precision <= 18:
        return np.asarray(key_codes([array]).codes, np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array
    return None


def _stat_range(low: Any, high: Any, kind: pa.DataType) -> tuple[Any, Any] | None:
    """Statistics bounds in the form `_prune_values` compares, widened where writers round
    (timestamps to the millisecond, decimals to doubles); None: not usable."""
    try:
        if pa.types.is_integer(kind):
            return int(low), int(high)
        if pa.types.is_date32(kind):
            return _days(low), _days(high)
        if pa.types.is_timestamp(kind) and kind.unit == "us":
            return _micros(low) - 1000, _micros(high) + 1000
        if pa.types.is_decimal128(kind) and kind.precision <= 18:
            scale = 10**kind.scale
            return math.floor(float(low) * scale) - 1, math.ceil(float(high) * scale) + 1
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return pa.scalar(str(low), kind), pa.scalar(str(high), kind)
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _days(text: str) -> int:
    return (dt.date.fromisoformat(text) - _EPOCH).days


def _micros(text: str) -> int:
    """Microseconds since the epoch of a statistics timestamp (UTC, or without a zone)."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _no_null_key(data: list[pa.ChunkedArray], key_rows: _I64) -> npt.NDArray[np.bool_]:
    """Which of the batch's `key_rows` have a value in every key column (a null key matches
    no row of a file whose key columns hold none)."""
    keep = np.ones(len(key_rows), np.bool_)
    for column in data:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        keep &= np.asarray(valid, np.bool_)[key_rows]
    return keep
