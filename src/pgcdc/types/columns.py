"""A relation's columns as the server prints them (string arrays) to typed Arrow, fast.

The values are exactly those `pgcdc.types.arrow.ArrowBatchBuilder` gives the same texts, but
typed a column at a time:

* a vectorized fast path where pyarrow's conversion of the server's text is the type system's:
  string-mapped types (text, varchar, bpchar with its padding, name, uuid, json, jsonb,
  unconstrained numeric, inet, time, interval, enums, …) are their text; int2/int4/int8/oid,
  xid/cid and xid8 (a decimal(20,0)) are plain digits; bool is ``t``/``f``; float8 and
  float4 are parsed as correctly rounded doubles (``NaN``, ``Infinity``, ``-Infinity``
  included), float4 then rounded to float32 as ``struct.pack`` does; numeric with a decimal
  mapping, date, timestamp and timestamptz are cast by pyarrow, which refuses any text it
  cannot convert exactly; bytea's ``\\x`` hex is decoded with numpy;
* for everything else, and for the values a fast path refuses (NaN or a too-wide numeric,
  infinity, BC and five-digit years), the column's own text parser, value by value, with the
  out-of-range policy (`ArrowBatchBuilder.column_from_text`).

When pyarrow refuses a value, the batch's texts in the usual form (a pattern) are converted in
bulk and the others one by one. A fast path is used only when the column's codec has the
built-in text parser: a registry that replaced it gets its own parser. The initial copy
(`pgcdc.snapshot.copy`) and the Delta targets' bulk path use it; tests/snapshot compares every
type with the stream path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.errors import ValueOutOfRange
from pgcdc.protocol import Relation
from pgcdc.types.arrow import OUT_OF_RANGE_COLUMN, UNCHANGED_TOAST_COLUMN, ArrowBatchBuilder
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions, TypeMapping, type_mapping
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeCodec, TypeRegistry

__all__ = ["TextColumns", "text_columns_schema"]


def text_columns_schema(
    relation: Relation, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> pa.Schema:
    """The schema of `TextColumns` batches: ``relation_arrow_schema`` without the unchanged
    TOAST marker (every value is there)."""
    schema = ArrowBatchBuilder(relation, registry, options).schema
    return pa.schema([f for f in schema if f.name != UNCHANGED_TOAST_COLUMN])


#: Cast functions raise these when a text is not what they take.
_REFUSED = (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError)


@dataclass(frozen=True, slots=True)
class _FastPath:
    """A vectorized conversion of a string column, exact on the texts it accepts; it raises
    (one of `_REFUSED`) on any other. `pattern`, when set, matches the texts it accepts, so a
    batch with a few refused values converts the rest in bulk."""

    convert: Callable[[pa.Array], pa.Array]
    pattern: str | None = None


def _cast(target: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def convert(strings: pa.Array) -> pa.Array:
        return pc.cast(strings, target, safe=True)

    return convert


def _float4(strings: pa.Array) -> pa.Array:
    # The type system reads float(text), a correctly rounded double, then packs it into a
    # float32 (round to nearest even, a C cast); pyarrow's double parsing is correctly rounded
    # too and its unsafe float64 -> float32 cast is that C cast.
    return pc.cast(pc.cast(strings, pa.float64(), safe=True), pa.float32(), safe=False)


_TRUE, _FALSE = pa.scalar("t"), pa.scalar("f")


def _bool(strings: pa.Array) -> pa.Array:
    true = pc.equal(strings, _TRUE)
    known = pc.or_(true, pc.equal(strings, _FALSE)).true_count
    if known != len(strings) - strings.null_count:
        raise ValueError("a bool text other than t or f")
    return true


#: Hex digit -> value, 255 for any other byte (binascii.a2b_hex takes both cases).
_HEX = np.full(256, 255, dtype=np.uint8)
for _value, _digit in enumerate(b"0123456789abcdef"):
    _HEX[_digit] = _HEX[ord(chr(_digit).upper())] = _value


def _bytea(strings: pa.Array) -> pa.Array:
    r"""``\x`` and hex digits (bytea_output hex) to the bytes, for the whole column at once."""
    n = len(strings)
    if strings.offset:
        strings = pa.concat_arrays([strings])  # offset 0, so the buffers start at row 0
    if strings.offset:
        raise ValueError("an array with an offset")
    validity, offsets_buffer, data_buffer = strings.buffers()
    assert offsets_buffer is not None
    offsets = np.frombuffer(memoryview(offsets_buffer), dtype=np.int32, count=n + 1)
    data = (
        np.frombuffer(memoryview(data_buffer), np.uint8) if data_buffer else np.empty(0, np.uint8)
    )
    lengths = np.diff(offsets)
    valid = pc.is_valid(strings).to_numpy(zero_copy_only=False)
    if lengths[~valid].any():
        raise ValueError("a null slot with data")
    starts = offsets[:-1][valid]
    value_lengths = lengths[valid]
    if (value_lengths < 2).any() or (value_lengths % 2).any():
        raise ValueError("not \\x and pairs of hex digits")
    if (data[starts] != 0x5C).any() or (data[starts + 1] != 0x78).any():
        raise ValueError("not \\x")
    base, end = offsets[0], offsets[-1]
    keep = np.ones(end - base, dtype=bool)
    keep[starts - base] = False
    keep[starts - base + 1] = False
    digits = _HEX[data[base:end][keep]]
    if (digits == 255).any():
        raise ValueError("not hex digits")
    pairs = digits.reshape(-1, 2)
    out = (pairs[:, 0] << 4) | pairs[:, 1]
    out_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, (lengths - 2) // 2, 0), out=out_offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(out_offsets.data), pa.py_buffer(out.data)],
        null_count=strings.null_count,
    )


def _decimal_pattern(precision: int, scale: int) -> str:
    """The texts ``numeric_out`` prints that hold in decimal(precision, scale) exactly."""
    whole = precision - scale
    integer = "0" if whole == 0 else f"(0|[1-9][0-9]{{0,{whole - 1}}})"
    fraction = f"(\\.[0-9]{{1,{scale}}})?" if scale else ""
    return f"^-?{integer}{fraction}$"


_DATE = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
_CLOCK = "[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,6})?"

#: Base types' fast paths by OID, for the mapping type_mapping gives them.
_BY_OID: dict[int, tuple[pa.DataType, _FastPath]] = {
    16: (pa.bool_(), _FastPath(_bool)),
    21: (pa.int16(), _FastPath(_cast(pa.int16()))),
    23: (pa.int32(), _FastPath(_cast(pa.int32()))),
    20: (pa.int64(), _FastPath(_cast(pa.int64()))),
    26: (pa.int64(), _FastPath(_cast(pa.int64()))),
    28: (pa.int64(), _FastPath(_cast(pa.int64()))),
    29: (pa.int64(), _FastPath(_cast(pa.int64()))),
    5069: (pa.decimal128(20, 0), _FastPath(_cast(pa.decimal128(20, 0)))),
    700: (pa.float32(), _FastPath(_float4)),
    701: (pa.float64(), _FastPath(_cast(pa.float64()))),
    17: (pa.binary(), _FastPath(_bytea, "^\\\\x([0-9a-f]{2})*$")),
    1082: (pa.date32(), _FastPath(_cast(pa.date32()), f"^{_DATE}$")),
    1114: (pa.timestamp("us"), _FastPath(_cast(pa.timestamp("us")), f"^{_DATE} {_CLOCK}$")),
    1184: (
        pa.timestamp("us", tz="UTC"),
        _FastPath(_cast(pa.timestamp("us", tz="UTC")), f"^{_DATE} {_CLOCK}\\+00$"),
    ),
}


def _base_codec(codec: TypeCodec, registry: TypeRegistry) -> TypeCodec:
    while codec.structure == "domain" and codec.element_oid is not None:
        codec = registry.get(codec.element_oid)
    return codec


def _fast_path(oid: int, mapping: TypeMapping, registry: TypeRegistry) -> _FastPath | str | None:
    """The column's fast path; "text" when its text is its value; None when there is none."""
    if mapping.text_parser is bytes.decode:  # what ArrowBatchBuilder does: the text is kept
        return "text"
    if mapping.text_parser is not None:
        return None
    codec = registry.get(oid)
    base = _base_codec(codec, registry)
    if base.structure != "base" or base.oid not in DEFAULT_REGISTRY.codecs:
        return None
    if codec.from_text is not DEFAULT_REGISTRY.codecs[base.oid].from_text:
        return None  # a parser of the caller's own: only it knows what it makes of a text
    arrow = mapping.arrow
    if base.oid == 1700 and pa.types.is_decimal128(arrow):
        return _FastPath(_cast(arrow), _decimal_pattern(arrow.precision, arrow.scale))
    known = _BY_OID.get(base.oid)
    if known is None or known[0] != arrow:
        return None
    return known[1]


