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

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import Shape
from pgcdc.targets.fold import _fingerprints, _shape

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


def _lookup(maps: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    return pc.map_lookup(maps, pa.scalar(name, pa.string()), "first")


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
    fingerprints = _fingerprints(rows)
    if len(set(fingerprints)) != 1:
        return None
    shape = _shape(rows, 0)
    keys = list(shape.key_names)
    if not keys or shape.replica_identity == "f":
        return None
    updates = pc.equal(ops, "update")
    key_columns = []
    for name in keys:
        before = _lookup(rows.column("key"), name)
        if before.null_count:
            return None
        after = _lookup(rows.column("after"), name)
        moved = pc.and_kleene(updates, pc.not_equal(before, after))
        if pc.any(pc.fill_null(moved, True)).as_py():
            return None  # a key change
        key_columns.append(before)
    table = pa.table(
        {**{f"k{i}": c for i, c in enumerate(key_columns)}, _INDEX: pa.array(range(rows.num_rows))}
    )
    order = pc.sort_indices(rows, sort_keys=[("commit_lsn", "ascending"), ("ordinal", "ascending")])
    ranks = pc.sort_indices(order)  # each row's position in sequence order
    table = table.set_column(table.schema.get_field_index(_INDEX), _INDEX, ranks)
    grouped = table.group_by([f"k{i}" for i in range(len(keys))], use_threads=False)
    last_rank = grouped.aggregate([(_INDEX, "max")]).column(f"{_INDEX}_max")
    winners = pc.take(order, last_rank)
    last = rows.take(winners)
    deleted = pc.equal(last.column("op"), "delete")
    kept = last.filter(pc.invert(deleted))
    gone = last.filter(deleted)
    upserts = {c.name: _lookup(kept.column("after"), c.name) for c in shape.columns}
    deletes = {name: _lookup(gone.column("key"), name) for name in keys}
    return BulkMirror(shape, upserts, kept.num_rows, deletes, gone.num_rows)
