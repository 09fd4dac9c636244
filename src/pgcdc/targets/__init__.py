"""Table formats that change envelopes are applied to.

`DeltaTarget` keeps one Delta Lake table (through delta-rs) from one source table's change
envelopes, as a mirror (SCD type 1), a history (SCD type 2) or an append-only change log,
exactly once; `read_target` reads such a table into Spark. `pgcdc.targets.fold` holds the
CDC semantics, free of I/O.
"""

from __future__ import annotations

from pgcdc.targets.delta import END_AT, SEQUENCE_TYPE, START_AT, ApplyResult, DeltaTarget, Mode
from pgcdc.targets.read import read_target

__all__ = [
    "END_AT",
    "SEQUENCE_TYPE",
    "START_AT",
    "ApplyResult",
    "DeltaTarget",
    "Mode",
    "read_target",
]
