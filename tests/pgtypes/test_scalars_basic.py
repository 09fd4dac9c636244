"""Booleans, integers, floats and strings: streamed text and binary values equal the server's."""

from __future__ import annotations

import math
import struct

import pytest

from pgcdc.embedded import Database

from .helpers import kinds_sent, stream_inserts

pytestmark = pytest.mark.server

TABLE = "CREATE TABLE v (id int, b bool, s int2, i int4, l int8, o oid, r float4, d float8, "
TABLE += 't text, vc varchar(5), c char(3), n name, ch "char")'
ROWS = """INSERT INTO v VALUES
 (1, true, -32768, -2147483648, -9223372036854775808, 0, 'NaN', 'NaN', '', '', '', '', 'a'),
 (2, false, 32767, 2147483647, 9223372036854775807, 4294967295, 'Infinity', '-Infinity',
  'quote '' backslash \\ tab 	 ünïcödé 🐘', 'abcde', 'x', 'pg_class', 'z'),
 (3, true, 0, 0, 0, 1, 3.4028235e38, 1.7976931348623157e308, 'x', 'y', 'abc', 'n', ' '),
 (4, null, null, null, null, null, '-0', '-0', null, null, null, null, null),
 (5, true, 1, 1, 1, 1, 1.4e-45, 5e-324, repeat('long ', 1000), 'ab', 'a', 'a', 'b')"""


def server_rows(pg: Database) -> list[tuple]:
    """psycopg's values; float4 (column 6) canonicalised to the float32 it stands for."""
    with pg.connect() as conn:
        rows = [list(r) for r in conn.execute("SELECT * FROM v ORDER BY id").fetchall()]
    for row in rows:
        if row[6] is not None:
            row[6] = struct.unpack(">f", struct.pack(">f", row[6]))[0]
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_values_equal_the_servers(pg: Database, binary: bool) -> None:
    pg.execute(TABLE)
    streamed = stream_inserts(pg, "v", binary=binary, insert=ROWS)
    expected = server_rows(pg)
    assert len(streamed) == len(expected) == 5
    for got, want in zip(streamed, expected, strict=True):
        for g, w in zip(got, want, strict=True):
            if isinstance(w, float) and math.isnan(w):
                assert isinstance(g, float) and math.isnan(g)
            elif isinstance(w, float):
                assert g == w and math.copysign(1, g) == math.copysign(1, w)
            else:
                assert g == w
    if binary:
        assert "b" in kinds_sent(pg, "v", "INSERT INTO v (id) VALUES (9)", binary=True)
