"""Rows of one relation, as pgoutput sends them, to Arrow record batches in Spark's schema.

`ArrowBatchBuilder` takes `TupleData` rows (the column bytes, text or binary) and builds
`pyarrow.RecordBatch`es whose schema is exactly ``to_arrow_schema(spark_schema)`` (UTC), as
Spark's Python data sources require. Every column's converters are chosen once, from
`pgcdc.types.mapping`; a string column in text mode is only UTF-8 decoded (its text is its
value), never parsed.

Two list columns follow the relation's columns:

* ``_pgcdc_unchanged_toast`` (array<string>, always present): the columns an UPDATE did not
  send because their TOASTed value did not change (kind ``u``). Their value is unknown, not
  null: the batch holds null, and a consumer merging into a table must keep the old value.
* ``_pgcdc_out_of_range`` (array<string>, only with ``on_out_of_range="null"``): the columns
  whose value the Spark type could not hold and that were nulled.

Both are null in a row with no such column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import types as st

from pgcdc.errors import ColumnCountMismatch, ValueOutOfRange
from pgcdc.protocol import Lsn, Relation, TupleData
from pgcdc.types.mapping import (
    DEFAULT_OPTIONS,
    MappingOptions,
    NotRepresentable,
    TypeMapping,
    text_renderer,
    type_mapping,
)
from pgcdc.types.registry import TypeRegistry, UnknownBinary

__all__ = [
    "OUT_OF_RANGE_COLUMN",
    "UNCHANGED_TOAST_COLUMN",
    "ArrowBatchBuilder",
    "relation_arrow_schema",
    "relation_spark_schema",
]

UNCHANGED_TOAST_COLUMN = "_pgcdc_unchanged_toast"
OUT_OF_RANGE_COLUMN = "_pgcdc_out_of_range"
_T, _B, _U = 0x74, 0x62, 0x75
#: How much of a value an error message quotes.
_VALUE_EXCERPT = 120


def _marker_columns(options: MappingOptions) -> list[str]:
    markers = [UNCHANGED_TOAST_COLUMN]
    if options.on_out_of_range == "null":
        markers.append(OUT_OF_RANGE_COLUMN)
    return markers


def _mappings(
    relation: Relation, registry: TypeRegistry, options: MappingOptions
) -> list[TypeMapping]:
    clash = {c.name for c in relation.columns}.intersection(_marker_columns(options))
    if clash:
        raise ValueError(f"{relation.relname} has a column named like pgcdc's {sorted(clash)}")
    return [type_mapping(c.type_oid, c.type_modifier, registry, options) for c in relation.columns]


def _spark_schema(
    relation: Relation, mappings: list[TypeMapping], options: MappingOptions
) -> st.StructType:
    fields = [
        st.StructField(c.name, m.spark, True)
        for c, m in zip(relation.columns, mappings, strict=True)
    ]
    strings = st.ArrayType(st.StringType(), containsNull=True)
    fields += [st.StructField(name, strings, True) for name in _marker_columns(options)]
    return st.StructType(fields)


def _arrow_schema(
    relation: Relation, mappings: list[TypeMapping], options: MappingOptions
) -> pa.Schema:
    fields = [pa.field(c.name, m.arrow) for c, m in zip(relation.columns, mappings, strict=True)]
    strings = pa.list_(pa.field("element", pa.string()))
    fields += [pa.field(name, strings) for name in _marker_columns(options)]
    return pa.schema(fields)


def relation_spark_schema(
    relation: Relation, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> st.StructType:
    """The Spark schema of `relation`'s batches: its columns (all nullable: a key-only old
    row or an unchanged TOAST value leaves columns empty), then the marker columns."""
    return _spark_schema(relation, _mappings(relation, registry, options), options)


def relation_arrow_schema(
    relation: Relation, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> pa.Schema:
    """The Arrow schema of `relation`'s batches (``to_arrow_schema`` of the Spark one)."""
    return _arrow_schema(relation, _mappings(relation, registry, options), options)


def _compose(
    parse: Callable[[bytes], Any], convert: Callable[[Any], Any] | None
) -> Callable[[bytes], Any]:
    if convert is None:
        return parse
    return lambda data: convert(parse(data))


