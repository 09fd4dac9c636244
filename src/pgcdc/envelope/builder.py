"""Decoded changes to envelope record batches, a column at a time.

`EnvelopeBuilder` collects a batch's changes and builds each envelope column with numpy and
Arrow at `flush`. Row changes go, relation by relation, into `pgcdc.protocol.columns`
collectors: change frames straight from the spool (`frames`, no Python object per row or
value; the C path), or one decoded change at a time (`change`). A transaction's columns are
stored once and repeated, a relation's once and taken per row, and the maps ``key``,
``before`` and ``after`` are cut from one flat array of values by masks on the kinds, by the
rule of `pgcdc.envelope.images`. Values are the server's text (the pipeline's sessions are in
text mode); a value that is not UTF-8 is an error naming the table.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from pgcdc.envelope.batch import ShapeRows, cell_values
from pgcdc.envelope.images import KIND_UNCHANGED
from pgcdc.envelope.schema import COLUMN_TYPE, ENVELOPE_ARROW_SCHEMA, SEQUENCE_TYPE
from pgcdc.envelope.shape import Shape
from pgcdc.protocol import Delete, Insert, Relation, Update, encode
from pgcdc.protocol.columns import (
    OP_DELETE,
    RowBuffers,
    RowColumnsLike,
    change_frame,
    finish,
    row_columns,
)

__all__ = ["OP_CODES", "EnvelopeBuilder", "FlushedRows", "snapshot_reads"]

#: The ``op`` of each change kind, by code (``read``: a row of the initial copy).
OPS = ("insert", "update", "delete", "truncate", "message", "read")
OP_CODES = {name: code for code, name in enumerate(OPS)}
_TRUNCATE, _MESSAGE = 3, 4
#: Microseconds from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch).
_PG_EPOCH_US = 946_684_800_000_000
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_OPS_ARRAY = pa.array(OPS, pa.string())
#: A row that is not a row change (truncate, message) in the order of rows.
_OTHER = -1
#: A relation and what each of its columns is (its attnums; empty: not known).
_Described = tuple[Relation, tuple[int, ...]]


@dataclass(slots=True)
class _Txn:
    commit_lsn: int
    xid: int | None
    commit_ts: int | None
    origin: str | None
    rows: int = 0


class _Group:
    """The row changes of one relation (as one Relation message described it)."""

    __slots__ = ("attnums", "collector", "relation")

    def __init__(self, relation: Relation, attnums: tuple[int, ...]) -> None:
        self.relation = relation
        self.attnums = attnums
        self.collector: RowColumnsLike = row_columns(relation.relid, len(relation.columns))


class EnvelopeBuilder:
    """Collects changes (`begin`, then `frames`, `change`, `truncate`, `message`) and builds
    envelope batches (`flush`, `ENVELOPE_ARROW_SCHEMA`)."""

    def __init__(self) -> None:
        self._txns: list[_Txn] = []
        self._groups: list[_Group] = []
        self._group_of: dict[int, int] = {}  # id(relation) -> group
        #: Per row, in order: its group, or _OTHER.
        self._order = array("i")
        #: The truncate and message rows, in order: (ordinal, op, lsn, relation and its
        #: attnums, extras).
        self._others: list[tuple[int, int, int | None, _Described | None, tuple[object, ...]]] = []

    def __len__(self) -> int:
        return len(self._order)

    @property
    def value_bytes(self) -> int:
        """The values collected so far (a caller flushes before Arrow's 2 GB limit)."""
        return sum(g.collector.value_bytes for g in self._groups)  # type: ignore[attr-defined]

    def begin(
        self, commit_lsn: int, xid: int | None, commit_ts: int | None, origin: str | None
    ) -> None:
        """The rows that follow are the transaction's that committed at `commit_lsn`."""
        self._txns.append(_Txn(int(commit_lsn), xid, commit_ts, origin))

    def _group(self, relation: Relation, attnums: tuple[int, ...] = ()) -> int:
        index = self._group_of.get(id(relation))
        if index is None:
            index = self._group_of[id(relation)] = len(self._groups)
            # holds the relation: its id stays its own
            self._groups.append(_Group(relation, attnums))
        return index

    def frames(
        self,
        relation: Relation,
        buffer: bytes | memoryview,
        start: int,
        end: int,
        attnums: tuple[int, ...] = (),
    ) -> int:
        """Change frames of `relation` in ``buffer[start:end]``; the offset of the first one
        not taken (a message of another type, or one that does not decode), `end` when all
        were. `attnums`: what each of the relation's columns is (empty: not known), for
        every change of this relation object."""
        index = self._group_of.get(id(relation))
        if index is None:
            index = self._group(relation, attnums)
        collector = self._groups[index].collector
        before = collector.rows
        stop = collector.add(buffer, start, end)
        added = collector.rows - before
        if added == 1:
            self._order.append(index)
            self._txns[-1].rows += 1
        elif added:
            self._order.extend(array("i", [index]) * added)
            self._txns[-1].rows += added
        return stop

    @property
    def commit_lsn(self) -> int:
        """The commit position of the transaction whose rows come now (0 before any)."""
        return self._txns[-1].commit_lsn if self._txns else 0

    def change(
        self,
        ordinal: int,
        message: Insert | Update | Delete,
        relation: Relation,
        lsn: int | None,
        attnums: tuple[int, ...] = (),
    ) -> None:
        """One decoded insert, update or delete of `relation`."""
        if message.xid is not None:  # a frame has no stream block's xid
            message = replace(message, xid=None)
        frame = change_frame(ordinal, lsn or 0, encode(message))
        if self.frames(relation, frame, 0, len(frame), attnums) != len(frame):
            raise ValueError(f"{message!r} does not fit {relation.relname}'s relation")

    def truncate(
        self,
        ordinal: int,
        relation: Relation,
        cascade: bool,
        restart: bool,
        lsn: int | None,
        attnums: tuple[int, ...] = (),
    ) -> None:
        """One of the tables a TRUNCATE emptied."""
        self._other(ordinal, _TRUNCATE, lsn, (relation, attnums), (cascade, restart))

    def message(
        self, ordinal: int, prefix: str, content: bytes, transactional: bool, lsn: int | None
    ) -> None:
        """A logical decoding message."""
        self._other(ordinal, _MESSAGE, lsn, None, (prefix, content, transactional))

    def _other(
        self,
        ordinal: int,
        op: int,
        lsn: int | None,
        relation: _Described | None,
        extras: tuple[object, ...],
    ) -> None:
        self._txns[-1].rows += 1
        self._order.append(_OTHER)
        self._others.append((ordinal, op, lsn, relation, extras))

    def flush(self) -> pa.RecordBatch:
        """The rows collected since the last flush, in the order they came."""
        return self.flush_rows().envelope()

    def flush_rows(self) -> FlushedRows:
        """The rows collected since the last flush, as column buffers (`FlushedRows`: the
        envelope, or the rows per relation shape, made from them on demand)."""
        txns = [t for t in self._txns if t.rows]
        order = np.frombuffer(self._order, np.int32) if len(self._order) else np.zeros(0, np.int32)
        flushed = FlushedRows(
            txns, order, [(g, finish(g.collector)) for g in self._groups], self._others
        )
        if self._txns:  # a transaction may go on after a flush
            last = self._txns[-1]
            self._txns = [_Txn(last.commit_lsn, last.xid, last.commit_ts, last.origin)]
        self._order, self._others = array("i"), []
        self._groups, self._group_of = [], {}
        return flushed


class FlushedRows:
    """What one flush took: the transactions, the row order (each row's group, or
    `_OTHER`), each relation's column buffers, the truncate and message rows."""

    __slots__ = ("groups", "order", "others", "txns")

    def __init__(
        self,
        txns: list[_Txn],
        order: np.ndarray,
        groups: list[tuple[_Group, RowBuffers]],
        others: list[tuple[int, int, int | None, _Described | None, tuple[object, ...]]],
    ) -> None:
        self.txns, self.order, self.groups, self.others = txns, order, groups, others

    @property
    def rows(self) -> int:
        return len(self.order)

    @property
    def commit_lsns(self) -> tuple[int, int]:
        """The lowest and highest commit LSN of the rows (the ranges of a partitioned
        table's leaves come one after the other: not in commit order)."""
        lsns = [t.commit_lsn for t in self.txns]
        return min(lsns), max(lsns)

    @property
    def last_commit_time(self) -> datetime | None:
        times = [t.commit_ts for t in self.txns if t.commit_ts is not None]
        if not times:
            return None
        return _PG_EPOCH + timedelta(microseconds=max(times))

    def _per_row_txn(self) -> np.ndarray:
        counts = np.fromiter((t.rows for t in self.txns), np.int64, count=len(self.txns))
        return np.repeat(np.arange(len(self.txns)), counts)

    def shape_rows(self) -> list[ShapeRows] | None:
        """Each relation's rows (`ShapeRows`), or None when there are truncate or message
        rows too."""
        if self.others:
            return None
        per_txn = self._per_row_txn()
        lsns = np.array([t.commit_lsn for t in self.txns], np.int64)
        out = []
        for index, (group, buffers) in enumerate(self.groups):
            at = np.flatnonzero(self.order == index)
            out.append(_shape_rows(group, buffers, lsns[per_txn[at]]))
        return out

    def envelope(self) -> pa.RecordBatch:
        """The rows as envelope rows, in the order they came."""
        txns, order, others = self.txns, self.order, self.others
        n = len(order)
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=ENVELOPE_ARROW_SCHEMA)
        per_txn = self._per_row_txn()
        commit_lsn = pa.array(np.array([t.commit_lsn for t in txns], np.int64)[per_txn])
        parts = [_GroupColumns.of(g, buffers) for g, buffers in self.groups]
        parts.append(_GroupColumns.of_others(others))
        slot = np.where(order == _OTHER, len(self.groups), order)
        # each row's place in the concatenation of the groups' columns
        starts = np.cumsum([0, *(p.rows for p in parts)])
        position = np.empty(n, np.int64)
        for g in range(len(parts)):
            rows = np.nonzero(slot == g)[0]
            position[rows] = starts[g] + np.arange(len(rows))
        take = None if np.array_equal(position, np.arange(n)) else pa.array(position)

        def column(name: str) -> pa.Array:
            whole = pa.concat_arrays([p.columns[name] for p in parts if p.rows])
            return whole if take is None else whole.take(take)

        ordinals = column("ordinal")
        columns = {
            "commit_lsn": commit_lsn,
            "ordinal": ordinals,
            "sequence": pa.StructArray.from_arrays(
                [commit_lsn, ordinals], fields=list(SEQUENCE_TYPE)
            ),
            "xid": _per_txn([t.xid for t in txns], per_txn, pa.int64()),
            "commit_ts": _per_txn(
                [None if t.commit_ts is None else t.commit_ts + _PG_EPOCH_US for t in txns],
                per_txn,
                pa.int64(),
            ).cast(pa.timestamp("us", tz="UTC")),
            "origin": _per_txn([t.origin for t in txns], per_txn, pa.string()),
            "op": _OPS_ARRAY.take(column("op")),
        }
        rest = (f.name for f in ENVELOPE_ARROW_SCHEMA if f.name not in columns)
        columns.update({name: column(name) for name in rest})
        return pa.RecordBatch.from_arrays(
            [columns[f.name] for f in ENVELOPE_ARROW_SCHEMA], schema=ENVELOPE_ARROW_SCHEMA
        )


