"""The mirror fold in Arrow, for the batches that need nothing else.

Most batches of a bulk load or a busy table are plain inserts, updates and deletes of one
relation shape, with no key change, no unchanged TOAST value and no truncation. For those the
fold is "the last change per key wins": done here with Arrow's sort and group-by, and the
winners' text columns are typed column by column, without a Python object per row. Any other
batch returns None and takes the general fold (`pgcdc.targets.fold`), which is the reference
for what a batch means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import Shape
from pgcdc.targets.fold import _shape, single_shape

__all__ = ["BulkMirror", "bulk_mirror"]

_ROW_OPS = pa.array(["insert", "update", "delete"])
_INDEX = "__pgcdc_index"


@dataclass(frozen=True, slots=True)
class BulkMirror:
    """A folded batch: the rows to upsert (every column as text) and the keys to delete."""

    shape: Shape
    upserts: dict[str, pa.Array]
    upsert_rows: int
    deletes: dict[str, pa.Array]
    delete_rows: int
    #: The LSN of each upsert's change (for an error's message).
    upsert_lsns: pa.Array | None = None
    #: Whether every key's first change in the batch inserted it (`MirrorPlan.inserts_only`).
    inserts_only: bool = False


def _columns(maps: pa.ChunkedArray, names: tuple[str, ...]) -> dict[str, pa.Array] | None:
    """Each named column's values, when every map holds exactly `names` in that order (how
    `pgcdc.envelope.EnvelopeBuilder` lays out the rows of one relation with no unchanged
    TOAST value): taken by position, far cheaper than a lookup by key per row. None when a
    map differs (or is null)."""
    if len(maps) == 0:
        return {name: pa.array([], pa.string()) for name in names}
    combined = maps.combine_chunks()
    if combined.null_count:
        return None
    offsets = combined.offsets.to_numpy()
    if not np.all(np.diff(offsets) == len(names)):
        return None
    starts = offsets[:-1]
    keys, items = combined.keys, combined.items
    out = {}
    for j, name in enumerate(names):
        at = pa.array(starts + j)
        if not pc.all(pc.equal(keys.take(at), name)).as_py():
            return None
        out[name] = items.take(at)
    return out


def bulk_mirror(rows: pa.Table) -> BulkMirror | None:
    """The batch folded in Arrow, or None when it needs the general fold."""
    if rows.num_rows == 0:
        return None
    ops = rows.column("op")
    if not pc.all(pc.is_in(ops, value_set=_ROW_OPS)).as_py():
        return None
    toast = pc.list_value_length(rows.column("unchanged_toast"))
    if pc.max(pc.fill_null(toast, 0)).as_py():
        return None
    if not single_shape(rows):
        return None
    shape = _shape(rows, 0)
    keys = shape.key_names
    if not keys or shape.full_identity:
        return None
    before = _columns(rows.column("key"), keys)
    updated = pc.equal(ops, "update").combine_chunks()
    names = tuple(c.name for c in shape.columns)
    after_keys = _columns(rows.column("after").filter(updated), names)
    if before is None or after_keys is None:
        return None
    for name in keys:  # a key change needs the general fold
        if pc.any(pc.not_equal(before[name].filter(updated), after_keys[name])).as_py():
            return None
    table = pa.table(
        {**{f"k{i}": before[n] for i, n in enumerate(keys)}, _INDEX: pa.array(range(rows.num_rows))}
    )
    order = pc.sort_indices(rows, sort_keys=[("commit_lsn", "ascending"), ("ordinal", "ascending")])
    ranks = pc.sort_indices(order)  # each row's position in sequence order
    table = table.set_column(table.schema.get_field_index(_INDEX), _INDEX, ranks)
    grouped = table.group_by([f"k{i}" for i in range(len(keys))], use_threads=False)
    ranks_of = grouped.aggregate([(_INDEX, "max"), (_INDEX, "min")])
    last_rank = ranks_of.column(f"{_INDEX}_max")
    first_ops = pc.take(ops, pc.take(order, ranks_of.column(f"{_INDEX}_min")))
    inserts_only = bool(pc.all(pc.equal(first_ops, "insert")).as_py())
    winners = pc.take(order, last_rank)
    last = rows.select(["op", "key", "after", "lsn"]).take(winners)
    deleted = pc.equal(last.column("op"), "delete")
    kept = last.filter(pc.invert(deleted))
    gone = last.filter(deleted)
    upserts = _columns(kept.column("after"), names)
    deletes = _columns(gone.column("key"), keys)
    if upserts is None or deletes is None:
        return None
    lsns = kept.column("lsn").combine_chunks()
    return BulkMirror(shape, upserts, kept.num_rows, deletes, gone.num_rows, lsns, inserts_only)
