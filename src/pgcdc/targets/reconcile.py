"""What it takes to make a table equal another: the differences, row by row (no I/O).

After the pipeline's slot was lost (dropped, or invalidated by ``max_slot_wal_keep_size``),
the changes made since the targets' watermarks cannot be streamed any more. The pipeline
copies every table again under a new slot's snapshot and reconciles each target with that
copy: only the rows that differ change (and a history gets versions for exactly those).
`diff_by_key` compares by the table's key; `diff_multiset` compares whole rows counted, for a
table without one (REPLICA IDENTITY FULL, where identical rows are copies).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["KeyedDiff", "MultisetDiff", "diff_by_key", "diff_multiset", "hashable"]


def hashable(value: Any) -> Any:
    """A row's value (lists and structs nested) as a key of a dict."""
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, hashable(v)) for k, v in value.items())
    return value


@dataclass(frozen=True, slots=True)
class KeyedDiff:
    """Rows (of the wanted table) to insert and to update, and keys (of the current table)
    whose rows go."""

    inserts: pa.Table
    updates: pa.Table
    deletes: pa.Table

    @property
    def empty(self) -> bool:
        return not (self.inserts.num_rows or self.updates.num_rows or self.deletes.num_rows)


def diff_by_key(current: pa.Table, wanted: pa.Table, keys: Sequence[str]) -> KeyedDiff:
    """`wanted` against `current`, both with `wanted`'s columns, matched by `keys`."""
    names = wanted.column_names
    have = {
        hashable(tuple(r[k] for k in keys)): hashable(tuple(r[n] for n in names))
        for r in current.select(names).to_pylist()
    }
    inserts, updates = [], []
    seen = set()
    for i, row in enumerate(wanted.to_pylist()):
        key = hashable(tuple(row[k] for k in keys))
        seen.add(key)
        old = have.get(key)
        if old is None:
            inserts.append(i)
        elif old != hashable(tuple(row[n] for n in names)):
            updates.append(i)
    gone = [i for i, key in enumerate(have) if key not in seen]
    key_rows = current.select(list(keys))
    return KeyedDiff(
        wanted.take(pa.array(inserts, pa.int64())),
        wanted.take(pa.array(updates, pa.int64())),
        key_rows.take(pa.array(gone, pa.int64())),
    )


@dataclass(frozen=True, slots=True)
class MultisetDiff:
    """Copies to add (rows of the wanted table) and, per row of the current table that has
    too many copies, how many go (indexes of one copy each in `current`)."""

    additions: pa.Table
    surplus: dict[int, int]

    @property
    def empty(self) -> bool:
        return not (self.additions.num_rows or self.surplus)


def diff_multiset(current: pa.Table, wanted: pa.Table) -> MultisetDiff:
    """`wanted` against `current` as multisets of whole rows (`wanted`'s columns)."""
    names = wanted.column_names
    have_rows = [hashable(tuple(r[n] for n in names)) for r in current.select(names).to_pylist()]
    have = Counter(have_rows)
    want_rows = [hashable(tuple(r[n] for n in names)) for r in wanted.to_pylist()]
    want = Counter(want_rows)
    first: dict[object, int] = {}
    for i, row in enumerate(have_rows):
        first.setdefault(row, i)
    surplus = {first[row]: have[row] - want[row] for row in have if have[row] > want[row]}
    missing = want - have
    additions = []
    for i, row in enumerate(want_rows):
        if missing[row] > 0:
            missing[row] -= 1
            additions.append(i)
    return MultisetDiff(wanted.take(pa.array(additions, pa.int64())), surplus)
