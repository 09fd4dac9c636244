"""The change envelope: the contract between a stream and everything that consumes it.

One row per committed change (`ENVELOPE_ARROW_SCHEMA`), the relation as the change saw it
(`Shape`), the one rule for a change's key and row images (`pgcdc.envelope.images`), and
`EnvelopeBuilder`, which turns decoded changes into envelope batches a column at a time.
Pure Arrow: the Spark schema (`pgcdc.spark.envelope`) is derived from it, and the targets
and the ``json`` plugin use it. The rule and the shapes need nothing but the standard
library (the ``json`` plugin runs on a core install); the Arrow parts need pgcdc's ``spark``
extra (pyarrow, numpy) and are imported on first use.
"""

from typing import Any

from pgcdc.envelope.images import key_pairs, row_pairs
from pgcdc.envelope.shape import ColumnInfo, Shape

__all__ = [
    "COLUMN_TYPE",
    "ENVELOPE_ARROW_SCHEMA",
    "ChangeBatch",
    "OP_CODES",
    "SEQUENCE_TYPE",
    "TEXT_MAP",
    "ColumnInfo",
    "EnvelopeBuilder",
    "Shape",
    "ShapeRows",
    "key_pairs",
    "row_pairs",
    "snapshot_reads",
]

_ARROW = {
    "COLUMN_TYPE": "pgcdc.envelope.schema",
    "ChangeBatch": "pgcdc.envelope.batch",
    "ShapeRows": "pgcdc.envelope.batch",
    "ENVELOPE_ARROW_SCHEMA": "pgcdc.envelope.schema",
    "SEQUENCE_TYPE": "pgcdc.envelope.schema",
    "TEXT_MAP": "pgcdc.envelope.schema",
    "OP_CODES": "pgcdc.envelope.builder",
    "EnvelopeBuilder": "pgcdc.envelope.builder",
    "snapshot_reads": "pgcdc.envelope.builder",
}


def __getattr__(name: str) -> Any:
    """The Arrow parts, imported on first use (they need the ``spark`` extra)."""
    module = _ARROW.get(name)
    if module is None:
        raise AttributeError(f"module 'pgcdc.envelope' has no attribute {name!r}")
    from pgcdc.extras import require

    return getattr(require(module, "spark"), name)
