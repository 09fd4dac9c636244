"""Strings of bytes and of bits: ``bytea`` (to `bytes`), ``bit`` and ``bit varying`` (to
`BitString`).

A bit string is not a `bytes`: its length need not be a multiple of 8, and ``B'0'`` and
``B'00'`` are different values, so it keeps its bits as text.
"""

from __future__ import annotations

import binascii
import struct
from dataclasses import dataclass

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__ = ["BitString"]


@dataclass(frozen=True, slots=True)
class BitString:
    """A ``bit(n)`` or ``bit varying`` value: its bits, first to last, as a '0'/'1' string
    (exactly as PostgreSQL prints it)."""

    bits: str

    def __str__(self) -> str:
        return self.bits

    def __len__(self) -> int:
        return len(self.bits)


def bytea_text(data: bytes) -> bytes:
    """``byteaout``'s text: ``\\x`` and hex digits (bytea_output hex, which pgcdc pins), or the
    older escape format if a session ever sends it."""
    if data[:2] == b"\\x":
        try:
            return binascii.a2b_hex(data[2:])
        except binascii.Error:
            raise ValueDecodeError(f"invalid bytea hex text {data[:40]!r}") from None
    return _bytea_unescape(data)


def _bytea_unescape(data: bytes) -> bytes:
    """The escape format: ``\\\\`` for a backslash, ``\\ooo`` (octal) for other bytes."""
    if b"\\" not in data:
        return data
    out = bytearray()
    start = 0
    while (slash := data.find(b"\\", start)) >= 0:
        out += data[start:slash]
        if data[slash + 1 : slash + 2] == b"\\":
            out.append(0x5C)
            start = slash + 2
            continue
        octal = data[slash + 1 : slash + 4]
        if len(octal) != 3 or octal[0] not in b"0123" or octal.strip(b"01234567"):
            raise ValueDecodeError(f"invalid bytea escape at byte {slash}: {data[:40]!r}")
        out.append(int(octal, 8))
        start = slash + 4
    out += data[start:]
    return bytes(out)


def bytea_binary(data: bytes) -> bytes:
    """``byteasend``: the bytes themselves."""
    return bytes(data)


_INT32 = struct.Struct(">i")


def bits_text(data: bytes) -> BitString:
    """``bit_out``/``varbit_out``: one '0' or '1' per bit."""
    if data.translate(None, b"01"):
        raise ValueDecodeError(f"invalid bit string text {data[:40]!r}")
    return BitString(data.decode("ascii"))


def bits_binary(data: bytes) -> BitString:
    """``varbit_send`` (bit's too): int32 bit count, then the bits packed high bit first, the
    last byte padded with zeros."""
    if len(data) < 4:
        raise ValueDecodeError(f"bit string binary needs at least 4 bytes, got {len(data)}")
    nbits = _INT32.unpack_from(data)[0]
    body = data[4:]
    if nbits < 0 or len(body) != (nbits + 7) // 8:
        raise ValueDecodeError(
            f"bit string binary of {nbits} bits cannot have {len(body)} data bytes"
        )
    if nbits == 0:
        return BitString("")
    return BitString(format(int.from_bytes(body, "big"), f"0{len(body) * 8}b")[:nbits])


register(17, "bytea", bytea_text, bytea_binary, array_oid=1001)
register(1560, "bit", bits_text, bits_binary, array_oid=1561)
register(1562, "varbit", bits_text, bits_binary, array_oid=1563)
