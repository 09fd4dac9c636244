"""Document types: ``json``, ``jsonb`` and ``xml``, each to its text as a `str`.

The text is kept as the server prints it rather than parsed: parsing would lose what json keeps
(key order, duplicate keys, number spelling) and costs far more than most consumers need; call
`json.loads` on the value when a Python object is wanted.

Binary forms: ``json_send`` and ``xml_send`` send the same text as the output functions (xml's
declaration is printed for the client encoding, which pgcdc pins to UTF-8, so it is the text
form's); ``jsonb_send`` sends a format version byte (1) and then the text.
"""

from __future__ import annotations

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__: list[str] = []

JSONB_VERSION = 1


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueDecodeError(f"{what} is not valid UTF-8 at byte {exc.start}") from None


def json_text(data: bytes) -> str:
    """json's text, byte for byte as it was stored (json does not normalise)."""
    return _utf8(data, "json")


def jsonb_text(data: bytes) -> str:
    """jsonb's normalised text (keys sorted by length then bytes, no duplicates)."""
    return _utf8(data, "jsonb")


def jsonb_binary(data: bytes) -> str:
    """``jsonb_send``: version byte 1, then the same text as ``jsonb_out``."""
    if not data:
        raise ValueDecodeError("jsonb binary is empty (no version byte)")
    if data[0] != JSONB_VERSION:
        raise ValueDecodeError(f"jsonb binary has unsupported format version {data[0]}")
    return _utf8(data[1:], "jsonb")


def xml_text(data: bytes) -> str:
    """xml's text (with its XML declaration only when it says more than the defaults)."""
    return _utf8(data, "xml")


register(114, "json", json_text, json_text, array_oid=199)
register(3802, "jsonb", jsonb_text, jsonb_binary, array_oid=3807)
register(142, "xml", xml_text, xml_text, array_oid=143)
