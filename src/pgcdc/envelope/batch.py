"""A table's part of a batch as the spool gives it: its row changes per relation shape,
column-wise, and the envelope made from them on demand.

The decoder fills column buffers (`pgcdc.protocol.columns`) a relation at a time. The Arrow
folds of the targets (`pgcdc.targets.bulk`) read a batch of one shape's inserts, updates
and deletes straight from them (`ShapeRows`: per row its operation and position, per cell
its kind and the server's text), so the usual batch is typed without the envelope's text
maps and its relation repeated per row. The envelope (`ENVELOPE_ARROW_SCHEMA`) is made only
for what needs it (`ChangeBatch.envelope`): a batch with truncations or messages, or of
several shapes, the general fold, an error's line, a pending change log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pgcdc.envelope.images import KIND_BINARY, KIND_TEXT
from pgcdc.envelope.shape import Shape
from pgcdc.errors import ValueDecodeError

if TYPE_CHECKING:
    from pgcdc.envelope.builder import FlushedRows

__all__ = ["ChangeBatch", "ShapeRows", "cell_values"]


def cell_values(kinds: np.ndarray, offsets: bytes, values: bytes, table: str) -> pa.Array:
    """The cells of a (rows, ncols) kind matrix as one string array, row-major: the value
    where one was sent, null elsewhere (NULL, an unchanged TOAST value, no such tuple); a
    value that is not UTF-8 is an error naming the table."""
    sent = (kinds == KIND_TEXT) | (kinds == KIND_BINARY)
    array = pa.Array.from_buffers(
        pa.string(),
        kinds.size,
        [
            pa.py_buffer(np.packbits(sent.ravel(), bitorder="little")),
            pa.py_buffer(offsets),
            pa.py_buffer(values),
        ],
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ValueDecodeError(f"{table}: a value is not UTF-8 text ({exc})") from None
    return array


@dataclass(frozen=True, slots=True)
class ShapeRows:
    """One relation shape's inserts, updates and deletes (not in the order they came when
    several Relation messages described the shape; their (commit LSN, ordinal) orders
    them): per row its commit LSN, ordinal, LSN (0: not known), operation
    (`pgcdc.protocol.columns`' ``OP_*``) and old tuple's kind (``K``, ``O`` or 0); per tuple
    side a (rows, ncols) matrix of cell kinds (0 where the row has no such tuple) and the
    cells' text, row-major (`cell_values`)."""

    shape: Shape
    commit_lsn: np.ndarray
    ordinal: np.ndarray
    lsn: np.ndarray
    op: np.ndarray
    old_kind: np.ndarray
    new_kinds: np.ndarray
    new_values: pa.Array
    old_kinds: np.ndarray
    old_values: pa.Array

    def __len__(self) -> int:
        return len(self.op)

    @staticmethod
    def concat(parts: Sequence[ShapeRows]) -> ShapeRows:
        """The rows of `parts` (of one shape), one after the other."""
        if len(parts) == 1:
            return parts[0]

        def arrays(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts])

        return ShapeRows(
            parts[0].shape,
            arrays("commit_lsn"),
            arrays("ordinal"),
            arrays("lsn"),
            arrays("op"),
            arrays("old_kind"),
            arrays("new_kinds"),
            pa.concat_arrays([p.new_values for p in parts]),
            arrays("old_kinds"),
            pa.concat_arrays([p.old_values for p in parts]),
        )


@dataclass(slots=True)
class ChangeBatch:
    """A table's changes in a batch (whole transactions, any order): the envelope's rows,
    and, when they are all row changes, the same per relation shape.

    `parts` are what the builder flushed (`pgcdc.envelope.builder.FlushedRows`), kept until
    the batch is applied; `envelope` and `shape_rows` are made from them once."""

    parts: Sequence[FlushedRows]
    _envelope: pa.Table | None = field(default=None, repr=False)
    _shapes: list[ShapeRows] | None = field(default=None, repr=False)

    @property
    def num_rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def row_changes_only(self) -> bool:
        """Whether every row is an insert, update or delete (no truncation, no message)."""
        return not any(p.others for p in self.parts)

    @property
    def first_commit_lsn(self) -> int | None:
        lsns = [p.commit_lsns[0] for p in self.parts if p.rows]
        return min(lsns) if lsns else None

    @property
    def last_commit_lsn(self) -> int | None:
        lsns = [p.commit_lsns[1] for p in self.parts if p.rows]
        return max(lsns) if lsns else None

    @property
    def last_commit_time(self) -> datetime | None:
        times = [t for p in self.parts if p.rows and (t := p.last_commit_time) is not None]
        return max(times) if times else None

    def envelope(self) -> pa.Table:
        """The envelope rows (`ENVELOPE_ARROW_SCHEMA`)."""
        if self._envelope is None:
            from pgcdc.envelope.schema import ENVELOPE_ARROW_SCHEMA

            batches = [p.envelope() for p in self.parts if p.rows]
            self._envelope = pa.Table.from_batches(batches, schema=ENVELOPE_ARROW_SCHEMA)
        return self._envelope

    def shape_rows(self) -> list[ShapeRows] | None:
        """The row changes per relation shape (in the order the shapes first came), or None
        when the batch holds other rows too (truncations, messages)."""
        if self._shapes is None and self.row_changes_only:
            by_shape: dict[Shape, list[ShapeRows]] = {}
            for part in self.parts:
                for one in part.shape_rows() or ():
                    by_shape.setdefault(one.shape, []).append(one)
            self._shapes = [ShapeRows.concat(same) for same in by_shape.values()]
        return self._shapes
