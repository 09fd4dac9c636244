"""Hand-built change envelopes: relations, changes and transactions through `EnvelopeBuilder`,
as the pipeline hands them to a target."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgcdc.decoding.model import Change, ChangeAction, Truncation
from pgcdc.envelope import ChangeBatch, EnvelopeBuilder
from pgcdc.protocol import Column, Delete, Insert, Lsn, Relation, TupleData, Update

INT2, INT4, INT8, TEXT, NUMERIC, TIMESTAMPTZ, JSONB, INT4_ARRAY = (
    21,
    23,
    20,
    25,
    1700,
    1184,
    3802,
    1007,
)
#: An unchanged TOAST value (kind ``u``) in `row`.
UNCHANGED = object()

_lsns = itertools.count(0x1000, 0x10)


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def relation(
    *columns: tuple[Any, ...], table: str = "items", identity: str = "d", relid: int = 16384
) -> Relation:
    """columns: (name, type OID[, key[, typmod]])."""
    cols = []
    for spec in columns:
        name, oid, *rest = spec
        key = bool(rest[0]) if rest else False
        typmod = rest[1] if len(rest) > 1 else -1
        cols.append(Column(1 if key or identity == "f" else 0, name, oid, typmod))
    return Relation(relid, "public", table, identity, tuple(cols))


def row(rel: Relation, values: dict[str, Any], only_key: bool = False) -> TupleData:
    """A tuple of `rel` from text values (str, None for NULL, UNCHANGED for ``u``); absent
    columns are NULL (and so are non-key columns when `only_key`)."""
    kinds = bytearray()
    cells: list[bytes | None] = []
    for column in rel.columns:
        value = values.get(column.name)
        if value is UNCHANGED:
            kinds += b"u"
            cells.append(None)
        elif value is None or (only_key and not column.flags & 1):
            kinds += b"n"
            cells.append(None)
        else:
            kinds += b"t"
            cells.append(str(value).encode())
    return TupleData(bytes(kinds), tuple(cells))


def insert(rel: Relation, **values: Any) -> Change:
    return Change(ChangeAction.INSERT, rel, row(rel, values), lsn=Lsn(next(_lsns)))


def update(rel: Relation, new: dict[str, Any], old: dict[str, Any] | None = None) -> Change:
    """An UPDATE; `old` (the old key, or the old row under identity full) when sent."""
    kind = None if old is None else ("O" if rel.replica_identity == "f" else "K")
    old_row = None if old is None else row(rel, old, only_key=kind == "K")
    return Change(ChangeAction.UPDATE, rel, row(rel, new), old_row, kind, Lsn(next(_lsns)))


def delete(rel: Relation, **old: Any) -> Change:
    kind = "O" if rel.replica_identity == "f" else "K"
    return Change(
        ChangeAction.DELETE, rel, None, row(rel, old, only_key=kind == "K"), kind, Lsn(next(_lsns))
    )


def truncate(*rels: Relation) -> tuple[Truncation, tuple[Relation, ...]]:
    relids = tuple(r.relid for r in rels)
    return (Truncation(False, False, Lsn(next(_lsns)), relids=relids), rels)


@dataclass(frozen=True)
class Txn:
    commit_lsn: int
    entries: tuple[Any, ...]


def txn(commit_lsn: int, *entries: Any) -> Txn:
    return Txn(commit_lsn, entries)


def _message(change: Change) -> Insert | Update | Delete:
    rel = change.relation
    if change.action is ChangeAction.INSERT:
        assert change.new is not None
        return Insert(rel.relid, change.new)
    if change.action is ChangeAction.UPDATE:
        assert change.new is not None
        return Update(rel.relid, change.old_kind, change.old, change.new)  # type: ignore[arg-type]
    return Delete(rel.relid, change.old_kind, change.old)  # type: ignore[arg-type]


def envelope(*txns: Txn, reverse: bool = False) -> pa.Table:
    """The envelope rows of `txns`, reversed when asked (a target sorts them itself)."""
    table = changes(*txns).envelope()
    if reverse:
        table = table.take(pa.array(range(table.num_rows - 1, -1, -1)))
    return table


def changes(*txns: Txn) -> ChangeBatch:
    """`txns` as the pipeline hands them to a target: a `ChangeBatch`."""
    builder = EnvelopeBuilder()
    for t in txns:
        builder.begin(t.commit_lsn, 700, None, None)
        ordinal = 0
        for entry in t.entries:
            if isinstance(entry, Change):
                ordinal += 1
                builder.change(ordinal, _message(entry), entry.relation, entry.lsn)
            else:
                truncation, rels = entry
                for rel in rels:
                    ordinal += 1
                    builder.truncate(
                        ordinal, rel, truncation.cascade, truncation.restart_seqs, truncation.lsn
                    )
    return ChangeBatch([builder.flush_rows()])


def rows(table: pa.Table, *columns: str) -> list[tuple[Any, ...]]:
    """The table's rows as sorted tuples of `columns` (all when none given)."""
    names = list(columns) or table.column_names
    data = [tuple(r[n] for n in names) for r in table.select(names).to_pylist()]
    try:
        return sorted(data, key=lambda r: tuple((v is not None, v) for v in r))
    except TypeError:  # unorderable values (structs, maps)
        return sorted(data, key=repr)
