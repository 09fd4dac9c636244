"""The type registry: for each type OID, how to read its text and binary forms.

A `TypeCodec` knows one type: its parsers for the output function's text (``t`` columns) and
the send function's bytes (``b`` columns, with ``binary 'true'``). `TypeRegistry` maps OIDs to
codecs; built-in types are registered by the modules of this package at import, types only
known through the catalog (enums, domains, composites, arrays of them) are added by
`pgcdc.types.catalog.resolve`. An OID nobody knows decodes to its text (a ``str``) — never an
error, never a guess — and, in binary mode, to `UnknownBinary`.

Values come from the server already converted to the session's settings, which pgcdc pins
(DateStyle ISO, IntervalStyle postgres, TimeZone UTC, extra_float_digits 3, bytea_output hex);
text parsers assume those settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_REGISTRY",
    "TypeCodec",
    "TypeRegistry",
    "UnknownBinary",
    "register",
]

TextParser = Callable[[bytes], Any]
BinaryParser = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class UnknownBinary:
    """The binary send form of a type pgcdc does not know (ask for text to get a str)."""

    type_oid: int
    data: bytes


@dataclass(frozen=True, slots=True)
class TypeCodec:
    """One type: its OID, name and parsers. `array_oid` is the type's array type, if any."""

    oid: int
    name: str
    from_text: TextParser
    from_binary: BinaryParser | None = None
    array_oid: int | None = None
    #: Element separator in the array text form (``;`` for box, ``,`` otherwise).
    delimiter: str = ","
    #: For array, range, multirange and domain codecs: the OID they are built on.
    element_oid: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: What the type is made of, for mapping it to Arrow and Spark: "base", "array",
    #: "range", "multirange", "domain", "enum", "composite" (extra["fields"] holds
    #: (name, type OID) pairs) or "unknown" (text fallback).
    structure: str = "base"

    def decode(self, kind: int, data: bytes) -> Any:
        """The value of one TupleData column: `kind` is ord('t') or ord('b')."""
        if kind == 0x62:  # 'b'
            if self.from_binary is None:
                return UnknownBinary(self.oid, data)
            return self.from_binary(data)
        return self.from_text(data)


def _text(data: bytes) -> str:
    return data.decode()


class TypeRegistry:
    """Codecs by type OID.

    The array type of every codec with an `array_oid` is known too: its codec is built from
    the element's on first `get` (and rebuilt after any `add`, which may replace the element),
    so type modules register element types only, in any order."""

    def __init__(self, codecs: dict[int, TypeCodec] | None = None) -> None:
        self.codecs: dict[int, TypeCodec] = dict(codecs or {})
        #: Array OID -> element OID, for the array codecs `get` builds (cached in _arrays).
        self._element_of: dict[int, int] = {
            c.array_oid: c.oid for c in self.codecs.values() if c.array_oid
        }
        self._arrays: dict[int, TypeCodec] = {}

    def add(self, codec: TypeCodec) -> TypeCodec:
        self.codecs[codec.oid] = codec
        if codec.array_oid:
            self._element_of[codec.array_oid] = codec.oid
        self._arrays.clear()
        return codec

    def get(self, oid: int) -> TypeCodec:
        """The codec for `oid`; an unknown OID gets the text fallback."""
        codec = self.codecs.get(oid)
        if codec is None:
            codec = self._arrays.get(oid)
            if codec is None:
                element = self._element_of.get(oid)
                if element is None:
                    return TypeCodec(oid, f"unknown type {oid}", _text, structure="unknown")
                from pgcdc.types.arrays import array_codec  # imports this module

                nested = self.holds_arrays(element)
                codec = array_codec(self.codecs[element], oid, nested=nested)
                self._arrays[oid] = codec
        return codec

    def holds_arrays(self, oid: int) -> bool:
        """Whether the values of `oid` are arrays: an array type, or a domain over one (whose
        own array type then holds arrays as its elements)."""
        codec = self.get(oid)
        while codec.structure == "domain" and codec.element_oid is not None:
            codec = self.get(codec.element_oid)
        return codec.structure == "array"

    def __contains__(self, oid: int) -> bool:
        return oid in self.codecs or oid in self._element_of

    def copy(self) -> TypeRegistry:
        return TypeRegistry(self.codecs)


#: The built-in types, filled by this package's modules when `pgcdc.types` is imported.
DEFAULT_REGISTRY = TypeRegistry()


def register(
    oid: int,
    name: str,
    from_text: TextParser,
    from_binary: BinaryParser | None = None,
    *,
    array_oid: int | None = None,
    delimiter: str = ",",
) -> TypeCodec:
    """Add a built-in type to `DEFAULT_REGISTRY`."""
    return DEFAULT_REGISTRY.add(TypeCodec(oid, name, from_text, from_binary, array_oid, delimiter))
