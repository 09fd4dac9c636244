"""Exact decimal types: ``numeric`` and ``money``, both to `decimal.Decimal`.

numeric keeps its display scale: ``1.50`` stays ``Decimal('1.50')`` (not ``1.5``), so a value
decoded from the binary form is the same `Decimal` (digits and exponent) as the one read from the
text form. NaN, Infinity and -Infinity (PostgreSQL 14+) become the `Decimal` specials.

Decimals are built from strings, never by arithmetic, so the context's precision (28 digits by
default) never rounds a value: numeric has up to 131072 digits before the point.
"""

from __future__ import annotations

import struct
import sys
from array import array
from decimal import Decimal, InvalidOperation

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__: list[str] = []

# numeric_send: int16 ndigits, int16 weight, uint16 sign, int16 dscale, then ndigits base-10000
# digits (uint16). The value is sum(digit[i] * 10000 ** (weight - i)), shown with dscale decimals.
_HEADER = struct.Struct(">hhHh")
_POS, _NEG, _NAN, _PINF, _NINF = 0x0000, 0x4000, 0xC000, 0xD000, 0xF000
_SPECIALS = {
    _NAN: Decimal("NaN"),
    _PINF: Decimal("Infinity"),
    _NINF: Decimal("-Infinity"),
}
_DSCALE_MASK = 0x3FFF
#: The four decimal digits of each base-10000 digit; an index error means a digit > 9999.
_DIGITS4 = tuple(f"{i:04d}" for i in range(10000))
#: Precompiled digit layouts for the common short values; longer ones go through `array`.
_DIGIT_STRUCTS = tuple(struct.Struct(f">{n}H") for n in range(33))
_SWAP = sys.byteorder == "little"


def numeric_text(data: bytes) -> Decimal:
    """``numeric_out``'s text: plain digits with the display scale, or NaN / [-]Infinity."""
    try:
        return Decimal(data.decode("ascii"))
    except (InvalidOperation, UnicodeDecodeError):
        raise ValueDecodeError(f"invalid numeric text {data[:40]!r}") from None


def _digits(data: bytes, ndigits: int) -> tuple[int, ...] | array[int]:
    if ndigits < len(_DIGIT_STRUCTS):
        return _DIGIT_STRUCTS[ndigits].unpack_from(data, 8)
    digits = array("H", data[8:])
    if _SWAP:
        digits.byteswap()
    return digits


def numeric_binary(data: bytes) -> Decimal:
    """``numeric_send``'s bytes, with exactly the digits and scale ``numeric_out`` would print."""
    if len(data) < 8:
        raise ValueDecodeError(f"numeric binary needs at least 8 bytes, got {len(data)}")
    ndigits, weight, sign, dscale = _HEADER.unpack_from(data)
    if sign not in (_POS, _NEG):
        special = _SPECIALS.get(sign)
        if special is None:
            raise ValueDecodeError(f"numeric binary has an invalid sign word 0x{sign:04x}")
        return special
    if ndigits < 0 or len(data) != 8 + 2 * ndigits:
        raise ValueDecodeError(
            f"numeric binary with {ndigits} digits needs {8 + 2 * max(ndigits, 0)} bytes, "
            f"got {len(data)}"
        )
    if dscale & _DSCALE_MASK != dscale:
        raise ValueDecodeError(f"numeric binary has an invalid display scale {dscale}")
    if ndigits == 0:
        return Decimal(f"0E-{dscale}")
    try:
        text = "".join(map(_DIGITS4.__getitem__, _digits(data, ndigits)))
    except IndexError:
        raise ValueDecodeError("numeric binary has a base-10000 digit above 9999") from None
    # `text` is an integer scaled by 10 ** exponent; make the exponent -dscale, as the text form
    # has: pad with zeros, or drop digits past the display scale (numeric_out truncates them).
    shift = (weight - ndigits + 1) * 4 + dscale
    if shift > 0:
        text += "0" * shift
    elif shift < 0:
        text = text[:shift] or "0"
    return Decimal(f"{'-' if sign == _NEG else ''}{text}E-{dscale}")


# money: an int64 count of the currency's smallest unit. pgcdc assumes lc_monetary has 2
# fraction digits (cents), as in the C locale and en_US; PostgreSQL itself guesses 2 when the
# locale does not say. Both forms are read as that count of hundredths, so they always agree.
_INT64 = struct.Struct(">q")
#: Every byte that is not an ASCII digit: deleted from the text to leave the amount's digits.
_NOT_DIGITS = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)


def money_text(data: bytes) -> Decimal:
    """``cash_out``'s text (``$1,234.56``, ``-$1.00``, ``($1.00)`` in some locales): its digits
    are the amount in hundredths; a minus sign or parentheses make it negative. The currency
    symbol, grouping and decimal separators are whatever lc_monetary says, so they are skipped
    rather than parsed."""
    digits = data.translate(None, _NOT_DIGITS)
    if not digits or len(digits) > 19:
        raise ValueDecodeError(f"invalid money text {data[:40]!r}")
    negative = b"-" in data or b"(" in data
    return Decimal(f"{'-' if negative else ''}{digits.decode()}E-2")


def money_binary(data: bytes) -> Decimal:
    """``cash_send``'s int64, in hundredths (see the lc_monetary assumption above)."""
    if len(data) != 8:
        raise ValueDecodeError(f"money binary needs 8 bytes, got {len(data)}")
    return Decimal(f"{_INT64.unpack(data)[0]}E-2")


register(1700, "numeric", numeric_text, numeric_binary, array_oid=1231)
register(790, "money", money_text, money_binary, array_oid=791)
