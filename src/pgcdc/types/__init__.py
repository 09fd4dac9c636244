"""PostgreSQL values from pgoutput's text and binary column forms, to Python (and later Arrow
and Spark).

`DEFAULT_REGISTRY` holds the built-in types; importing this package registers them.
"""

from pgcdc.types import scalars  # noqa: F401  (registers the built-in types)
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeCodec, TypeRegistry, UnknownBinary, register

__all__ = ["DEFAULT_REGISTRY", "TypeCodec", "TypeRegistry", "UnknownBinary", "register"]
