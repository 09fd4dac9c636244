"""The optional C fast path of the codec (``_speedups.c``), loaded and checked once.

The C module handles only well-formed XLogData frames and Insert/Update/Delete messages and
answers None for anything else, so the pure-Python code stays the reference for validity and
for every error message. Set ``PGCDC_PURE_PYTHON=1`` to run without it (the test suite runs
the codec tests both ways).
"""

from __future__ import annotations

import os
from types import ModuleType

from pgcdc.protocol import frames
from pgcdc.protocol.frames import Frame, XLogData
from pgcdc.protocol.lsn import Lsn
from pgcdc.protocol.messages import Delete, Insert, Relation, TupleData, UndecodedChange, Update

__all__ = ["SPEEDUPS", "parse_frame"]


def _load() -> ModuleType | None:
    if os.environ.get("PGCDC_PURE_PYTHON"):
        return None
    try:
        from pgcdc.protocol import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    _speedups.configure(TupleData, Insert, Update, Delete, Relation, XLogData, Lsn, UndecodedChange)
    return _speedups


#: The configured C module, or None when it is not built or turned off.
SPEEDUPS = _load()


def _parse_frame_fast(data: bytes) -> Frame:
    """Parse one CopyData payload of a replication stream (XLogData in C, the rest in Python)."""
    return _parse_xlogdata(data) or frames.parse_frame(data)


if SPEEDUPS is not None:
    _parse_xlogdata = SPEEDUPS.parse_xlogdata
    parse_frame = _parse_frame_fast
else:
    parse_frame = frames.parse_frame
