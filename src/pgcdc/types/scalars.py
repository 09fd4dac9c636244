"""The simplest built-in types: booleans, integers, floats and character strings.

Binary forms are the send functions' network-order layouts (``boolsend``, ``int4send``,
``float8send``, ``textsend``, ...); text forms are the output functions' (floats with
extra_float_digits 3, so they round-trip exactly).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__: list[str] = []


def _bool_text(data: bytes) -> bool:
    if data == b"t":
        return True
    if data == b"f":
        return False
    raise ValueDecodeError(f"invalid boolean text {data!r}")


def _bool_binary(data: bytes) -> bool:
    if len(data) != 1 or data[0] > 1:
        raise ValueDecodeError(f"invalid boolean binary {data.hex()}")
    return data == b"\x01"


def _int_text(data: bytes) -> int:
    try:
        return int(data)
    except ValueError:
        raise ValueDecodeError(f"invalid integer text {data!r}") from None


def _unpacker(fmt: str, what: str) -> Callable[[bytes], Any]:
    layout = struct.Struct(fmt)

    def unpack(data: bytes) -> Any:
        if len(data) != layout.size:
            raise ValueDecodeError(f"{what} binary needs {layout.size} bytes, got {len(data)}")
        return layout.unpack(data)[0]

    return unpack


def _float_text(data: bytes) -> float:
    # The output function writes NaN, Infinity and -Infinity; float() reads all three.
    try:
        return float(data)
    except ValueError:
        raise ValueDecodeError(f"invalid float text {data!r}") from None


_F4 = struct.Struct(">f")


def _float4_text(data: bytes) -> float:
    """The float4 the text stands for, exactly as the binary form gives it (a float32)."""
    value = _float_text(data)
    try:
        return _F4.unpack(_F4.pack(value))[0]
    except OverflowError:
        raise ValueDecodeError(f"float4 text {data!r} is out of range") from None


def _str(data: bytes) -> str:
    return data.decode()


register(16, "bool", _bool_text, _bool_binary, array_oid=1000)
register(21, "int2", _int_text, _unpacker(">h", "int2"), array_oid=1005)
register(23, "int4", _int_text, _unpacker(">i", "int4"), array_oid=1007)
register(20, "int8", _int_text, _unpacker(">q", "int8"), array_oid=1016)
register(26, "oid", _int_text, _unpacker(">I", "oid"), array_oid=1028)
register(700, "float4", _float4_text, _unpacker(">f", "float4"), array_oid=1021)
register(701, "float8", _float_text, _unpacker(">d", "float8"), array_oid=1022)
for _oid, _name, _array in (
    (25, "text", 1009),
    (1043, "varchar", 1015),
    (1042, "bpchar", 1014),
    (19, "name", 1003),
    (18, "char", 1002),
):
    # Text and binary forms are the same bytes for character types (no conversion in
    # binary mode, which needs the database encoding to be UTF-8 to decode as such).
    register(_oid, _name, _str, _str, array_oid=_array)