def _shape_rows(group: _Group, b: RowBuffers, commit_lsn: np.ndarray) -> ShapeRows:
    relation = group.relation
    ncols = len(relation.columns)
    table = f"{relation.schema}.{relation.relname}"
    new_kinds = np.frombuffer(b.new_kinds, np.uint8).reshape(b.rows, ncols)
    old_kinds = np.frombuffer(b.old_kinds, np.uint8).reshape(b.rows, ncols)
    return ShapeRows(
        Shape.of(relation, group.attnums),
        commit_lsn,
        np.frombuffer(b.ordinal, "<i8"),
        np.frombuffer(b.lsn, "<i8"),
        np.frombuffer(b.op, np.uint8),
        np.frombuffer(b.old_kind, np.uint8),
        new_kinds,
        cell_values(new_kinds, b.new_offsets, b.new_values, table),
        old_kinds,
        cell_values(old_kinds, b.old_offsets, b.old_values, table),
    )


def _per_txn(values: list[object], per_txn: np.ndarray, type_: pa.DataType) -> pa.Array:
    """Per-transaction values, one per row."""
    if all(v is None for v in values):
        return pa.nulls(len(per_txn), type_)
    return pa.array(values, type_).take(pa.array(per_txn))


def _relation_columns(
    relation: Relation | None, rows: int, attnums: tuple[int, ...] = ()
) -> dict[str, pa.Array]:
    """``schema`` … ``columns`` of `rows` rows of one relation (None: no relation)."""
    if relation is None:
        names = ("schema", "table", "relation_oid", "replica_identity", "columns")
        return {n: pa.nulls(rows, ENVELOPE_ARROW_SCHEMA.field(n).type) for n in names}
    numbers = attnums or (0,) * len(relation.columns)
    columns = [
        (c.name, c.type_oid, c.type_modifier, c.is_key, n)
        for c, n in zip(relation.columns, numbers, strict=True)
    ]
    one = {
        "schema": pa.array([relation.schema], pa.string()),
        "table": pa.array([relation.relname], pa.string()),
        "relation_oid": pa.array([relation.relid], pa.int64()),
        "replica_identity": pa.array([relation.replica_identity], pa.string()),
        "columns": pa.array([columns], pa.list_(pa.field("element", COLUMN_TYPE))),
    }
    index = pa.array(np.zeros(rows, np.int64))
    return {name: values.take(index) for name, values in one.items()}


