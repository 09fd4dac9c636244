"""CDC semantics without I/O: a batch of change envelopes folded into what a table must do.

The input is the envelope rows of one source table (`pgcdc.envelope`), values still the
server's text. Folding happens on that text, before any typing: a key touched a hundred times in
a batch is typed and written once.

* `changes_from_envelope` reads the rows and orders them by (commit_lsn, ordinal);
* `segments` splits them where the table's identity (its key column names) changes, since rows
  identified by different columns cannot be folded together;
* `fold_mirror` gives the net effect per key (SCD type 1): the rows to upsert and the keys to
  delete, after an optional truncation;
* `fold_history` gives the versions to open and the target versions to close (SCD type 2);
* `fold_multiset` does both for a table under REPLICA IDENTITY FULL, where the key is the
  whole row and identical rows are distinct copies: a mirror must hold as many copies as the
  source, and deleting or updating one copy touches only one.

An UPDATE's unchanged TOAST columns are resolved here when the batch itself knows their value
(the old row under REPLICA IDENTITY FULL, or an earlier change to the same key); otherwise the
image lists them in `missing`, with the key of the target row that holds the value, for the
writer to read before it writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.errors import TargetError
from pgcdc.protocol import Lsn

__all__ = [
    "Change",
    "ColumnInfo",
    "HistoryPlan",
    "Image",
    "Key",
    "MirrorPlan",
    "MultisetPlan",
    "Seq",
    "Shape",
    "Version",
    "changes_from_envelope",
    "describe_seq",
    "fold_history",
    "fold_mirror",
    "fold_multiset",
    "segments",
]

#: (commit_lsn, ordinal): the total order of changes.
Seq = tuple[int, int]
#: A row's identity: its key columns' text values, in the shape's key order.
Key = tuple[Any, ...]
Text = dict[str, str | None]

_OPS = frozenset({"insert", "update", "delete", "truncate"})
_READ = ("commit_lsn", "ordinal", "op", "key", "before", "after", "unchanged_toast", "lsn")
_SHAPE_FIELDS = ("schema", "table", "relation_oid", "replica_identity")
_COLUMN_FIELDS = ("name", "type_oid", "type_modifier", "key", "attnum")


@dataclass(slots=True)
class Change:
    """One envelope row, maps as dicts."""

    seq: Seq
    op: str
    shape: Shape
    key: Text | None
    before: Text | None
    after: Text | None
    unchanged: tuple[str, ...]
    lsn: int | None


def _as_map(value: Any) -> Text | None:
    """An Arrow map cell as a dict (pyarrow gives a list of pairs)."""
    if value is None or isinstance(value, dict):
        return value
    return dict(value)


def single_shape(rows: pa.Table) -> bool:
    """Whether every row describes the same relation (the usual batch): its relation fields
    and every column of its ``columns`` equal the first row's, compared column-wise."""
    if rows.num_rows == 0:
        return False
    for name in _SHAPE_FIELDS:
        column = rows.column(name)
        if column.null_count or not pc.all(pc.equal(column, column[0])).as_py():
            return False
    columns = rows.column("columns").combine_chunks()
    if columns.null_count:
        return False
    lengths = pc.list_value_length(columns)
    count = lengths[0].as_py()
    if not pc.all(pc.equal(lengths, count)).as_py():
        return False
    flat = pc.list_flatten(columns)
    first = flat.slice(0, count)
    every = pa.array(np.tile(np.arange(count), len(columns)))
    for name in _COLUMN_FIELDS:
        if flat.type.get_field_index(name) < 0:  # an envelope from before attnums
            continue
        field = pc.struct_field(flat, name)
        if not pc.all(pc.equal(field, pc.struct_field(first, name).take(every))).as_py():
            return False
    return True


def _fingerprints(rows: pa.Table) -> list[str]:
    """Per row, a string naming the relation it describes (schema, table, oid, identity and
    every column's name, type, typmod and key flag), so that rows map to shapes without
    converting their column lists to Python."""
    columns = rows.column("columns").combine_chunks()
    elements = columns.values
    fields = [elements.field(n) for n in _COLUMN_FIELDS if elements.type.get_field_index(n) >= 0]
    text = [pc.cast(f, pa.string()) for f in fields]
    joined = pc.binary_join_element_wise(*text, "\x1e", null_handling="replace")
    lists = pa.ListArray.from_arrays(columns.offsets, joined, mask=columns.is_null())
    head = [pc.cast(rows.column(n), pa.string()) for n in _SHAPE_FIELDS]
    whole = pc.binary_join_element_wise(
        *head, pc.binary_join(lists, "\x1f"), "\x1d", null_handling="replace"
    )
    return whole.to_pylist()


