"""PostgreSQL values from pgoutput's text and binary column forms, to Python (and later Arrow
and Spark).

`DEFAULT_REGISTRY` holds the built-in types; importing this package registers them.
"""

from pgcdc.types import (
    bytestrings,  # noqa: F401
    documents,  # noqa: F401
    geometry,  # noqa: F401
    identifiers,  # noqa: F401
    network,  # noqa: F401
    numeric,  # noqa: F401
    ranges,  # noqa: F401
    scalars,  # noqa: F401  (registers the built-in types)
    temporal,  # noqa: F401
    textsearch,  # noqa: F401
    transactions,  # noqa: F401
)
from pgcdc.types.arrays import PgArray
from pgcdc.types.bytestrings import BitString
from pgcdc.types.catalog import resolve
from pgcdc.types.geometry import Box, Circle, Line, LineSegment, Path, Point, Polygon
from pgcdc.types.ranges import EMPTY_RANGE, Multirange, Range
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeCodec, TypeRegistry, UnknownBinary, register
from pgcdc.types.transactions import PgSnapshot
from pgcdc.types.values import (
    INFINITY,
    NEG_INFINITY,
    Infinity,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
)

__all__ = [
    "DEFAULT_REGISTRY",
    "EMPTY_RANGE",
    "INFINITY",
    "NEG_INFINITY",
    "BitString",
    "Box",
    "Circle",
    "Infinity",
    "Interval",
    "Line",
    "LineSegment",
    "Multirange",
    "Path",
    "PgArray",
    "PgDate",
    "PgSnapshot",
    "PgTime",
    "PgTimestamp",
    "Point",
    "Polygon",
    "Range",
    "TypeCodec",
    "TypeRegistry",
    "UnknownBinary",
    "register",
    "resolve",
]