@dataclass(slots=True)
class _GroupColumns:
    """The envelope columns (but the transaction's) of one group's rows, in their order."""

    rows: int
    columns: dict[str, pa.Array]

    @classmethod
    def of(cls, group: _Group, buffers: RowBuffers) -> _GroupColumns:
        relation, rows = group.relation, buffers.rows
        columns = {
            "ordinal": pa.array(np.frombuffer(buffers.ordinal, "<i8")),
            "op": pa.array(np.frombuffer(buffers.op, np.uint8).astype(np.int8)),
            "lsn": pa.array(np.frombuffer(buffers.lsn, "<i8")),
            **_relation_columns(relation, rows, group.attnums),
            **_images(relation, buffers),
        }
        names: tuple[str, ...] = ("truncate_cascade", "truncate_restart_identity")
        names += ("message_prefix", "message_content", "message_transactional")
        columns.update({n: pa.nulls(rows, ENVELOPE_ARROW_SCHEMA.field(n).type) for n in names})
        return cls(rows, columns)

    @classmethod
    def of_others(
        cls, others: list[tuple[int, int, int | None, _Described | None, tuple[object, ...]]]
    ) -> _GroupColumns:
        """Truncate and message rows: few; built from Python values."""
        rows = len(others)
        cells: dict[str, list[object]] = {
            n: [None] * rows
            for n in (
                "truncate_cascade",
                "truncate_restart_identity",
                "message_prefix",
                "message_content",
                "message_transactional",
            )
        }
        described: list[dict[str, pa.Array]] = []
        for i, (_, op, _, relation, extras) in enumerate(others):
            fields: tuple[str, ...] = ("truncate_cascade", "truncate_restart_identity")
            if op == _MESSAGE:
                fields = ("message_prefix", "message_content", "message_transactional")
            for name, value in zip(fields, extras, strict=True):
                cells[name][i] = value
            table, attnums = relation if relation is not None else (None, ())
            described.append(_relation_columns(table, 1, attnums))
        columns: dict[str, pa.Array] = {
            "ordinal": pa.array([o[0] for o in others], pa.int64()),
            "op": pa.array([o[1] for o in others], pa.int8()),
            "lsn": pa.array([o[2] for o in others], pa.int64()),
            **{n: pa.array(v, ENVELOPE_ARROW_SCHEMA.field(n).type) for n, v in cells.items()},
        }
        for name in ("schema", "table", "relation_oid", "replica_identity", "columns"):
            type_ = ENVELOPE_ARROW_SCHEMA.field(name).type
            columns[name] = pa.concat_arrays([pa.array([], type_), *(d[name] for d in described)])
        for name in ("key", "before", "after", "unchanged_toast"):
            columns[name] = pa.nulls(rows, ENVELOPE_ARROW_SCHEMA.field(name).type)
        return cls(rows, columns)


