"""Geometric types: streamed text and binary values equal the server's own, and each other."""

from __future__ import annotations

import math
import re
import struct
from dataclasses import astuple
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import (
    DEFAULT_REGISTRY,
    Box,
    Circle,
    Line,
    LineSegment,
    Path,
    Point,
    Polygon,
)
from pgcdc.types.geometry import (
    box_text,
    circle_binary,
    line_binary,
    path_binary,
    path_text,
    point_binary,
    point_text,
    polygon_binary,
    polygon_text,
)

from .helpers import stream_both

COLUMNS = "p point, l line, s lseg, b box, pa path, po polygon, c circle"
ROWS = [
    "'(0,0)', '{1,-1,0}', '[(0,0),(1,1)]', '(1,1),(0,0)', '[(0,0)]', '((0,0))', '<(0,0),0>'",
    "'(-0,1.5)', '[(0,0),(1,2)]', '((-1,-2),(3,4))', '(0,0),(1,1)', '((0,0),(1,1),(2,0))', "
    "'((0,0),(1,1),(1,0))', '<(1,2),3>'",
    "'(1e300,-1e-300)', '{0,1,-2.5}', '[(1e-5,2e+20),(0.1,0.2)]', '(-1,5),(3,-7)', "
    "'[(0.1,0.2),(0.3,0.4),(1.7976931348623157e308,5e-324)]', "
    "'(0.1,0.2),(0.3,0.4),(0.5,0.7)', '((0.1,0.2),0.30000000000000004)'",
    "'(NaN,Infinity)', '{-Infinity,1,NaN}', '[(NaN,0),(0,-Infinity)]', '(Infinity,1),(0,0)', "
    "'(1,2),(3,4)', '((1,2),(3,4),(5,6),(7,8))', '<(NaN,1),Infinity>'",
    "null, null, null, null, null, null, null",
]
NUMBER = re.compile(r"-?(?:Infinity|NaN|[0-9.]+(?:e[-+][0-9]+)?)")


def flat(value: Any) -> list[float]:
    """Every float of a geometric value, in the order the text form prints them."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, tuple | list):
        return [f for v in value for f in flat(v)]
    return [f for v in astuple(value) if not isinstance(v, bool) for f in flat(v)]


def key(numbers: list[float]) -> list[bytes]:
    """Floats by their bits, so that NaN equals NaN and -0.0 differs from 0.0."""
    return [struct.pack(">d", n) for n in numbers]


def test_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, COLUMNS, ROWS)
    names = [c.split()[0] for c in COLUMNS.split(", ")]
    with pg.connect() as conn:
        shown = conn.execute(
            f"SELECT {', '.join(n + '::text' for n in names)} FROM src ORDER BY id"
        ).fetchall()
    assert len(text) == len(binary) == len(shown) == len(ROWS)
    for t_row, b_row, s_row in zip(text, binary, shown, strict=True):
        for t, b, s in zip(t_row, b_row, s_row, strict=True):
            if s is None:
                assert t is None and b is None
                continue
            assert type(t) is type(b)
            # the server's numbers, found by a regex rather than the module's punctuation split
            expected = [float(n) for n in NUMBER.findall(s)]
            assert key(flat(t)) == key(flat(b)) == key(expected)
            if isinstance(t, Path):
                assert t.closed == b.closed == s.startswith("(")
    p, line, seg, box, path, poly, circle = text[1]
    assert p == Point(-0.0, 1.5) and math.copysign(1, p.x) == -1
    assert line == Line(2.0, -1.0, 0.0)
    assert seg == LineSegment(Point(-1, -2), Point(3, 4))
    assert box == Box(Point(1, 1), Point(0, 0))  # stored upper right first
    assert path == Path((Point(0, 0), Point(1, 1), Point(2, 0)), closed=True)
    assert poly == Polygon((Point(0, 0), Point(1, 1), Point(1, 0)))
    assert circle == Circle(Point(1, 2), 3)
    assert text[0][4] == Path((Point(0, 0),), closed=False) and text[2][4].closed is False
    assert text[3][4].closed is True  # no brackets in the input: closed
    assert DEFAULT_REGISTRY.get(603).delimiter == ";"  # box arrays


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (point_text, b"(1,x)", "invalid point text"),
        (point_text, b"(1,2,3)", "point text has 3 numbers"),
        (box_text, b"(1,2),(3)", "box text has 3 numbers"),
        (path_text, b"1,2", "invalid path text"),
        (path_text, b"[(1,2),(3)]", "path text has 3 numbers"),
        (polygon_text, b"((1,2),(3,4),5)", "polygon text has 5 numbers"),
        (point_binary, b"\x00" * 15, "point binary needs 16 bytes"),
        (line_binary, b"\x00" * 16, "line binary needs 24 bytes"),
        (circle_binary, b"", "circle binary needs 24 bytes"),
        (path_binary, b"\x01\x00\x00", "path binary needs at least 5 bytes"),
        (path_binary, b"\x02\x00\x00\x00\x00", "invalid closed flag 2"),
        (path_binary, b"\x00\x00\x00\x00\x01" + b"\x00" * 15, "1 points cannot be 20 bytes"),
        (polygon_binary, b"\xff\xff\xff\xff", "-1 points"),
        (polygon_binary, b"\x00\x00", "polygon binary needs at least 4 bytes"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)