class TextColumns:
    """Types a relation's string columns (the server's text, one Arrow array per column),
    column by column, exactly as `ArrowBatchBuilder` types the same texts."""

    def __init__(
        self,
        relation: Relation,
        registry: TypeRegistry,
        options: MappingOptions,
        table_name: str | None,
    ) -> None:
        schema_name = None
        if table_name is not None:
            schema_name, _, table_name = table_name.rpartition(".")
        self.builder = ArrowBatchBuilder(
            relation, registry, options, schema_name=schema_name or None, table_name=table_name
        )
        self.names = [c.name for c in relation.columns]
        self.schema = text_columns_schema(relation, registry, options)
        self.null_policy = options.on_out_of_range == "null"
        self.fast: list[_FastPath | str | None] = [
            _fast_path(
                c.type_oid, type_mapping(c.type_oid, c.type_modifier, registry, options), registry
            )
            for c in relation.columns
        ]

    def batch(self, strings: list[pa.Array], rows: int) -> pa.RecordBatch:
        arrays: list[pa.Array] = []
        marks: dict[int, list[str]] = {}
        for i, column in enumerate(strings):
            array, nulled = self.column(i, column)
            arrays.append(array)
            for row in nulled:
                marks.setdefault(row, []).append(self.names[i])
        if self.null_policy:
            marker = self.schema.field(OUT_OF_RANGE_COLUMN).type
            if marks:
                arrays.append(pa.array([marks.get(r) for r in range(rows)], type=marker))
            else:
                arrays.append(pa.nulls(rows, type=marker))
        if not arrays:
            no_columns = cast(pa.StructArray, pa.array([{}] * rows, pa.struct([])))
            return pa.RecordBatch.from_struct_array(no_columns)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def column(self, i: int, strings: pa.Array) -> tuple[pa.Array, list[int]]:
        """Column `i` typed, and the rows the policy "null" nulled in it."""
        fast = self.fast[i]
        if fast == "text":
            return strings, []
        if strings.null_count == len(strings):
            return pa.nulls(len(strings), self.schema.field(i).type), []
        if fast is None:
            return self._fallback(i, strings)
        assert isinstance(fast, _FastPath)
        try:
            return fast.convert(strings), []
        except _REFUSED:
            pass
        if fast.pattern is None:
            return self._fallback(i, strings)
        # Convert the texts in the server's usual form in bulk, the others one by one.
        matched = pc.match_substring_regex(strings, fast.pattern)
        usual = cast(pa.BooleanArray, matched.fill_null(True))
        try:
            bulk = fast.convert(pc.if_else(usual, strings, pa.scalar(None, pa.string())))
        except _REFUSED:
            return self._fallback(i, strings)
        unusual = pc.invert(usual)
        positions = np.flatnonzero(unusual.to_numpy(zero_copy_only=False))
        try:
            values, nulled = self._fallback(i, strings.take(positions))
        except ValueOutOfRange as exc:  # its row is among the unusual ones: say which
            if exc.row is None:
                raise
            exc.row = int(positions[exc.row])
            raise
        merged = pc.replace_with_mask(bulk, unusual, values)
        return merged, [int(positions[k]) for k in nulled]

    def _fallback(self, i: int, strings: pa.Array) -> tuple[pa.Array, list[int]]:
        values = strings.cast(pa.binary()).to_pylist()
        return self.builder.column_from_text(i, values)
