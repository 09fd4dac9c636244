"""PostgreSQL types to Arrow and Spark types, and decoded values to what those types hold.

Spark's Python data sources accept only Arrow batches whose schema is exactly the one Spark
derives from the declared Spark schema (``pyspark.sql.pandas.types.to_arrow_type``, with the
UTC time zone); so `spark_type` and `arrow_type` are built side by side and agree type for type
(the tests check every built-in and structured type).

====================================  ==================================  ========================
PostgreSQL                            Spark                               Arrow
====================================  ==================================  ========================
bool                                  BooleanType                         bool
int2 / int4 / int8                    ShortType / IntegerType / LongType  int16 / int32 / int64
oid, xid, cid                         LongType                            int64
xid8                                  DecimalType(20,0)                   decimal128(20,0)
float4 / float8                       FloatType / DoubleType              float / double
numeric(p,s), p <= 38, 0 <= s <= p    DecimalType(p,s)                    decimal128(p,s)
numeric (unconstrained, p > 38,       StringType; DecimalType(38,s)       string; decimal128(38,s)
s < 0 or s > p)                       with unbounded_numeric_scale=s
money                                 DecimalType(19,2)                   decimal128(19,2)
bytea                                 BinaryType                          binary
date                                  DateType                            date32
timestamp                             TimestampNTZType                    timestamp[us]
timestamptz                           TimestampType                       timestamp[us, tz=UTC]
time                                  StringType; TimeType with           string; time64[ns]
                                      time="time"
interval                              StringType; DayTimeIntervalType     string; duration[us]
                                      with interval="day_time"
json, jsonb                           StringType; VariantType with        string; struct<value,
                                      json="variant"                      metadata>
text, varchar, bpchar, name, "char",  StringType (the server's text)      string
xml, uuid, inet, cidr, macaddr,
macaddr8, bit, varbit, pg_lsn,
tsvector, tsquery, timetz, point,
line, lseg, box, path, polygon,
circle, enums, unknown types
T[]                                   ArrayType(T, containsNull=True);    list<element: T>;
                                      StringType with arrays="string"     string
                                      (T a domain over an array: an
                                      array of arrays, one dimension)
range of T                            StructType(lower T, upper T,        struct<lower, upper,
                                      bounds string, empty boolean)       bounds, empty>
multirange of T                       ArrayType(the range's struct)       list<struct<...>>
composite                             StructType of its fields            struct<...>
pg_snapshot, txid_snapshot            StructType(xmin, xmax xid8,         struct<xmin, xmax,
                                      xip array of xid8)                  xip>
domain                                its base type's mapping             (the same)
====================================  ==================================  ========================

xid8 is an unsigned 64-bit number (epoch and xid): Spark has no unsigned long, and LongType would
turn the upper half of the range negative or refuse it; decimal(20,0) holds every value exactly
and orders them as the server does. A snapshot's ids map as xid8s.

A string column holds the server's own text of the value: in text mode the bytes as sent; in
binary mode the decoded value written back the way the type's output function writes it
(`text_renderer`: inet without ``/32``, floats in ``float8out``'s shortest form, ``array_out``
and ``record_out`` quoting, ...). A range bound that is null is an unbounded side (PostgreSQL
bounds are never NULL). A domain column's typmod is not sent (the domain's is in the catalog),
so a domain over ``numeric(10,2)`` maps like unconstrained numeric.

Values the Spark type cannot hold exactly raise `NotRepresentable` from the converters; the
batch builder (`pgcdc.types.arrow`) turns that into the out-of-range policy: dates and
timestamps outside 0001-01-01 .. 9999-12-31 (Spark's range) and ``±infinity``; numerics that do
not fit their decimal (never rounded) and NaN/Infinity; multi-dimensional arrays and arrays
whose lower bound is not 1 (``arrays="list"``); intervals with months, or infinite, as
day-time intervals; ``24:00:00`` as TimeType; the binary form of a type pgcdc cannot render.

This module (and `pgcdc.types.arrow`) import pyarrow and pyspark, pgcdc's ``spark`` extra;
the rest of `pgcdc.types` does not need them.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import ROUND_FLOOR, Context, Decimal, Inexact, InvalidOperation, localcontext
from functools import partial
from ipaddress import IPv4Interface, IPv4Network, IPv6Interface, IPv6Network
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import types as st

from pgcdc.types.arrays import PgArray, parse_array_text
from pgcdc.types.registry import TypeCodec, TypeRegistry, UnknownBinary
from pgcdc.types.values import USECS_PER_DAY, PgTime, PgTimestamp

__all__ = [
    "DEFAULT_OPTIONS",
    "MappingOptions",
    "NotRepresentable",
    "TypeMapping",
    "arrow_type",
    "float4_text",
    "float8_text",
    "inet_text",
    "numeric_typmod",
    "spark_type",
    "text_renderer",
    "type_mapping",
]


class NotRepresentable(Exception):
    """A value has no exact representation in its column's Spark type; the batch builder
    applies the out-of-range policy (raise `pgcdc.errors.ValueOutOfRange`, or null and mark)."""


@dataclass(frozen=True, slots=True)
class MappingOptions:
    """The choices of the mapping; the defaults keep every value exact or refuse it.

    * `on_out_of_range`: "error" raises `pgcdc.errors.ValueOutOfRange`; "null" stores null and
      lists the column in the row's ``_pgcdc_out_of_range`` column.
    * `arrays`: "list" (one-dimensional arrays with lower bound 1) or "string" (array_out text).
    * `unbounded_numeric_scale`: None maps numeric without a usable (p, s) to its text; an int
      s maps it to DecimalType(38, s), a value that does not fit following the policy.
    * `interval`: "string" (the server's text) or "day_time" (DayTimeIntervalType; a day is
      24 hours; an interval with months follows the policy).
    * `json`: "string" or "variant" (json and jsonb as VariantType, encoded by pyspark's own
      ``VariantUtils.parse_json``; json's duplicate keys keep the last value, as jsonb does).
    * `time`: "string" or "time" (TimeType, Arrow time64[ns]; 24:00:00 follows the policy).
    """

    on_out_of_range: Literal["error", "null"] = "error"
    arrays: Literal["list", "string"] = "list"
    unbounded_numeric_scale: int | None = None
    interval: Literal["string", "day_time"] = "string"
    json: Literal["string", "variant"] = "string"
    time: Literal["string", "time"] = "string"

    def __post_init__(self) -> None:
        choices = {
            "on_out_of_range": ("error", "null"),
            "arrays": ("list", "string"),
            "interval": ("string", "day_time"),
            "json": ("string", "variant"),
            "time": ("string", "time"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"MappingOptions.{name} must be one of {allowed}")
        scale = self.unbounded_numeric_scale
        if scale is not None and not 0 <= scale <= 38:
            raise ValueError("MappingOptions.unbounded_numeric_scale must be in 0..38")


Converter = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class TypeMapping:
    """One type's Spark and Arrow types and how its decoded values become what pyarrow takes.

    `convert` is None when the decoded value already is (int, str, bytes, ...); it raises
    `NotRepresentable` for values the type cannot hold. `text_parser`, when set, goes from the
    text form straight to the converted value, skipping the codec (a string column's text is
    its value). `is_text`: the column holds the server's text of the value."""

    spark: st.DataType
    arrow: pa.DataType
    convert: Converter | None = None
    text_parser: Converter | None = None
    is_text: bool = False


DEFAULT_OPTIONS = MappingOptions()


def arrow_type(
    oid: int, typmod: int, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> pa.DataType:
    """The Arrow type of a column of type `oid` (with `typmod`, -1 for none)."""
    return type_mapping(oid, typmod, registry, options).arrow


def spark_type(
    oid: int, typmod: int, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> st.DataType:
    """The Spark type of a column of type `oid`; ``to_arrow_type`` of it is `arrow_type`."""
    return type_mapping(oid, typmod, registry, options).spark


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric typmod, None when unconstrained. The scale is an 11-bit
    two's complement field: PostgreSQL 15+ allows negative scales and scales above p."""
    if typmod < 4:  # VARHDRSZ: no typmod
        return None
    value = typmod - 4
    return (value >> 16) & 0xFFFF, ((value & 0x7FF) ^ 0x400) - 0x400


# --- the mapping --------------------------------------------------------------------------

_STRING = (st.StringType(), pa.string())
#: Types whose decoded values pyarrow takes as they are: OID -> (Spark, Arrow).
_PLAIN: dict[int, tuple[st.DataType, pa.DataType]] = {
    16: (st.BooleanType(), pa.bool_()),
    21: (st.ShortType(), pa.int16()),
    23: (st.IntegerType(), pa.int32()),
    20: (st.LongType(), pa.int64()),
    26: (st.LongType(), pa.int64()),
    28: (st.LongType(), pa.int64()),  # xid: uint32
    29: (st.LongType(), pa.int64()),  # cid: uint32
    700: (st.FloatType(), pa.float32()),
    701: (st.DoubleType(), pa.float64()),
    17: (st.BinaryType(), pa.binary()),
    790: (st.DecimalType(19, 2), pa.decimal128(19, 2)),  # int64 cents: always fits
}
_JSON_OIDS = (114, 3802)
_SNAPSHOT_OIDS = (5038, 2970)  # pg_snapshot, txid_snapshot


def type_mapping(
    oid: int, typmod: int, registry: TypeRegistry, options: MappingOptions = DEFAULT_OPTIONS
) -> TypeMapping:
    """How a column of type `oid` maps (see the module docstring's table)."""
    codec = registry.get(oid)
    structure = codec.structure
    if structure == "domain" and codec.element_oid is not None:
        return type_mapping(codec.element_oid, typmod, registry, options)
    if structure == "array" and codec.element_oid is not None:
        return _array_mapping(codec, typmod, registry, options)
    if structure == "range" and codec.element_oid is not None:
        return _range_mapping(type_mapping(codec.element_oid, -1, registry, options))
    if structure == "multirange" and codec.element_oid is not None:
        ranges = type_mapping(codec.element_oid, -1, registry, options)
        convert = ranges.convert
        assert convert is not None  # a range always converts (Range -> dict)
        return TypeMapping(
            st.ArrayType(ranges.spark, containsNull=True),
            _list(ranges.arrow),
            lambda value: [convert(r) for r in value.ranges],
        )
    if structure == "composite":
        return _composite_mapping(codec, registry, options)
    if structure == "base":
        plain = _PLAIN.get(oid)
        if plain is not None:
            return TypeMapping(*plain)
        special = _special_mapping(oid, typmod, options)
        if special is not None:
            return special
    return _text_mapping(text_renderer(oid, registry))


def _text_mapping(render: Converter) -> TypeMapping:
    convert = None if render is _str else render  # decoded text-like values are the text
    return TypeMapping(*_STRING, convert=convert, text_parser=bytes.decode, is_text=True)


def _special_mapping(oid: int, typmod: int, options: MappingOptions) -> TypeMapping | None:
    """Built-in base types with their own Spark type, or None for a string mapping."""
    if oid == 1082:
        return TypeMapping(st.DateType(), pa.date32(), _check_type(date, "date"))
    if oid == 1114:
        return TypeMapping(
            st.TimestampNTZType(), pa.timestamp("us"), _check_type(datetime, "timestamp")
        )
    if oid == 1184:
        arrow = pa.timestamp("us", tz="UTC")
        return TypeMapping(st.TimestampType(), arrow, _check_type(datetime, "timestamp"))
    if oid == 1700:
        ps = numeric_typmod(typmod)
        if ps is not None and ps[0] <= 38 and 0 <= ps[1] <= ps[0]:
            return _decimal_mapping(*ps)
        if options.unbounded_numeric_scale is not None:
            return _decimal_mapping(38, options.unbounded_numeric_scale)
        return None
    if oid == 1083 and options.time == "time":
        return TypeMapping(st.TimeType(), pa.time64("ns"), _check_type(time, "time"))
    if oid == 1186 and options.interval == "day_time":
        return TypeMapping(st.DayTimeIntervalType(), pa.duration("us"), _day_time)
    if oid in _JSON_OIDS and options.json == "variant":
        return _variant_mapping()
    if oid == 5069:
        return TypeMapping(*_XID8, Decimal)
    if oid in _SNAPSHOT_OIDS:
        return _snapshot_mapping()
    return None


#: xid8, unsigned 64-bit: every value fits 20 digits.
_XID8 = (st.DecimalType(20, 0), pa.decimal128(20, 0))


def _snapshot_mapping() -> TypeMapping:
    spark, arrow = _XID8
    xip_spark = st.ArrayType(spark, containsNull=True)

    def convert(value: Any) -> dict[str, Any]:
        return {
            "xmin": Decimal(value.xmin),
            "xmax": Decimal(value.xmax),
            "xip": [Decimal(x) for x in value.xip],
        }

    return TypeMapping(
        st.StructType(
            [
                st.StructField("xmin", spark, True),
                st.StructField("xmax", spark, True),
                st.StructField("xip", xip_spark, True),
            ]
        ),
        pa.struct(
            [pa.field("xmin", arrow), pa.field("xmax", arrow), pa.field("xip", _list(arrow))]
        ),
        convert,
    )


def _check_type(kind: type, what: str) -> Converter:
    """A converter passing values of exactly `kind` (``datetime``'s range is Spark's: years
    1..9999) and refusing the rest (PgDate, PgTimestamp, PgTime, Infinity)."""

    def convert(value: Any) -> Any:
        if type(value) is kind:
            return value
        raise NotRepresentable(f"is outside what Spark's {what} type can hold")

    return convert


def _day_time(value: Any) -> int:
    if value.months or value.is_infinite:
        raise NotRepresentable("has months (or is infinite): not a day-time interval")
    us = value.days * USECS_PER_DAY + value.microseconds
    if not -(2**63) <= us < 2**63:
        raise NotRepresentable("is beyond a day-time interval's range")
    return us


def _decimal_mapping(precision: int, scale: int) -> TypeMapping:
    quantum = Decimal(1).scaleb(-scale)
    context = Context(prec=precision, traps=[InvalidOperation, Inexact])

    def convert(value: Decimal) -> Decimal:
        if value.is_finite():
            try:
                return value.quantize(quantum, context=context)
            except ArithmeticError:
                pass
        raise NotRepresentable(f"does not fit decimal({precision},{scale})")

    return TypeMapping(st.DecimalType(precision, scale), pa.decimal128(precision, scale), convert)


def _variant_mapping() -> TypeMapping:
    from pyspark.sql.variant_utils import VariantUtils

    arrow = pa.struct(
        [
            pa.field("value", pa.binary(), nullable=False),
            pa.field("metadata", pa.binary(), nullable=False, metadata={b"variant": b"true"}),
        ]
    )

    def convert(text: str) -> dict[str, bytes]:
        try:
            value, metadata = VariantUtils.parse_json(text)
        except Exception as exc:  # size limits, numbers Python's json cannot read
            raise NotRepresentable(f"cannot be a Spark variant ({exc})") from None
        return {"value": value, "metadata": metadata}

    return TypeMapping(st.VariantType(), arrow, convert)


def _list(element: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", element, nullable=True))


def _array_mapping(
    codec: TypeCodec, typmod: int, registry: TypeRegistry, options: MappingOptions
) -> TypeMapping:
    assert codec.element_oid is not None
    if options.arrays == "string":
        return _text_mapping(text_renderer(codec.oid, registry))
    # An array column's typmod is its element's (numeric(10,2)[]).
    element = type_mapping(codec.element_oid, typmod, registry, options)
    convert_element = element.convert
    # Elements that are arrays (a domain over an array) are lists: a list of them is one
    # dimension, and a multi-dimensional array of them is a PgArray (pgcdc.types.arrays).
    nested = registry.holds_arrays(codec.element_oid)

    def convert(value: Any) -> list[Any]:
        if type(value) is not list:
            if len(value.lower_bounds) > 1:
                raise NotRepresentable("is a multi-dimensional array; arrays map to 1-D lists")
            raise NotRepresentable(f"has lower bounds {value.lower_bounds}, not 1")
        if value and type(value[0]) is list and not nested:
            raise NotRepresentable("is a multi-dimensional array; arrays map to 1-D lists")
        if convert_element is None:
            return value
        return [None if v is None else convert_element(v) for v in value]

    text_parser = None
    if element.is_text:  # the elements' texts are the values: no need to parse them
        delim = registry.get(codec.element_oid).delimiter.encode()
        parse = partial(parse_array_text, parse=bytes.decode, delim=delim, text=True)

        def text_parser(data: bytes) -> list[Any]:
            value = parse(data)
            if type(value) is not list or (value and type(value[0]) is list):
                return convert(value)  # raises
            return value

    return TypeMapping(
        st.ArrayType(element.spark, containsNull=True),
        _list(element.arrow),
        convert,
        text_parser,
    )


def _range_mapping(bound: TypeMapping) -> TypeMapping:
    spark = st.StructType(
        [
            st.StructField("lower", bound.spark, True),
            st.StructField("upper", bound.spark, True),
            st.StructField("bounds", st.StringType(), True),
            st.StructField("empty", st.BooleanType(), True),
        ]
    )
    arrow = pa.struct(
        [
            pa.field("lower", bound.arrow),
            pa.field("upper", bound.arrow),
            pa.field("bounds", pa.string()),
            pa.field("empty", pa.bool_()),
        ]
    )
    convert_bound = bound.convert

    def convert(value: Any) -> dict[str, Any]:
        lower, upper = value.lower, value.upper
        if convert_bound is not None:
            lower = None if lower is None else convert_bound(lower)
            upper = None if upper is None else convert_bound(upper)
        return {"lower": lower, "upper": upper, "bounds": value.bounds, "empty": value.empty}

    return TypeMapping(spark, arrow, convert)


def _composite_mapping(
    codec: TypeCodec, registry: TypeRegistry, options: MappingOptions
) -> TypeMapping:
    fields: Sequence[tuple[str, int]] = codec.extra.get("fields", ())
    mappings = [(name, type_mapping(oid, -1, registry, options)) for name, oid in fields]
    spark = st.StructType([st.StructField(name, m.spark, True) for name, m in mappings])
    arrow = pa.struct([pa.field(name, m.arrow) for name, m in mappings])
    converters = [(name, m.convert) for name, m in mappings if m.convert is not None]
    if not converters:
        return TypeMapping(spark, arrow)  # the decoded dict is what pyarrow takes

    def convert(value: dict[str, Any]) -> dict[str, Any]:
        value = dict(value)
        for name, field_convert in converters:
            v = value[name]
            if v is not None:
                value[name] = field_convert(v)
        return value

    return TypeMapping(spark, arrow, convert)


# --- the server's text of decoded values ---------------------------------------------------


def text_renderer(oid: int, registry: TypeRegistry) -> Converter:
    """A function writing a decoded value of type `oid` as the type's output function does
    (with pgcdc's pinned session settings), for string columns fed by binary mode."""
    codec = registry.get(oid)
    structure = codec.structure
    element = codec.element_oid
    if structure == "domain" and element is not None:
        return text_renderer(element, registry)
    if structure == "array" and element is not None:
        render_element = text_renderer(element, registry)
        delimiter = registry.get(element).delimiter
        return _array_text(render_element, delimiter, nested=registry.holds_arrays(element))
    if structure == "range" and element is not None:
        return partial(_range_text, text_renderer(element, registry))
    if structure == "multirange" and element is not None:
        render_range = text_renderer(element, registry)
        return lambda value: "{" + ",".join(render_range(r) for r in value.ranges) + "}"
    if structure == "enum":
        return _str
    if structure == "composite":
        fields = codec.extra.get("fields", ())
        renderers = [(name, text_renderer(oid, registry)) for name, oid in fields]
        return partial(_record_text, renderers)
    if structure == "base":
        render = _BASE_TEXT.get(oid)
        if render is not None:
            return render
    return _unknown_text


def _unknown_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, UnknownBinary):
        raise NotRepresentable(
            f"is the binary form of type {value.type_oid}, which pgcdc cannot write as text "
            "(stream in text mode)"
        )
    raise NotRepresentable(f"({type(value).__name__}) has no known text form")


_WHITESPACE = " \t\n\r\v\f"
_RECORD_QUOTE = re.compile(r'[\\"(),' + _WHITESPACE + "]")
_RANGE_QUOTE = re.compile(r'[\\"()\[\],' + _WHITESPACE + "]")


def _doubled(text: str, pattern: re.Pattern[str]) -> str:
    """A field as ``record_out`` / a bound as ``range_out`` write it: quoted when empty or
    holding a special character, with ``"`` and ``\\`` doubled inside."""
    if text and pattern.search(text) is None:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _record_text(renderers: list[tuple[str, Converter]], value: dict[str, Any]) -> str:
    parts = []
    for name, render in renderers:
        v = value[name]
        parts.append("" if v is None else _doubled(render(v), _RECORD_QUOTE))
    return "(" + ",".join(parts) + ")"


def _range_text(render: Converter, value: Any) -> str:
    if value.empty:
        return "empty"
    lower = "" if value.lower is None else _doubled(render(value.lower), _RANGE_QUOTE)
    upper = "" if value.upper is None else _doubled(render(value.upper), _RANGE_QUOTE)
    return f"{value.bounds[0]}{lower},{upper}{value.bounds[1]}"


def _array_text(render: Converter, delimiter: str, *, nested: bool = False) -> Converter:
    """``array_out``: ``[lo:hi]=`` dimensions when a lower bound is not 1, braces per
    dimension, NULL for nulls; an element is quoted (backslash escapes) when empty, spelling
    NULL in any case, or holding a quote, backslash, brace, the delimiter or white space.
    `nested`: the elements are arrays (lists), so a list is one dimension, and a `PgArray`
    has one per lower bound."""
    quote = re.compile('[\\\\"{}' + re.escape(delimiter) + _WHITESPACE + "]")

    def element(v: Any) -> str:
        if v is None:
            return "NULL"
        text = render(v)
        if text and quote.search(text) is None and text.upper() != "NULL":
            return text
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def level(values: list[Any], depth: int) -> str:
        if depth == 1:
            return "{" + delimiter.join(map(element, values)) + "}"
        return "{" + delimiter.join(level(v, depth - 1) for v in values) + "}"

    def render_array(value: Any) -> str:
        prefix = ""
        values = value
        if isinstance(value, PgArray):
            values = value.values
        dims: list[int] = []
        inner = values
        ndim = len(value.lower_bounds) if isinstance(value, PgArray) else 1 if nested else None
        while type(inner) is list and inner and len(dims) != ndim:
            dims.append(len(inner))
            inner = inner[0]
        if isinstance(value, PgArray) and any(lo != 1 for lo in value.lower_bounds):
            bounds = zip(value.lower_bounds, dims, strict=True)
            prefix = "".join(f"[{lo}:{lo + n - 1}]" for lo, n in bounds) + "="
        if not dims:
            return prefix + "{}"
        return prefix + level(values, len(dims))

    return render_array


def _str(value: Any) -> str:
    return value


def _bool_text(value: bool) -> str:
    return "t" if value else "f"


def _numeric_text(value: Decimal) -> str:
    return format(value, "f")  # plain digits with the display scale; NaN, Infinity as named


def _money_text(value: Decimal) -> str:
    """``cash_out`` in the C locale (``-$1,234.56``); other lc_monetary settings differ."""
    sign = "-" if value < 0 else ""
    return f"{sign}${abs(value):,.2f}"


def _bytea_text(value: bytes) -> str:
    return "\\x" + value.hex()


def _bits_text(value: Any) -> str:
    return value.bits


_FLOAT_SPECIALS = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _float_text(digits: str, exponent: int, negative: bool, fixed_below: int) -> str:
    """``float8out``/``float4out`` (Ryu): shortest `digits` with the first digit's decimal
    `exponent`, fixed-point for -4 <= exponent < `fixed_below`, else ``d.ddde±XX``."""
    sign = "-" if negative else ""
    n = len(digits)
    if -4 <= exponent < fixed_below:
        if exponent < 0:
            return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
        if n <= exponent + 1:
            return sign + digits + "0" * (exponent + 1 - n)
        return f"{sign}{digits[: exponent + 1]}.{digits[exponent + 1 :]}"
    mantissa = digits[0] + ("." + digits[1:] if n > 1 else "")
    return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


def _special_float(value: float) -> str | None:
    if value != value:
        return "NaN"
    if value in _FLOAT_SPECIALS:
        return _FLOAT_SPECIALS[value]
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    return None


def float8_text(value: float) -> str:
    """A float8 as the server prints it with extra_float_digits > 0."""
    special = _special_float(value)
    if special is not None:
        return special
    # repr is the shortest string that reads back as `value` (and the closest such): Ryu's.
    shortest = Decimal(repr(value))
    digits = "".join(map(str, shortest.as_tuple().digits)).rstrip("0")
    return _float_text(digits, shortest.adjusted(), value < 0, 15)


_F4 = struct.Struct(">f")
_U4 = struct.Struct(">I")


def float4_text(value: float) -> str:
    """A float4 (held in a Python float) as the server prints it with extra_float_digits > 0:
    the shortest decimal that reads back as the same float32, the closest one on ties."""
    special = _special_float(value)
    if special is not None:
        return special
    magnitude = abs(value)
    bits = _U4.unpack(_F4.pack(magnitude))[0]
    below = _F4.unpack(_U4.pack(bits - 1))[0]
    above = _F4.unpack(_U4.pack(bits + 1))[0] if bits + 1 < 0x7F800000 else None
    with localcontext() as ctx:
        ctx.prec = 200  # exact: float32 midpoints have far fewer digits
        x = Decimal(magnitude)
        low = (Decimal(below) + x) / 2
        high = (Decimal(above) + x) / 2 if above is not None else x + (x - low)
        inclusive = bits % 2 == 0  # round-half-even reads a midpoint back as the even one
        exponent = x.adjusted() + 1
        while True:
            step = Decimal(1).scaleb(exponent)
            floor = (x / step).to_integral_value(ROUND_FLOOR) * step
            found = [
                c
                for c in (floor, floor + step)
                if c > 0 and (low < c < high or (inclusive and c in (low, high)))
            ]
            if found:
                best = min(found, key=lambda c: (abs(c - x), c))
                break
            exponent -= 1
        best = best.normalize()
    digits = "".join(map(str, best.as_tuple().digits))
    return _float_text(digits, best.adjusted(), value < 0, 6)


def _ipv6_text(packed: bytes) -> str:
    """``inet_net_ntop_ipv6`` without the mask: the longest run (>= 2, the first on ties) of
    zero words as ``::``, and ``::a.b.c.d`` / ``::ffff:a.b.c.d`` for embedded IPv4."""
    words = struct.unpack(">8H", packed)
    best_base, best_len = -1, 0
    run_base, run_len = -1, 0
    for i, word in enumerate((*words, 1)):  # a sentinel non-zero word closes a final run
        if word == 0:
            if run_base < 0:
                run_base, run_len = i, 1
            else:
                run_len += 1
        elif run_base >= 0:
            if best_base < 0 or run_len > best_len:
                best_base, best_len = run_base, run_len
            run_base = -1
    if best_len < 2:
        best_base = -1
    out = ""
    for i in range(8):
        if best_base >= 0 and best_base <= i < best_base + best_len:
            if i == best_base:
                out += ":"
            continue
        if i:
            out += ":"
        if (
            i == 6
            and best_base == 0
            and (
                best_len == 6
                or (best_len == 7 and words[7] != 1)
                or (best_len == 5 and words[5] == 0xFFFF)
            )
        ):
            return out + ".".join(str(b) for b in packed[12:])
        out += f"{words[i]:x}"
    if best_base >= 0 and best_base + best_len == 8:
        out += ":"
    return out


def inet_text(value: IPv4Interface | IPv6Interface | IPv4Network | IPv6Network) -> str:
    """``inet_out`` / ``cidr_out``: the address (IPv4 always with four octets), then ``/bits``
    unless an inet's mask is full-length; cidr always shows it."""
    if isinstance(value, IPv4Interface | IPv6Interface):
        address, bits, cidr = value.ip, value.network.prefixlen, False
    else:
        address, bits, cidr = value.network_address, value.prefixlen, True
    if address.version == 4:
        text = str(address)
        full = 32
    else:
        text = _ipv6_text(address.packed)
        full = 128
    return text if bits == full and not cidr else f"{text}/{bits}"


def _point(p: Any) -> str:
    return f"({float8_text(p.x)},{float8_text(p.y)})"


def _points(points: Sequence[Any]) -> str:
    return ",".join(map(_point, points))


def _line_text(v: Any) -> str:
    return f"{{{float8_text(v.a)},{float8_text(v.b)},{float8_text(v.c)}}}"


def _lseg_text(v: Any) -> str:
    return f"[{_point(v.p1)},{_point(v.p2)}]"


def _box_text(v: Any) -> str:
    return f"{_point(v.high)},{_point(v.low)}"


def _path_text(v: Any) -> str:
    return f"({_points(v.points)})" if v.closed else f"[{_points(v.points)}]"


def _polygon_text(v: Any) -> str:
    return f"({_points(v.points)})"


def _circle_text(v: Any) -> str:
    return f"<{_point(v.center)},{float8_text(v.radius)}>"


_EPOCH = datetime(2000, 1, 1)


def _date_text(value: Any) -> str:
    if type(value) is date:
        return value.isoformat()
    return str(value)  # PgDate, Infinity


def _microseconds(value: datetime) -> int:
    delta = value.replace(tzinfo=None) - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_text(value: Any) -> str:
    if type(value) is datetime:
        return str(PgTimestamp(_microseconds(value), value.tzinfo is not None))
    return str(value)  # PgTimestamp, Infinity


def _clock(value: time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def _time_text(value: Any) -> str:
    if type(value) is time:
        return str(PgTime(_clock(value)))
    return str(value)  # PgTime (24:00:00)


def _timetz_text(value: Any) -> str:
    if type(value) is time:
        offset = value.utcoffset()
        seconds = 0 if offset is None else int(offset.total_seconds())
        return str(PgTime(_clock(value), seconds))
    return str(value)


_BASE_TEXT: dict[int, Converter] = {
    16: _bool_text,
    21: str,
    23: str,
    20: str,
    26: str,
    700: float4_text,
    701: float8_text,
    1700: _numeric_text,
    790: _money_text,
    17: _bytea_text,
    1560: _bits_text,
    1562: _bits_text,
    869: inet_text,
    650: inet_text,
    600: _point,
    628: _line_text,
    601: _lseg_text,
    603: _box_text,
    602: _path_text,
    604: _polygon_text,
    718: _circle_text,
    2950: str,
    3220: str,
    28: str,
    29: str,
    5069: str,
    5038: str,  # PgSnapshot's str is pg_snapshot_out's text
    2970: str,
    1082: _date_text,
    1083: _time_text,
    1266: _timetz_text,
    1114: _timestamp_text,
    1184: _timestamp_text,
    1186: str,
}
for _oid in (25, 1043, 1042, 19, 18, 114, 142, 3802, 3614, 3615, 829, 774):
    _BASE_TEXT[_oid] = _str
