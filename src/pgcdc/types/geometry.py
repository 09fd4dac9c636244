"""Geometric types: ``point``, ``line``, ``lseg``, ``box``, ``path``, ``polygon``, ``circle``.

Each becomes a small frozen dataclass of floats. Coordinates are float8 in both forms; with
extra_float_digits 3 (pinned by pgcdc) the text prints the shortest exact spelling, so text and
binary give the same floats, NaN and infinities included.

Text forms (``*_out`` in geo_ops.c): point ``(x,y)``, line ``{A,B,C}``, lseg ``[(x1,y1),(x2,y2)]``,
box ``(x1,y1),(x2,y2)`` (upper right, then lower left), path ``((..),..)`` closed or
``[(..),..]`` open, polygon ``((..),..)``, circle ``<(x,y),r>``. They are parsed by deleting the
punctuation and splitting the numbers on commas, which no float spelling contains.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__ = ["Box", "Circle", "Line", "LineSegment", "Path", "Point", "Polygon"]


@dataclass(frozen=True, slots=True)
class Point:
    """A ``point``."""

    x: float
    y: float


@dataclass(frozen=True, slots=True)
class Line:
    """A ``line``: the infinite line ``a*x + b*y + c = 0``."""

    a: float
    b: float
    c: float


@dataclass(frozen=True, slots=True)
class LineSegment:
    """An ``lseg``: the segment from `p1` to `p2`."""

    p1: Point
    p2: Point


@dataclass(frozen=True, slots=True)
class Box:
    """A ``box``, by its upper right (`high`) and lower left (`low`) corners, as stored."""

    high: Point
    low: Point


@dataclass(frozen=True, slots=True)
class Path:
    """A ``path``: its points, and whether the last one joins back to the first."""

    points: tuple[Point, ...]
    closed: bool


@dataclass(frozen=True, slots=True)
class Polygon:
    """A ``polygon``: its vertices (always closed)."""

    points: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class Circle:
    """A ``circle``."""

    center: Point
    radius: float


_PUNCTUATION = b"()[]{}<> "


def _numbers(data: bytes, what: str, count: int | None = None) -> list[float]:
    """The floats of a text form, in order; `count` of them if given, else an even number."""
    try:
        numbers = [float(n) for n in data.translate(None, _PUNCTUATION).split(b",")]
    except ValueError:
        raise ValueDecodeError(f"invalid {what} text {data[:60]!r}") from None
    if (len(numbers) != count) if count is not None else (len(numbers) % 2):
        raise ValueDecodeError(f"{what} text has {len(numbers)} numbers: {data[:60]!r}")
    return numbers


def _points(numbers: list[float] | tuple[float, ...]) -> tuple[Point, ...]:
    xs = numbers[0::2]
    ys = numbers[1::2]
    return tuple(map(Point, xs, ys))


def point_text(data: bytes) -> Point:
    """``point_out``: ``(x,y)``."""
    return Point(*_numbers(data, "point", 2))


def line_text(data: bytes) -> Line:
    """``line_out``: ``{A,B,C}``."""
    return Line(*_numbers(data, "line", 3))


def lseg_text(data: bytes) -> LineSegment:
    """``lseg_out``: ``[(x1,y1),(x2,y2)]``."""
    x1, y1, x2, y2 = _numbers(data, "lseg", 4)
    return LineSegment(Point(x1, y1), Point(x2, y2))


def box_text(data: bytes) -> Box:
    """``box_out``: ``(high),(low)``."""
    x1, y1, x2, y2 = _numbers(data, "box", 4)
    return Box(Point(x1, y1), Point(x2, y2))


def path_text(data: bytes) -> Path:
    """``path_out``: points in ``(...)`` when closed, in ``[...]`` when open."""
    if data[:1] not in (b"(", b"["):
        raise ValueDecodeError(f"invalid path text {data[:60]!r}")
    return Path(_points(_numbers(data, "path")), data[:1] == b"(")


def polygon_text(data: bytes) -> Polygon:
    """``poly_out``: ``((x1,y1),...)``."""
    return Polygon(_points(_numbers(data, "polygon")))


def circle_text(data: bytes) -> Circle:
    """``circle_out``: ``<(x,y),r>``."""
    x, y, radius = _numbers(data, "circle", 3)
    return Circle(Point(x, y), radius)


_F8X2 = struct.Struct(">2d")
_F8X3 = struct.Struct(">3d")
_F8X4 = struct.Struct(">4d")
_INT32 = struct.Struct(">i")


def _fixed(data: bytes, layout: struct.Struct, what: str) -> tuple[float, ...]:
    if len(data) != layout.size:
        raise ValueDecodeError(f"{what} binary needs {layout.size} bytes, got {len(data)}")
    return layout.unpack(data)


def point_binary(data: bytes) -> Point:
    """``point_send``: float8 x, y."""
    return Point(*_fixed(data, _F8X2, "point"))


def line_binary(data: bytes) -> Line:
    """``line_send``: float8 A, B, C."""
    return Line(*_fixed(data, _F8X3, "line"))


def lseg_binary(data: bytes) -> LineSegment:
    """``lseg_send``: the two end points."""
    x1, y1, x2, y2 = _fixed(data, _F8X4, "lseg")
    return LineSegment(Point(x1, y1), Point(x2, y2))


def box_binary(data: bytes) -> Box:
    """``box_send``: high corner, then low corner."""
    x1, y1, x2, y2 = _fixed(data, _F8X4, "box")
    return Box(Point(x1, y1), Point(x2, y2))


def _point_list(data: bytes, offset: int, what: str) -> tuple[Point, ...]:
    """int32 point count at `offset`, then the points (float8 x, y each)."""
    (npts,) = _INT32.unpack_from(data, offset)
    offset += 4
    if npts < 0 or len(data) != offset + 16 * npts:
        raise ValueDecodeError(f"{what} binary of {npts} points cannot be {len(data)} bytes long")
    return _points(struct.unpack_from(f">{2 * npts}d", data, offset))


def path_binary(data: bytes) -> Path:
    """``path_send``: closed flag byte, int32 point count, the points."""
    if len(data) < 5:
        raise ValueDecodeError(f"path binary needs at least 5 bytes, got {len(data)}")
    if data[0] > 1:
        raise ValueDecodeError(f"path binary has an invalid closed flag {data[0]}")
    return Path(_point_list(data, 1, "path"), data[0] == 1)


def polygon_binary(data: bytes) -> Polygon:
    """``poly_send``: int32 point count, the points."""
    if len(data) < 4:
        raise ValueDecodeError(f"polygon binary needs at least 4 bytes, got {len(data)}")
    return Polygon(_point_list(data, 0, "polygon"))


def circle_binary(data: bytes) -> Circle:
    """``circle_send``: center x, y and radius, float8."""
    x, y, radius = _fixed(data, _F8X3, "circle")
    return Circle(Point(x, y), radius)


register(600, "point", point_text, point_binary, array_oid=1017)
register(628, "line", line_text, line_binary, array_oid=629)
register(601, "lseg", lseg_text, lseg_binary, array_oid=1018)
# A box's text contains commas, so its arrays separate elements with ';'.
register(603, "box", box_text, box_binary, array_oid=1020, delimiter=";")
register(602, "path", path_text, path_binary, array_oid=1019)
register(604, "polygon", polygon_text, polygon_binary, array_oid=1027)
register(718, "circle", circle_text, circle_binary, array_oid=719)