@dataclass(slots=True)
class _Cells:
    """One tuple side of a group's rows: which rows have it, kinds as a (rows, ncols)
    matrix, and the values flat (row-major), null where the kind sends none."""

    valid: np.ndarray
    kinds: np.ndarray
    values: pa.Array

    @classmethod
    def of(
        cls, valid: np.ndarray, kinds: bytes, offsets: bytes, values: bytes, ncols: int, table: str
    ) -> _Cells:
        matrix = np.frombuffer(kinds, np.uint8).reshape(len(valid), ncols)
        array = cell_values(matrix, offsets, values, table)
        return cls(valid, matrix[valid], array.filter(pa.array(np.repeat(valid, ncols))))

    def entries(self, mask: np.ndarray, names: pa.Array) -> tuple[pa.Array, ...]:
        """Offsets (per row; rows without the tuple null and empty), keys, values and the
        null mask of the entries `mask` (one row per valid tuple) selects."""
        counts = np.zeros(len(self.valid), np.int32)
        counts[self.valid] = mask.sum(axis=1)
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        flat = mask.ravel()
        keys = names.take(pa.array(np.nonzero(flat)[0] % len(names)))
        return (
            pa.array(offsets),
            keys,
            self.values.filter(pa.array(flat)),
            pa.array(~self.valid),
        )

    def map(self, mask: np.ndarray, names: pa.Array) -> pa.Array:
        offsets, keys, items, nulls = self.entries(mask, names)
        return pa.MapArray.from_arrays(offsets, keys, items, mask=nulls)