def _shape(rows: pa.Table, i: int) -> Shape:
    schema, table, oid, identity = (rows.column(n)[i].as_py() for n in _SHAPE_FIELDS)
    columns = tuple(
        ColumnInfo(
            c["name"],
            int(c["type_oid"]),
            -1 if c["type_modifier"] is None else int(c["type_modifier"]),
            bool(c["key"]),
            int(c.get("attnum") or 0),
        )
        for c in rows.column("columns")[i].as_py() or ()
    )
    return Shape(schema or "", table or "", oid or 0, identity or "d", columns)


def changes_from_envelope(rows: pa.Table) -> list[Change]:
    """The table's changes in (commit_lsn, ordinal) order; message rows are left out."""
    if rows.num_rows == 0:
        return []
    data = {name: rows.column(name).to_pylist() for name in _READ}
    shapes: dict[str, Shape] = {}
    changes: list[Change] = []
    for i, fingerprint in enumerate(_fingerprints(rows)):
        op = data["op"][i]
        if op not in _OPS:
            if op == "message":
                continue
            seq = (data["commit_lsn"][i], data["ordinal"][i])
            raise TargetError(f"unknown change op {op!r} at {describe_seq(seq)}")
        shape = shapes.get(fingerprint)
        if shape is None:
            shape = shapes[fingerprint] = _shape(rows, i)
        changes.append(
            Change(
                (data["commit_lsn"][i], data["ordinal"][i]),
                op,
                shape,
                _as_map(data["key"][i]),
                _as_map(data["before"][i]),
                _as_map(data["after"][i]),
                tuple(data["unchanged_toast"][i] or ()),
                data["lsn"][i],
            )
        )
    changes.sort(key=lambda c: c.seq)
    return changes


def segments(changes: list[Change]) -> Iterator[list[Change]]:
    """Runs of changes that share the key column names (a truncation joins either run)."""
    run: list[Change] = []
    names: tuple[str, ...] | None = None
    for change in changes:
        if change.op != "truncate":
            if names is not None and change.shape.key_names != names and run:
                yield run
                run = []
            names = change.shape.key_names
        run.append(change)
    if run:
        yield run


@dataclass(slots=True)
class Image:
    """A row to write, as text: `values` by column (absent = NULL), typed with `shape`.

    `missing` maps each unchanged TOAST column whose value the batch does not know to the key
    of the target row that holds it (the key before any key change)."""

    values: Text
    shape: Shape
    missing: dict[str, Key] = field(default_factory=dict)
    #: The LSN of the change that made the image, for error messages.
    lsn: int | None = None
    #: The sequence of the change that made the image (what a type change came after).
    seq: Seq | None = None


def describe_seq(seq: Seq) -> str:
    """A change's place, for messages."""
    return f"commit LSN {Lsn(seq[0])}, change {seq[1]}"


def _key_of(values: Text | None, shape: Shape, seq: Seq) -> Key:
    if not shape.key_names:  # no identity (REPLICA IDENTITY NOTHING): every row is its own
        return ("\0row", *seq)
    if values is None:
        raise TargetError(f"{shape.name}: the change at {describe_seq(seq)} carries no key")
    return tuple(values.get(name) for name in shape.key_names)


def _image_key(image: Image, seq: Seq) -> Key:
    """The key of a row image: the one rule for every image a change makes. Taken from the
    values with unchanged TOAST columns filled in (under REPLICA IDENTITY FULL they are part
    of the key), never from the raw new tuple, which lacks them."""
    unknown = [n for n in image.shape.key_names if n in image.missing]
    if unknown:
        raise TargetError(
            f"{image.shape.name}: the key column(s) {', '.join(unknown)} of the change at "
            f"{describe_seq(seq)} are unchanged TOAST values the change does not carry"
        )
    return _key_of(image.values, image.shape, seq)


def _key_image(values: Text | None, change: Change) -> Image:
    names = change.shape.key_names
    kept = {n: v for n, v in (values or {}).items() if n in names}
    return Image(kept, change.shape, lsn=change.lsn, seq=change.seq)


def _identity(change: Change) -> Key:
    """The key the row had before `change` (update, delete)."""
    if not change.shape.key_names:
        raise TargetError(
            f"{change.shape.name} has no replica identity key: cannot apply the {change.op} "
            f"at {describe_seq(change.seq)}"
        )
    return _key_of(change.key, change.shape, change.seq)


_UNKNOWN = object()  # the batch has not touched the key: its current row is the target's


