"""Tables that change envelopes are applied to.

`Target` is the one interface the stream and the initial copy write through; `open_target`
makes the one a configuration names. `DeltaTarget` keeps one Delta Lake table (through
delta-rs) from one source table's change envelopes, as a mirror (SCD type 1), a history (SCD
type 2) or an append-only change log, exactly once; `read_target` reads such a table into
Spark. `pgcdc.targets.fold` holds the CDC semantics, free of I/O. (`pgcdc.spark.read_target` reads
such a table into Spark.)
"""

from __future__ import annotations

from pgcdc.targets._mor.decoded import DecodedColumns, decoded_columns
from pgcdc.targets._table import TABLE_PROPERTIES
from pgcdc.targets.base import (
    END_AT,
    MODES,
    READ_CACHE_BYTES,
    SEQUENCE_TYPE,
    START_AT,
    ApplyResult,
    Mode,
    Target,
    TargetSpec,
    open_target,
)
from pgcdc.targets.delta import DeltaTarget

__all__ = [
    "END_AT",
    "MODES",
    "READ_CACHE_BYTES",
    "SEQUENCE_TYPE",
    "START_AT",
    "TABLE_PROPERTIES",
    "ApplyResult",
    "DecodedColumns",
    "DeltaTarget",
    "Mode",
    "Target",
    "TargetSpec",
    "decoded_columns",
    "open_target",
]