def _images(relation: Relation, b: RowBuffers) -> dict[str, pa.Array]:
    """``key``, ``before``, ``after`` and ``unchanged_toast`` of one group's rows."""
    ncols = len(relation.columns)
    table = f"{relation.schema}.{relation.relname}"
    names = pa.array([c.name for c in relation.columns], pa.string())
    is_key = np.array([c.is_key for c in relation.columns], bool)
    op = np.frombuffer(b.op, np.uint8)
    old_kind = np.frombuffer(b.old_kind, np.uint8)
    after = _Cells.of(op != OP_DELETE, b.new_kinds, b.new_offsets, b.new_values, ncols, table)
    before = _Cells.of(old_kind != 0, b.old_kinds, b.old_offsets, b.old_values, ncols, table)
    key_only = old_kind[before.valid] == ord("K")
    before_mask = (before.kinds != KIND_UNCHANGED) & (is_key[None, :] | ~key_only[:, None])
    offsets, toast, _, nulls = after.entries(after.kinds == KIND_UNCHANGED, names)
    images = {
        "before": before.map(before_mask, names),
        "after": after.map(after.kinds != KIND_UNCHANGED, names),
        "unchanged_toast": pa.ListArray.from_arrays(offsets, toast, mask=nulls),
    }
    # key: the old tuple's key columns when there is one, else the new row's
    if not is_key.any():
        images["key"] = pa.nulls(b.rows, ENVELOPE_ARROW_SCHEMA.field("key").type)
    else:
        source = before if before.valid.all() else after
        if before.valid.any() and not before.valid.all():
            source = _merge(before, after)
        images["key"] = source.map((source.kinds != KIND_UNCHANGED) & is_key[None, :], names)
    return images