def _new_image(change: Change, old: Key, previous: Image | object | None) -> Image:
    """An UPDATE's new row with its unchanged TOAST columns filled from what is known:
    the old row (identity full), an earlier image of the key in this batch, or (`missing`)
    the target's current row for the old key."""
    values = dict(change.after or {})
    missing: dict[str, Key] = {}
    before = change.before or {}
    for column in change.unchanged:
        if column in before:
            values[column] = before[column]
        elif isinstance(previous, Image):
            if column in previous.values:
                values[column] = previous.values[column]
            elif column in previous.missing:
                missing[column] = previous.missing[column]
        elif previous is _UNKNOWN:
            missing[column] = old
        # else the key was deleted or truncated earlier in the batch: nothing to keep
    return Image(values, change.shape, missing, change.lsn, change.seq)


@dataclass(slots=True)
class MirrorPlan:
    """The net effect of a run of changes on a mirror (SCD type 1) table.

    `truncated`: the table is emptied first and `upserts` are its whole content (`deletes` is
    then empty). `lookups`: the key image of every target key a `missing` column refers to.
    `born`: the keys whose first change in the run inserted them (the source did not have
    them before the run, so neither has a target that equals it)."""

    truncated: bool = False
    upserts: dict[Key, Image] = field(default_factory=dict)
    deletes: dict[Key, Image] = field(default_factory=dict)
    lookups: dict[Key, Image] = field(default_factory=dict)
    born: set[Key] = field(default_factory=set)

    @property
    def inserts_only(self) -> bool:
        """Whether the run only adds rows of keys it inserted first (and may delete some of
        them again): written by appending its upserts, once the target is found to hold
        none of those keys."""
        return (
            not self.truncated
            and self.born.issuperset(self.upserts)
            and self.born.issuperset(self.deletes)
        )


def fold_mirror(changes: Iterable[Change]) -> MirrorPlan:
    """Folds changes (in sequence order) into one upsert or delete per key."""
    state: dict[Key, Image | None] = {}  # None: deleted
    removed: dict[Key, Image] = {}  # the key image of every deleted key
    plan = MirrorPlan()
    for change in changes:
        op, shape = change.op, change.shape
        if op == "truncate":
            state.clear()
            removed.clear()
            plan.lookups.clear()
            plan.truncated = True
        elif op == "insert":
            image = Image(dict(change.after or {}), shape, lsn=change.lsn, seq=change.seq)
            key = _image_key(image, change.seq)
            if key not in state:
                plan.born.add(key)
            state[key] = image
        elif op == "update":
            old = _identity(change)
            previous = state.get(old, None if plan.truncated else _UNKNOWN)
            image = _new_image(change, old, previous)
            new = _image_key(image, change.seq)
            if previous is _UNKNOWN and image.missing:
                plan.lookups[old] = _key_image(change.key, change)
            if new != old:
                state[old] = None
                removed[old] = _key_image(change.key, change)
            state[new] = image
        else:  # delete
            old = _identity(change)
            state[old] = None
            removed[old] = _key_image(change.key, change)
    for key, final in state.items():
        if final is not None:
            plan.upserts[key] = final
        elif not plan.truncated:  # after a truncation the table holds only the upserts
            plan.deletes[key] = removed[key]
    return plan


@dataclass(slots=True)
class Version:
    """A row version to insert into a history table: valid from `start` until `end` (None:
    still current)."""

    key: Key
    image: Image
    start: Seq
    end: Seq | None = None


@dataclass(slots=True)
class HistoryPlan:
    """What a run of changes does to a history (SCD type 2) table.

    `closes`: per key, the sequence at which the target's current version ends, and the key
    image to match it. `versions`: the versions the run opens, closed in-batch or not.
    `truncated_at`: the first truncation, which ends every target version still open.
    `lookups` as in `MirrorPlan` (against the target's current versions); `deletes`: the
    number of delete changes."""

    closes: dict[Key, tuple[Seq, Image]] = field(default_factory=dict)
    versions: list[Version] = field(default_factory=list)
    truncated_at: Seq | None = None
    lookups: dict[Key, Image] = field(default_factory=dict)
    deletes: int = 0
    #: The keys whose first change in the run inserted them (as in `MirrorPlan`).
    born: set[Key] = field(default_factory=set)

    @property
    def inserts_only(self) -> bool:
        """Whether the run only opens versions of keys it inserted first: written by
        appending its versions, once the target is found to hold no current version of
        those keys."""
        return self.truncated_at is None and self.born.issuperset(self.closes)


