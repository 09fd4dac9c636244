"""Per-file statistics for the `add` actions pgcdc writes, as delta-rs 1.6 writes them.

``numRecords``, and per column ``minValues``, ``maxValues`` and ``nullCount`` (nested for
struct fields), for the columns the table indexes: those named by
``delta.dataSkippingStatsColumns``, else the first ``delta.dataSkippingNumIndexedCols``
(32 by default, -1 all) top-level columns that are not partition columns. Like delta-rs:
binary columns and lists or maps get none; timestamps are written to the millisecond
(readers widen the bounds by one); decimals as numbers; strings longer than 64 bytes are
cut at a character boundary, the maximum then raised at its last character that can be
(Parquet's statistics truncation, which delta-rs's writer inherits); floats ignore NaN.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["file_stats", "indexed_columns"]

_STRING_STATS_BYTES = 64
_DEFAULT_INDEXED = 32


def indexed_columns(
    schema: pa.Schema, partition_columns: Iterable[str], configuration: Mapping[str, str | None]
) -> list[str]:
    """The top-level columns a file's statistics cover (partition columns never)."""
    partitions = set(partition_columns)
    names = [f.name for f in schema if f.name not in partitions]
    listed = configuration.get("delta.dataSkippingStatsColumns")
    if listed:
        wanted = {n.strip().strip("`").split(".")[0] for n in listed.split(",") if n.strip()}
        return [n for n in names if n in wanted]
    count = int(configuration.get("delta.dataSkippingNumIndexedCols") or _DEFAULT_INDEXED)
    return names if count < 0 else names[:count]


def file_stats(data: pa.Table, columns: Iterable[str]) -> dict[str, Any]:
    """The statistics of a file holding `data`, over `columns` (top-level names)."""
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for name in columns:
        _column_stats(name, data.column(name), mins, maxes, nulls)
    return {"numRecords": data.num_rows, "minValues": mins, "maxValues": maxes, "nullCount": nulls}


def _column_stats(
    name: str,
    column: pa.ChunkedArray | pa.Array,
    mins: dict[str, Any],
    maxes: dict[str, Any],
    nulls: dict[str, Any],
) -> None:
    kind = column.type
    if pa.types.is_struct(kind):
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        child_mins: dict[str, Any] = {}
        child_maxes: dict[str, Any] = {}
        child_nulls: dict[str, Any] = {}
        for i, child in enumerate(array.flatten()):  # children with the parent's nulls
            _column_stats(kind.field(i).name, child, child_mins, child_maxes, child_nulls)
        if child_nulls:
            mins[name], maxes[name], nulls[name] = child_mins, child_maxes, child_nulls
        return
    if _no_stats(kind):
        return
    nulls[name] = column.null_count
    bounds = _bounds(column)
    if bounds is not None:
        mins[name], maxes[name] = bounds


def _no_stats(kind: pa.DataType) -> bool:
    return (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_map(kind)
        or pa.types.is_null(kind)
    )


def _bounds(column: pa.ChunkedArray | pa.Array) -> tuple[Any, Any] | None:
    kind = column.type
    if pa.types.is_floating(kind):
        column = pc.filter(column, pc.invert(pc.is_nan(column)))
    if len(column) == column.null_count:
        return None
    low, high = (s.as_py() for s in pc.min_max(column).values())
    if low is None or high is None:
        return None
    if pa.types.is_floating(kind):
        if math.isinf(low) or math.isinf(high):
            return None  # JSON has no infinity
        return float(low), float(high)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        return low, high
    if pa.types.is_decimal(kind):
        return _decimal(low, kind.scale, down=True), _decimal(high, kind.scale, down=False)
    if pa.types.is_date(kind):
        return low.isoformat(), high.isoformat()
    if pa.types.is_timestamp(kind):
        utc = kind.tz is not None
        return _timestamp(low, utc), _timestamp(high, utc)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return _string_min(low), _string_max(high)
    return None


def _decimal(value: decimal.Decimal, scale: int, *, down: bool) -> int | float:
    """A decimal bound as a JSON number: exact when it can be, else the nearest double on
    the side that keeps the bound (delta-rs writes the nearest double)."""
    if scale <= 0 and value == value.to_integral_value() and abs(value) < 2**53:
        return int(value)
    near = float(value)
    if decimal.Decimal(near) != value and (decimal.Decimal(near) > value) == down:
        near = math.nextafter(near, -math.inf if down else math.inf)
    return near


def _timestamp(value: dt.datetime, utc: bool) -> str:
    millis = value.microsecond // 1000
    text = value.strftime("%Y-%m-%dT%H:%M:%S" if utc else "%Y-%m-%d %H:%M:%S")
    if value.year < 1000:  # strftime does not pad years on every platform
        text = f"{value.year:04d}{text[text.index('-') :]}"
    return text + (f".{millis:03d}" if millis else "") + ("Z" if utc else "")


def _cut(text: str) -> str:
    """The longest prefix of `text` that fits in the statistics' byte budget."""
    out, size = [], 0
    for char in text:
        size += len(char.encode("utf-8"))
        if size > _STRING_STATS_BYTES:
            break
        out.append(char)
    return "".join(out)


def _string_min(text: str) -> str:
    return text if len(text.encode("utf-8")) <= _STRING_STATS_BYTES else _cut(text)


def _string_max(text: str) -> str:
    if len(text.encode("utf-8")) <= _STRING_STATS_BYTES:
        return text
    cut = _cut(text)
    for i in range(len(cut) - 1, -1, -1):
        code = ord(cut[i]) + 1
        if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            continue
        if len(chr(code).encode("utf-8")) == len(cut[i].encode("utf-8")):
            return cut[:i] + chr(code)
    return text  # no character can be raised: the whole value
