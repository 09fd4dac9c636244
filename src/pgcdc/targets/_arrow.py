"""Arrow helpers the Delta targets share: types compared as Delta keeps them, tables fitted to
a schema, sequence structs, SQL pieces of DataFusion predicates (no I/O)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from pgcdc.envelope import Shape
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT
from pgcdc.targets.fold import Seq

log = logging.getLogger("pgcdc.targets.delta")

#: The merge source's column telling what a row does; never written to the table.
ACTION = "_pgcdc_action"
#: The ordinal at which a reconcile with a copy at point P ends versions, (P, this); the ones it
#: opens follow. Negative: before every change the stream brings at commit LSN P (ordinal 1 on).
RECONCILED = -(1 << 62)
#: Above this many keys, a lookup of current rows scans instead of listing the keys.
MAX_IN_LIST = 10_000
_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def q(name: str) -> str:
    """A quoted SQL identifier (delta-rs predicates are DataFusion SQL)."""
    return '"' + name.replace('"', '""') + '"'


def canonical(t: pa.DataType) -> pa.DataType:
    """`t` without what Delta does not keep: list item names, string and binary layouts."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(pa.field("element", canonical(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, canonical(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(canonical(t.key_type), canonical(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def same(a: pa.DataType, b: pa.DataType) -> bool:
    return a.equals(b) or canonical(a).equals(canonical(b))


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every `old` value is exactly a `new` value (and the types differ)."""
    if old in _INTS and new in _INTS:
        return _INTS.index(new) > _INTS.index(old)
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return old.scale == new.scale and new.precision > old.precision
    if pa.types.is_list(old) and pa.types.is_list(new):
        return widens(old.value_type, new.value_type)
    return False


def reshaped(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether `new` is `old` (a composite type's struct, or a list of them) with attributes
    added or dropped, the others the same: the values cast by name (NULL in an attribute
    added, as the server reads a value stored before), the column follows the type."""
    if pa.types.is_list(old) and pa.types.is_list(new):
        return reshaped(old.value_type, new.value_type)
    if not (pa.types.is_struct(old) and pa.types.is_struct(new)) or same(old, new):
        return False
    before = {f.name: f.type for f in old}
    kept = [f for f in new if f.name in before]
    fits = all(same(before[f.name], f.type) or widens(before[f.name], f.type) for f in kept)
    return fits and (len(kept) == len(new) or len(kept) == len(old))


def seq_sql(seq: Seq) -> str:
    lsn, ordinal = seq
    return (
        f"named_struct('commit_lsn', arrow_cast({lsn}, 'Int64'), "
        f"'ordinal', arrow_cast({ordinal}, 'Int64'))"
    )


def before_sql(a: str, b: str) -> str:
    """SQL: sequence struct `a` orders before `b`."""
    return (
        f"({a}['commit_lsn'] < {b}['commit_lsn'] OR ({a}['commit_lsn'] = {b}['commit_lsn'] "
        f"AND {a}['ordinal'] < {b}['ordinal']))"
    )


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with `schema`'s columns, in its order: missing ones null, others cast."""
    n = table.num_rows
    names = set(table.column_names)
    arrays = [
        table.column(f.name).cast(f.type) if f.name in names else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def fit(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`conform`, but values of a type the table no longer holds (a later type change is in
    the table already, or this batch's fills them) are null."""
    stale = [
        f.name
        for f in table.schema
        if f.name in schema.names
        and not (
            same(f.type, schema.field(f.name).type) or widens(f.type, schema.field(f.name).type)
        )
    ]
    return conform(table.drop_columns(stale), schema)


def seq(value: Seq | None) -> dict[str, int] | None:
    return None if value is None else {"commit_lsn": value[0], "ordinal": value[1]}


def sequences(point: int, first: int, count: int) -> pa.Array:
    """(point, first), (point, first + 1), … as sequence structs."""
    return pa.array([seq((point, first + i)) for i in range(count)], SEQUENCE_TYPE)


def with_action(table: pa.Table, action: str) -> pa.Table:
    return table.append_column(ACTION, pa.repeat(pa.scalar(action), len(table)))


def data_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` without a history's version columns."""
    return pa.schema([f for f in schema if f.name not in (START_AT, END_AT)])


def with_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """`table` with column `name` replaced by `values` (cast to the column's type)."""
    at = table.schema.get_field_index(name)
    field = table.schema.field(at)
    return table.set_column(at, field, values.cast(field.type))


def pick(schema: pa.Schema, names: Iterable[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(same(x.type, y.type) for x, y in zip(a, b, strict=True))


def column_of(shape: Shape, name: str) -> Any:
    return next(c for c in shape.columns if c.name == name)


def same_type(a: Shape, b: Shape, column: str) -> bool:
    """Whether `column` has the same type (and modifier) in shapes `a` and `b`."""
    x, y = column_of(a, column), column_of(b, column)
    return bool(x.type_oid == y.type_oid and x.type_modifier == y.type_modifier)


def cast_or_null(
    values: pa.ChunkedArray, to: pa.DataType, path: str, column: str
) -> pa.ChunkedArray:
    """A retyped column's values in a history's ended versions: cast to the new type, or
    null (with a warning) when any of them cannot be."""
    try:
        return values.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        log.warning(
            "%s: column %s changed its type to %s; its values in the versions that ended "
            "before cannot be cast (%s) and are null there",
            path,
            column,
            to,
            str(exc).splitlines()[0],
        )
        return pa.chunked_array([pa.nulls(len(values), to)])


def literals(column: pa.ChunkedArray) -> list[str] | None:
    """SQL literals of an integer or string key column's values; None for other types."""
    values = [v for v in column.to_pylist() if v is not None]
    if pa.types.is_integer(column.type):
        return [str(int(v)) for v in values] or ["NULL"]
    if pa.types.is_string(column.type):
        return ["'" + v.replace("'", "''") + "'" for v in values] or ["NULL"]
    return None