def fold_history(changes: Iterable[Change]) -> HistoryPlan:
    """Turns changes (in sequence order) into version rows: each insert or update opens a
    version and ends the key's previous one; a delete ends it; a truncation ends all."""
    plan = HistoryPlan()
    current: dict[Key, int] = {}  # key -> index in plan.versions of its open in-batch version
    settled: set[Key] = set()  # keys whose target version this run has already ended

    def close(key: Key, seq: Seq, image: Image) -> None:
        if key in current:
            plan.versions[current.pop(key)].end = seq
        elif plan.truncated_at is None and key not in settled:
            plan.closes[key] = (seq, image)
        settled.add(key)

    for change in changes:
        op, shape, seq = change.op, change.shape, change.seq
        if op == "truncate":
            for index in current.values():
                plan.versions[index].end = seq
            current.clear()
            if plan.truncated_at is None:
                plan.truncated_at = seq
        elif op == "insert":
            image = Image(dict(change.after or {}), shape, lsn=change.lsn, seq=change.seq)
            new = _image_key(image, seq)
            if new not in current and new not in settled and plan.truncated_at is None:
                plan.born.add(new)
            if shape.key_names:  # without identity a row is new by definition
                close(new, seq, _key_image(image.values, change))
            current[new] = len(plan.versions)
            plan.versions.append(Version(new, image, seq))
        elif op == "update":
            old = _identity(change)
            if old in current:
                previous: Image | object | None = plan.versions[current[old]].image
            elif old in settled or plan.truncated_at is not None:
                previous = None
            else:
                previous = _UNKNOWN
            image = _new_image(change, old, previous)
            new = _image_key(image, seq)
            if previous is _UNKNOWN and image.missing:
                plan.lookups[old] = _key_image(change.key, change)
            close(old, seq, _key_image(change.key, change))
            if new != old:
                close(new, seq, _key_image(image.values, change))
            current[new] = len(plan.versions)
            plan.versions.append(Version(new, image, seq))
        else:  # delete
            plan.deletes += 1
            close(_identity(change), seq, _key_image(change.key, change))
    return plan


@dataclass(slots=True)
class MultisetPlan:
    """What a run of changes does to a table whose rows are a multiset (REPLICA IDENTITY FULL).

    `versions`: the copies the run adds, in order (a mirror writes those still open; a
    history writes them all). `removals`: per key, the sequences at which one of the target's
    own copies goes (deleted, or its version ended), after the run's own copies of the key
    went first (the latest first). `truncated_at`: the first truncation, which removes every
    copy the target still holds then. `images`: each key's image, to match the target's
    copies. `deletes`: the number of delete changes."""

    versions: list[Version] = field(default_factory=list)
    removals: dict[Key, list[Seq]] = field(default_factory=dict)
    truncated_at: Seq | None = None
    images: dict[Key, Image] = field(default_factory=dict)
    deletes: int = 0

    def open_versions(self) -> list[Version]:
        return [v for v in self.versions if v.end is None]


def fold_multiset(changes: Iterable[Change]) -> MultisetPlan:
    """Count copies: an insert adds one, a delete removes one, an update removes one of the
    old row and adds one of the new. A removal takes the run's latest open copy of the key if
    it has one, else one of the target's."""
    plan = MultisetPlan()
    open_copies: dict[Key, list[int]] = {}  # key -> indexes of its open versions in the run

    def add(change: Change, image: Image) -> None:
        key = _image_key(image, change.seq)
        plan.images.setdefault(key, _key_image(image.values, change))
        open_copies.setdefault(key, []).append(len(plan.versions))
        plan.versions.append(Version(key, image, change.seq))

    def remove(change: Change) -> None:
        key = _identity(change)
        plan.images.setdefault(key, _key_image(change.key, change))
        mine = open_copies.get(key)
        if mine:
            plan.versions[mine.pop()].end = change.seq
        elif plan.truncated_at is not None:
            raise TargetError(
                f"{change.shape.name}: the {change.op} at {describe_seq(change.seq)} removes a row "
                "that a truncation earlier in the batch already removed"
            )
        else:
            plan.removals.setdefault(key, []).append(change.seq)

    for change in changes:
        op = change.op
        if op == "truncate":
            for indexes in open_copies.values():
                for index in indexes:
                    plan.versions[index].end = change.seq
            open_copies.clear()
            if plan.truncated_at is None:
                plan.truncated_at = change.seq
        elif op == "insert":
            image = Image(dict(change.after or {}), change.shape, lsn=change.lsn, seq=change.seq)
            add(change, image)
        elif op == "update":
            # the old row is complete under identity FULL: unchanged TOAST values come from it
            image = _new_image(change, _identity(change), None)
            remove(change)
            add(change, image)
        else:
            plan.deletes += 1
            remove(change)
    return plan