class ArrowBatchBuilder:
    """Collects rows of one relation and turns them into record batches (`flush`).

    Values are converted as rows are appended, so a value the policy refuses raises from
    `append`, naming `schema_name`.`table_name`, the column, the value and the LSN given.
    `spark_schema` is the batches' Spark schema (give it to Spark), `schema` their Arrow one."""

    def __init__(
        self,
        relation: Relation,
        registry: TypeRegistry,
        options: MappingOptions = DEFAULT_OPTIONS,
        *,
        schema_name: str | None = None,
        table_name: str | None = None,
    ) -> None:
        self.relation = relation
        self.options = options
        self.table = f"{schema_name or relation.schema}.{table_name or relation.relname}"
        mappings = _mappings(relation, registry, options)
        self.spark_schema = _spark_schema(relation, mappings, options)
        self.schema = _arrow_schema(relation, mappings, options)
        self._names = [c.name for c in relation.columns]
        self._null_policy = options.on_out_of_range == "null"
        self._text: list[Callable[[bytes], Any]] = []
        self._binary: list[Callable[[bytes], Any]] = []
        self._renderers: list[Callable[[Any], str]] = []
        self._codecs = [registry.get(c.type_oid) for c in relation.columns]
        for column, codec, mapping in zip(relation.columns, self._codecs, mappings, strict=True):
            text = mapping.text_parser or _compose(codec.from_text, mapping.convert)
            binary = codec.from_binary or partial(UnknownBinary, codec.oid)
            self._text.append(text)
            self._binary.append(_compose(binary, mapping.convert))
            self._renderers.append(text_renderer(column.type_oid, registry))
        self._rows: list[list[Any]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: TupleData, lsn: int | None = None) -> None:
        """Add one row (an Insert's or Update's new tuple, or a Delete's old one)."""
        kinds = row.kinds
        values = row.values
        if len(kinds) != len(self._names):
            raise ColumnCountMismatch(
                f"{self.table} has {len(self._names)} columns, the row has {len(kinds)}",
                lsn=Lsn(lsn) if lsn is not None else None,
            )
        out_of_range: list[str] | None = None
        try:
            # n and u columns have no bytes; the mode (text or binary) is the session's, so a
            # row usually has one kind of value and takes one comprehension.
            if _B not in kinds:
                pairs = zip(self._text, values, strict=True)
                cells = [None if d is None else f(d) for f, d in pairs]
            elif _T not in kinds:
                pairs = zip(self._binary, values, strict=True)
                cells = [None if d is None else f(d) for f, d in pairs]
            else:
                cells = [
                    self._convert(i, k, d)
                    for i, (k, d) in enumerate(zip(kinds, values, strict=True))
                ]
        except NotRepresentable:
            cells, out_of_range = self._row_with_policy(kinds, values, lsn)
        unchanged = None
        if _U in kinds:
            unchanged = [n for n, k in zip(self._names, kinds, strict=True) if k == _U]
        cells.append(unchanged)
        if self._null_policy:
            cells.append(out_of_range)
        self._rows.append(cells)

    def _convert(self, i: int, kind: int, data: bytes | None) -> Any:
        if data is None:
            return None
        return (self._binary if kind == _B else self._text)[i](data)

    def _row_with_policy(
        self, kinds: bytes, values: tuple[bytes | None, ...], lsn: int | None
    ) -> tuple[list[Any], list[str] | None]:
        """The row converted column by column: a value that cannot be held raises
        ValueOutOfRange, or (policy "null") becomes null and its column is listed."""
        cells: list[Any] = []
        marked: list[str] = []
        for i, (kind, data) in enumerate(zip(kinds, values, strict=True)):
            try:
                cells.append(self._convert(i, kind, data))
            except NotRepresentable as exc:
                if not self._null_policy:
                    assert data is not None
                    raise ValueOutOfRange(
                        str(exc),
                        table=self.table,
                        column=self._names[i],
                        value=self._excerpt(i, kind, data),
                        lsn=Lsn(lsn) if lsn is not None else None,
                    ) from None
                cells.append(None)
                marked.append(self._names[i])
        return cells, marked or None

    def _excerpt(self, i: int, kind: int, data: bytes) -> str:
        """The value as the server would print it, for error messages."""
        if kind == _T:
            text = data.decode(errors="replace")
        else:
            try:
                text = self._renderers[i](self._codecs[i].decode(kind, data))
            except Exception:
                text = f"(binary) {data[:_VALUE_EXCERPT].hex()}"
        if len(text) > _VALUE_EXCERPT:
            text = text[:_VALUE_EXCERPT] + "…"
        return repr(text)

    def column_from_text(
        self, i: int, values: Sequence[bytes | None]
    ) -> tuple[pa.Array, list[int]]:
        """Column `i`'s values given as the server's text (None for NULL), converted exactly as
        `append` converts a ``t`` value of that column: the Arrow array of the column's type,
        and the positions in `values` that the policy "null" nulled. Under "error" a value the
        Spark type cannot hold raises ValueOutOfRange naming the table, column and value."""
        parse = self._text[i]
        try:
            cells = [None if d is None else parse(d) for d in values]
            nulled: list[int] = []
        except NotRepresentable:
            cells, nulled = [], []
            for position, data in enumerate(values):
                try:
                    cells.append(None if data is None else parse(data))
                except NotRepresentable as exc:
                    assert data is not None
                    if not self._null_policy:
                        raise ValueOutOfRange(
                            str(exc),
                            table=self.table,
                            column=self._names[i],
                            value=self._excerpt(i, _T, data),
                            row=position,
                        ) from None
                    cells.append(None)
                    nulled.append(position)
        return pa.array(cells, type=self.schema.field(i).type), nulled

    def flush(self) -> pa.RecordBatch:
        """The rows appended since the last flush, as one batch (possibly empty)."""
        rows, self._rows = self._rows, []
        if not rows:
            return _empty(self.schema)
        columns = zip(*rows, strict=True)
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