def _merge(old: _Cells, new: _Cells) -> _Cells:
    """Per row the old tuple where there is one, else the new (every row has one of them)."""
    ncols = old.kinds.shape[1]
    rows = len(old.valid)
    old_at = np.cumsum(old.valid) - 1  # each row's index among the rows with an old tuple
    new_at = np.cumsum(new.valid) - 1
    kinds = np.where(
        old.valid[:, None],
        old.kinds[np.maximum(old_at, 0)] if len(old.kinds) else 0,
        new.kinds[np.maximum(new_at, 0)] if len(new.kinds) else 0,
    )
    cells = np.arange(ncols)
    take = np.where(
        old.valid[:, None],
        old_at[:, None] * ncols + cells,
        new_at[:, None] * ncols + cells + len(old.values),
    )
    values = pa.concat_arrays([old.values, new.values]).take(pa.array(take.ravel()))
    return _Cells(np.ones(rows, bool), kinds.astype(np.uint8), values)


def snapshot_reads(
    relation: Relation,
    attnums: tuple[int, ...],
    strings: list[pa.Array],
    point: int,
    first_ordinal: int,
) -> pa.RecordBatch:
    """Rows of an initial copy as envelope rows of op ``read`` (as a Debezium snapshot's):
    `strings` are the relation's columns as the server printed them (null: NULL), ``after``
    holds them, ``key`` the key columns'. They sort before every change the stream brings
    after the copy: at commit LSN `point` (the copy's consistent point) with ordinals
    counting down from `first_ordinal` (negative)."""
    rows = len(strings[0]) if strings else 0
    ncols = len(relation.columns)
    names = pa.array([c.name for c in relation.columns], pa.string())
    is_key = np.array([c.is_key for c in relation.columns], bool)
    if strings:  # row-major: row i's columns at i * ncols ...
        flat = pa.concat_arrays([s.cast(pa.string()) for s in strings])
        take = (np.arange(ncols)[None, :] * rows + np.arange(rows)[:, None]).ravel()
        values = flat.take(pa.array(take))
    else:
        values = pa.array([], pa.string())

    def text_map(mask: np.ndarray) -> pa.Array:
        counts = np.full(rows, int(mask.sum()), np.int32)
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        chosen = np.tile(mask, rows)
        keys = names.take(pa.array(np.nonzero(chosen)[0] % max(ncols, 1)))
        return pa.MapArray.from_arrays(pa.array(offsets), keys, values.filter(pa.array(chosen)))

    commit_lsn = pa.array(np.full(rows, point, np.int64))
    ordinals = pa.array(np.arange(first_ordinal, first_ordinal - rows, -1, dtype=np.int64))
    described = _relation_columns(relation, rows, attnums)
    columns: dict[str, pa.Array] = {
        "commit_lsn": commit_lsn,
        "ordinal": ordinals,
        "sequence": pa.StructArray.from_arrays([commit_lsn, ordinals], fields=list(SEQUENCE_TYPE)),
        "op": pa.array(np.full(rows, "read", object), pa.string()),
        **described,
        "key": text_map(is_key) if is_key.any() else None,
        "after": text_map(np.ones(ncols, bool)),
    }
    return pa.RecordBatch.from_arrays(
        [
            columns[f.name] if columns.get(f.name) is not None else pa.nulls(rows, f.type)
            for f in ENVELOPE_ARROW_SCHEMA
        ],
        schema=ENVELOPE_ARROW_SCHEMA,
    )
