"""uuid and pg_lsn: streamed text and binary values equal the server's own, and each other."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.protocol import Lsn
from pgcdc.types.identifiers import pg_lsn_binary, pg_lsn_text, uuid_binary, uuid_text

from .helpers import stream_both

ROWS = [
    "'00000000-0000-0000-0000-000000000000', '0/0'",
    "'ffffffff-ffff-ffff-ffff-ffffffffffff', 'FFFFFFFF/FFFFFFFF'",
    "'{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}', '16/b374d848'",
    "gen_random_uuid(), '0/1'",
    "'a0eebc999c0b4ef8bb6d6bb9bd380a11', '1/0'",
    "null, null",
]


def test_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, "u uuid, l pg_lsn", ROWS)
    with pg.connect() as conn:
        # psycopg's own UUID; the LSN as a number of bytes from 0/0, a route that never prints it
        server = conn.execute("SELECT u, l - '0/0'::pg_lsn FROM src ORDER BY id").fetchall()
    assert text == binary
    for (u, lsn), (server_u, offset) in zip(text, server, strict=True):
        assert u == server_u
        assert (lsn, offset) == (None, None) or (isinstance(lsn, Lsn) and lsn == int(offset))
    assert text[0] == (UUID(int=0), Lsn(0)) and text[1][1] == Lsn(2**64 - 1)
    assert str(text[2][1]) == "16/B374D848"


def test_parsers() -> None:
    u = UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert uuid_text(str(u).encode()) == uuid_binary(u.bytes) == u
    assert pg_lsn_text(b"16/B374D848") == pg_lsn_binary(bytes.fromhex("00000016b374d848"))


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (uuid_text, b"a0eebc99", "uuid text"),
        (uuid_text, b"\xff", "uuid text"),
        (uuid_binary, b"\x00" * 15, "uuid binary needs 16 bytes"),
        (pg_lsn_text, b"16-B374D848", "pg_lsn text"),
        (pg_lsn_text, b"1/123456789", "pg_lsn text"),
        (pg_lsn_binary, b"\x00" * 9, "pg_lsn binary needs 8 bytes"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)
