"""bytea, bit and bit varying: streamed text and binary values equal the server's own, and each
other."""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import BitString
from pgcdc.types.bytestrings import bits_binary, bits_text, bytea_binary, bytea_text

from .helpers import stream_both

ALL_BYTES = "decode(string_agg(lpad(to_hex(b), 2, '0'), '' ORDER BY b), 'hex') FROM "
ROWS = [
    # bytea, bit(12), varbit
    "'', B'000000000000', B''",
    f"(SELECT {ALL_BYTES} generate_series(0, 255) b), B'101010101010', B'1'",
    "'\\\\ '' \\000'::text::bytea, B'111111111111', B'10000000'",
    "'\\x00ff'::bytea, B'100000000001', B'100000001'",
    "decode(repeat('ab', 100000), 'hex'), B'000000000001', repeat('01', 500)::varbit",
    "null, null, null",
]


def test_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, "b bytea, f bit(12), v varbit", ROWS)
    with pg.connect() as conn:
        server = conn.execute("SELECT b, f::text, v::text FROM src ORDER BY id").fetchall()
    assert text == binary
    assert len(text) == len(server) == len(ROWS)
    for row, (b, f, v) in zip(text, server, strict=True):
        assert row == (b, None if f is None else BitString(f), None if v is None else BitString(v))
    assert text[1][0] == bytes(range(256))
    assert text[0] == (b"", BitString("000000000000"), BitString(""))
    assert len(text[4][2]) == 1000 and str(text[3][2]) == "100000001"


def test_bytea_escape_format_agrees_with_hex(pg: Database) -> None:
    """The escape output format (never pgcdc's, but a server can be set to it) reads back the
    same bytes as the hex format."""
    pg.execute("CREATE TABLE src (b bytea)")
    pg.execute(
        "INSERT INTO src SELECT decode(string_agg(lpad(to_hex(b), 2, '0'), '' ORDER BY b), 'hex')"
        " FROM generate_series(0, 255) b"
    )
    pg.execute("INSERT INTO src VALUES (''), ('plain'), ('\\\\')")
    with pg.connect() as conn:
        conn.execute("SET bytea_output = escape")
        rows = conn.execute("SELECT b, b::text FROM src").fetchall()
    for value, escaped in rows:
        assert bytea_text(escaped.encode()) == value
    assert bytea_text(b"\\x") == b"" and bytea_binary(b"\x00\x01") == b"\x00\x01"


def test_bit_binary_layout() -> None:
    """Padding bits of the last byte are ignored; the bit count decides."""
    assert bits_binary(b"\x00\x00\x00\x03\xff") == BitString("111")
    assert bits_binary(b"\x00\x00\x00\x09\x80\x7f") == BitString("100000000")
    assert str(bits_text(b"0110")) == "0110" and len(bits_text(b"")) == 0


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (bytea_text, b"\\x0", "bytea hex"),
        (bytea_text, b"\\xzz", "bytea hex"),
        (bytea_text, b"ab\\9", "bytea escape"),
        (bytea_text, b"ab\\40", "bytea escape"),
        (bytea_text, b"\\400", "bytea escape"),
        (bits_text, b"012", "bit string text"),
        (bits_binary, b"\x00\x00", "at least 4 bytes"),
        (bits_binary, b"\x00\x00\x00\x09\x80", "9 bits cannot have 1 data bytes"),
        (bits_binary, b"\xff\xff\xff\xff", "-1 bits"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)
