"""Range and multirange types: ``range_out``/``range_send`` and ``multirange_out``/``_send``.

A `Range` has a lower and an upper bound (None where the range is unbounded on that side; a
bound can never be NULL) and the inclusivity of each in `bounds`, as ``[)``. The server
canonicalises: an unbounded side is never inclusive, and discrete ranges (int4range,
int8range, daterange) always come as ``[)``. A `Multirange` is its ranges, sorted and merged
by the server, never empty ones.

Bounds are read with the subtype's codec, looked up when a value is decoded, so the built-in
ranges work whether or not the subtype's module has registered it yet (an unknown subtype
gives its text, or `UnknownBinary` in binary mode).

Text: ``empty``, or ``[`` / ``(``, the lower bound, ``,``, the upper bound, ``]`` / ``)``; a
missing bound is unbounded; a bound is double-quoted when it is empty or holds a quote,
backslash, parenthesis, bracket, comma or white space, with ``"`` and ``\\`` doubled inside.
A multirange is ``{`` ranges separated by ``,`` ``}``.

Binary: a flags byte (empty 0x01, lower inclusive 0x02, upper inclusive 0x04, lower unbounded
0x08, upper unbounded 0x10, lower/upper NULL 0x20/0x40), then each present bound as int32
length and the subtype's send bytes. A multirange is an int32 count, then each range's binary
form with an int32 length before it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgcdc.errors import ValueDecodeError
from pgcdc.types.arrays import unquote
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeCodec, TypeRegistry, UnknownBinary

__all__ = ["EMPTY_RANGE", "Multirange", "Range", "multirange_codec", "range_codec"]

_EMPTY = 0x01
_LB_INC = 0x02
_UB_INC = 0x04
_LB_INF = 0x08
_UB_INF = 0x10
_LB_NULL = 0x20
_UB_NULL = 0x40
_NO_LOWER = _EMPTY | _LB_INF | _LB_NULL
_NO_UPPER = _EMPTY | _UB_INF | _UB_NULL

_BOUNDS_BY_FLAGS = {0: "()", _LB_INC: "[)", _UB_INC: "(]", _LB_INC | _UB_INC: "[]"}
_BOUNDS_BY_TEXT = {b"()": "()", b"[)": "[)", b"(]": "(]", b"[]": "[]"}
_VALID_BOUNDS = frozenset(_BOUNDS_BY_FLAGS.values())
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Range:
    """A range value: `lower`/`upper` None where unbounded; `bounds` says which bounds are
    inclusive (``[`` / ``]``). Every empty range is ``Range(None, None, "()", empty=True)``."""

    lower: Any = None
    upper: Any = None
    bounds: str = "[)"
    empty: bool = False

    def __post_init__(self) -> None:
        if self.bounds not in _VALID_BOUNDS:
            raise ValueError(f"invalid range bounds {self.bounds!r}")
        if self.empty and (self.lower, self.upper, self.bounds) != (None, None, "()"):
            object.__setattr__(self, "lower", None)
            object.__setattr__(self, "upper", None)
            object.__setattr__(self, "bounds", "()")

    @property
    def lower_inc(self) -> bool:
        return self.bounds[0] == "["

    @property
    def upper_inc(self) -> bool:
        return self.bounds[1] == "]"

    @property
    def lower_inf(self) -> bool:
        return not self.empty and self.lower is None

    @property
    def upper_inf(self) -> bool:
        return not self.empty and self.upper is None


#: The empty range (of any range type).
EMPTY_RANGE = Range(None, None, "()", True)


@dataclass(frozen=True, slots=True)
class Multirange:
    """A multirange value: its ranges in order, none empty (``{}`` has none)."""

    ranges: tuple[Range, ...] = ()


def _range_text(data: bytes, i: int, parse: Callable[[bytes], Any]) -> tuple[Range, int]:
    """The range whose text starts at ``data[i]``, and the index after it."""
    if data.startswith(b"empty", i):
        return EMPTY_RANGE, i + 5
    opening = data[i : i + 1]
    i += 1
    lower: Any = None
    c = data[i]
    if c == 0x22:  # '"'
        raw, i = unquote(data, i, doubled=True)
        lower = parse(raw)
    elif c != 0x2C:  # ','
        j = data.find(b",", i)
        if j < 0:
            raise ValueDecodeError(f"invalid range text {data[:200]!r}")
        lower = parse(data[i:j])
        i = j
    if data[i] != 0x2C:
        raise ValueDecodeError(f"invalid range text {data[:200]!r}")
    i += 1
    upper: Any = None
    c = data[i]
    if c == 0x22:
        raw, i = unquote(data, i, doubled=True)
        upper = parse(raw)
    elif c != 0x29 and c != 0x5D:  # ')' ']'
        j = data.find(b")", i)
        k = data.find(b"]", i)
        if j < 0 or 0 <= k < j:
            j = k
        if j < 0:
            raise ValueDecodeError(f"invalid range text {data[:200]!r}")
        upper = parse(data[i:j])
        i = j
    bounds = _BOUNDS_BY_TEXT.get(opening + data[i : i + 1])
    if bounds is None:
        raise ValueDecodeError(f"invalid range text {data[:200]!r}")
    return Range(lower, upper, bounds), i + 1


def _range_binary(data: bytes, parse: Callable[[bytes], Any]) -> Range:
    if not data:
        raise ValueDecodeError("empty range binary")
    flags = data[0]
    if flags & _EMPTY:
        if len(data) != 1:
            raise ValueDecodeError(f"empty range binary has {len(data) - 1} extra bytes")
        return EMPTY_RANGE
    pos = 1
    lower = upper = None
    try:
        if not flags & _NO_LOWER:
            (length,) = _INT32.unpack_from(data, pos)
            pos += 4 + length
            lower = parse(data[pos - length : pos])
        if not flags & _NO_UPPER:
            (length,) = _INT32.unpack_from(data, pos)
            pos += 4 + length
            upper = parse(data[pos - length : pos])
    except struct.error:
        raise ValueDecodeError(f"truncated range binary {data.hex()}") from None
    if pos != len(data):
        raise ValueDecodeError(f"range binary length mismatch: {data.hex()}")
    return Range(lower, upper, _BOUNDS_BY_FLAGS[flags & (_LB_INC | _UB_INC)])


def _subtype_parsers(
    registry: TypeRegistry, subtype: int
) -> tuple[Callable[[bytes], Any], Callable[[bytes], Any]]:
    codec = registry.get(subtype)
    if codec.from_binary is None:
        return codec.from_text, lambda data: UnknownBinary(subtype, data)
    return codec.from_text, codec.from_binary


def range_codec(
    oid: int,
    name: str,
    subtype: int,
    registry: TypeRegistry = DEFAULT_REGISTRY,
    *,
    array_oid: int | None = None,
    delimiter: str = ",",
) -> TypeCodec:
    """A range type over `subtype`, whose codec is taken from `registry` at each decode."""

    def from_text(data: bytes) -> Range:
        try:
            value, end = _range_text(data, 0, registry.get(subtype).from_text)
        except IndexError:
            raise ValueDecodeError(f"truncated range text {data[:200]!r}") from None
        if end != len(data):
            raise ValueDecodeError(f"junk after range text {data[:200]!r}")
        return value

    def from_binary(data: bytes) -> Range:
        return _range_binary(data, _subtype_parsers(registry, subtype)[1])

    return TypeCodec(
        oid,
        name,
        from_text,
        from_binary,
        array_oid,
        delimiter,
        element_oid=subtype,
        structure="range",
    )


def multirange_codec(
    oid: int,
    name: str,
    subtype: int,
    range_oid: int,
    registry: TypeRegistry = DEFAULT_REGISTRY,
    *,
    array_oid: int | None = None,
    delimiter: str = ",",
) -> TypeCodec:
    """A multirange type of the range type `range_oid` over `subtype`."""

    def from_text(data: bytes) -> Multirange:
        if data[:1] != b"{" or data[-1:] != b"}":
            raise ValueDecodeError(f"invalid multirange text {data[:200]!r}")
        if data == b"{}":
            return Multirange()
        parse = registry.get(subtype).from_text
        ranges = []
        i = 1
        try:
            while True:
                value, i = _range_text(data, i, parse)
                ranges.append(value)
                if data[i] != 0x2C:
                    break
                i += 1
        except IndexError:
            raise ValueDecodeError(f"truncated multirange text {data[:200]!r}") from None
        if i != len(data) - 1:
            raise ValueDecodeError(f"invalid multirange text {data[:200]!r}")
        return Multirange(tuple(ranges))

    def from_binary(data: bytes) -> Multirange:
        parse = _subtype_parsers(registry, subtype)[1]
        ranges = []
        try:
            (count,) = _INT32.unpack_from(data)
            pos = 4
            for _ in range(count):
                (length,) = _INT32.unpack_from(data, pos)
                pos += 4 + length
                if pos > len(data):
                    raise ValueDecodeError("multirange binary range runs past the end")
                ranges.append(_range_binary(data[pos - length : pos], parse))
        except struct.error:
            raise ValueDecodeError(f"truncated multirange binary {data[:64].hex()}") from None
        if pos != len(data):
            raise ValueDecodeError("multirange binary has bytes after its ranges")
        return Multirange(tuple(ranges))

    return TypeCodec(
        oid,
        name,
        from_text,
        from_binary,
        array_oid,
        delimiter,
        element_oid=range_oid,
        structure="multirange",
    )


# (range OID, name, subtype, array OID, multirange OID, its name, its array OID)
_BUILT_IN = (
    (3904, "int4range", 23, 3905, 4451, "int4multirange", 6150),
    (3906, "numrange", 1700, 3907, 4532, "nummultirange", 6151),
    (3908, "tsrange", 1114, 3909, 4533, "tsmultirange", 6152),
    (3910, "tstzrange", 1184, 3911, 4534, "tstzmultirange", 6153),
    (3912, "daterange", 1082, 3913, 4535, "datemultirange", 6155),
    (3926, "int8range", 20, 3927, 4536, "int8multirange", 6157),
)
for _oid, _name, _sub, _array, _moid, _mname, _marray in _BUILT_IN:
    DEFAULT_REGISTRY.add(range_codec(_oid, _name, _sub, array_oid=_array))
    DEFAULT_REGISTRY.add(multirange_codec(_moid, _mname, _sub, _oid, array_oid=_marray))
