"""The change envelope: the contract between a stream and everything that consumes it.

One row per committed change (`ENVELOPE_ARROW_SCHEMA`), the relation as the change saw it
(`Shape`), the one rule for a change's key and row images (`pgcdc.envelope.images`), and
`EnvelopeBuilder`, which turns decoded changes into envelope batches a column at a time.
Pure Arrow: the Spark schema (`pgcdc.spark.envelope`) is derived from it, and the targets
and the ``json`` plugin use it.
"""

from pgcdc.envelope.builder import OP_CODES, EnvelopeBuilder, snapshot_reads
from pgcdc.envelope.images import key_pairs, row_pairs
from pgcdc.envelope.schema import COLUMN_TYPE, ENVELOPE_ARROW_SCHEMA, SEQUENCE_TYPE, TEXT_MAP
from pgcdc.envelope.shape import ColumnInfo, Shape

__all__ = [
    "COLUMN_TYPE",
    "ENVELOPE_ARROW_SCHEMA",
    "OP_CODES",
    "SEQUENCE_TYPE",
    "TEXT_MAP",
    "ColumnInfo",
    "EnvelopeBuilder",
    "Shape",
    "key_pairs",
    "row_pairs",
    "snapshot_reads",
]
