"""What a change's ``key``, ``before`` and ``after`` hold: the one rule, for one row.

* ``after``: the new row, each column the server sent (a value or NULL); a column whose
  TOASTed value an UPDATE did not change (kind ``u``) is left out and listed in
  ``unchanged_toast``. None for a DELETE.
* ``before``: the old row the server logged: the whole row under REPLICA IDENTITY FULL (old
  kind ``O``), or only the old key's columns (kind ``K``: the server sends the other columns
  as NULL fillers, left out here). None when the server logged no old tuple (an UPDATE that
  did not change the key, under any identity but FULL).
* ``key``: the row's identity before the change: the key columns (flag 1 in the Relation
  message; every column under identity FULL) of the old tuple when the server sent one,
  otherwise of the new row. A key column that is an unchanged TOAST value is left out (only
  possible in a new row under identity FULL, where the old tuple is always sent). None for a
  relation without key columns (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key).

`EnvelopeBuilder` applies the same rule column by column; the ``json`` plugin and the
general fold use these functions. A test checks that they agree.
"""

from __future__ import annotations

from collections.abc import Callable

from pgcdc.protocol import Relation, TupleData

__all__ = ["KIND_BINARY", "KIND_NULL", "KIND_TEXT", "KIND_UNCHANGED", "key_pairs", "row_pairs"]

KIND_TEXT, KIND_NULL, KIND_UNCHANGED, KIND_BINARY = 0x74, 0x6E, 0x75, 0x62

Value = Callable[[int, bytes], str]


def _text(kind: int, value: bytes) -> str:
    return value.decode()


def row_pairs(
    relation: Relation,
    row: TupleData | None,
    *,
    key_only: bool = False,
    value: Value = _text,
) -> list[tuple[str, str | None]] | None:
    """A tuple as (column, text) pairs: unchanged TOAST values left out, and with `key_only`
    (an old key, kind ``K``) every column but the key's. `value` renders a sent value (its
    kind and bytes): text by default."""
    if row is None:
        return None
    pairs = []
    for column, kind, data in zip(relation.columns, row.kinds, row.values, strict=True):
        if kind == KIND_UNCHANGED or (key_only and not column.is_key):
            continue
        pairs.append((column.name, None if data is None else value(kind, data)))
    return pairs


def key_pairs(
    relation: Relation,
    new: TupleData | None,
    old: TupleData | None,
    *,
    value: Value = _text,
) -> list[tuple[str, str | None]] | None:
    """The row's identity before the change (see the module docstring)."""
    if not any(column.is_key for column in relation.columns):
        return None
    return row_pairs(relation, old if old is not None else new, key_only=True, value=value)
