"""A batch's images typed for a target: per relation shape, the server's text to Arrow through
the type registry, with the values of columns added or retyped in the batch (fills) put into
the images made before them. One `BatchTyping` per batch: the registry may learn types between
batches, and a failed batch must leave nothing behind."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.envelope import Shape
from pgcdc.errors import TargetError, ValueOutOfRange
from pgcdc.protocol import Column, Lsn, Relation
from pgcdc.targets._arrow import ACTION, fit, same, same_type, seq, widens, with_column
from pgcdc.targets.added_columns import AddedColumn, ColumnFill, FillSource, fill_array, fill_texts
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT, Mode
from pgcdc.targets.bulk import BulkHistory, BulkMirror
from pgcdc.targets.fold import (
    Change,
    HistoryPlan,
    Image,
    MirrorPlan,
    MultisetPlan,
    Seq,
    fold_history,
    fold_mirror,
    fold_multiset,
)
from pgcdc.types.arrow import UNCHANGED_TOAST_COLUMN, ArrowBatchBuilder
from pgcdc.types.columns import TextColumns
from pgcdc.types.mapping import MappingOptions, arrow_type
from pgcdc.types.registry import TypeRegistry

__all__ = ["BatchTyping", "Plan", "bulk_history_rows", "bulk_mirror_rows"]

Plan = MirrorPlan | HistoryPlan | MultisetPlan


@dataclass(slots=True)
class BatchTyping:
    """How one batch's rows are typed for a target of `mode`."""

    registry: TypeRegistry
    options: MappingOptions
    mode: Mode
    #: The value of columns added to the source for the rows before (None: NULL).
    fills: FillSource | None = None
    typers: dict[Shape, TextColumns] = field(default_factory=dict)
    #: The added (and retyped) columns' fills, and the shape that has each.
    batch_fills: dict[str, tuple[ColumnFill, Shape]] = field(default_factory=dict)
    #: The columns whose type changed beyond a widening, and the sequence of the first change
    #: of their last type change.
    retyped: dict[str, Seq] = field(default_factory=dict)
    #: The batch's last relation shape (the key's type as values are read now).
    latest: Shape | None = None

    def columns(self, shape: Shape) -> TextColumns:
        """How `shape`'s values (the server's text) are typed, a column at a time."""
        typer = self.typers.get(shape)
        if typer is None:
            typer = self.typers[shape] = _text_columns(shape, self.registry, self.options)
        return typer

    def builder(self, shape: Shape) -> ArrowBatchBuilder:
        return self.columns(shape).builder

    def shape_fields(self, shape: Shape) -> list[pa.Field]:
        schema = self.builder(shape).schema
        return [f for f in schema if f.name != UNCHANGED_TOAST_COLUMN]

    def shape_type(self, shape: Shape, column: str) -> pa.DataType:
        builder = self.builder(shape)
        names = [c.name for c in builder.relation.columns]
        return builder.schema.field(names.index(column)).type

    def follows(self, previous: tuple[int, int], new: pa.DataType) -> bool:
        """Whether values of source type `previous` (OID, modifier) cast to `new` (the same
        Arrow type, or one widens the other)."""
        try:
            old = arrow_type(*previous, self.registry, self.options)
        except Exception:  # a type the registry no longer knows
            return False
        return same(old, new) or widens(old, new) or widens(new, old)

    def retypable(self, shape: Shape, column: str) -> bool:
        """Whether a column of `shape` whose type changed beyond a widening can take the
        source's values again, read per key (`FillSource`): not a key column, and the table
        has a key that is not the whole row."""
        return (
            self.fills is not None
            and bool(shape.key_names)
            and not shape.full_identity
            and column not in shape.key_names
        )

    def stale(self, image: Image, column: str) -> bool:
        """Whether `image` was made before the last type change of `column` in this batch
        (its value is then the fill, the source's, as the table's rows are: the server
        rewrote the row without a change)."""
        since = self.retyped.get(column)
        return since is not None and image.seq is not None and image.seq < since

    # --- fills ---------------------------------------------------------------------------

    def resolve_fills(
        self,
        prior: list[str] | None,
        added: dict[str, AddedColumn],
        retyped: dict[str, Change],
    ) -> dict[str, tuple[ColumnFill, Shape]]:
        """Ask for the fills of the batch's added columns (kept for typing the batch's older
        images) and the values of its retyped columns that were not added (read per key);
        the ones the target's rows (`prior`: its columns, None for no table) need now."""
        for column, found in added.items():
            fill = self.fill_of(found.shape, column, appended=found.appended)
            self.batch_fills[column] = (fill, found.shape)
        for column, change in retyped.items():
            shape = change.shape
            appeared = added.get(column)
            if appeared is not None and same_type(appeared.shape, shape, column):
                continue  # added (again) in this batch, in the type it ends with: its fill
            if self.fills is None or not self.retypable(shape, column):
                raise TargetError(
                    f"{shape.name}.{column}: its type changed within the batch, after it was "
                    "added, and its values cannot be read again by key (a key column, or a "
                    "table without a key); recopy the table"
                )
            self.batch_fills[column] = (self.fill_of(shape, column, appended=False), shape)
        self.retyped = {column: change.seq for column, change in retyped.items()}
        if prior is None:
            return {}
        return {c: f for c, f in self.batch_fills.items() if c not in prior or c in retyped}

    def fill_of(self, shape: Shape, column: str, *, appended: bool) -> ColumnFill:
        """`column`'s fill for the rows before `shape`. Values read in a type the source
        changed the column to since: kept (those `shape`'s type can hold) when the target
        keeps values through that change, else NULL (the change rewrites the column with
        the source's values when the stream brings it)."""
        if self.fills is None:
            return ColumnFill()
        fill = self.fills(shape, column, appended=appended)
        later = fill.later_type
        if later is not None and not self.follows(later, self.shape_type(shape, column)):
            return ColumnFill()
        return fill

    # --- typing ---------------------------------------------------------------------------

    def type_images(self, images: Sequence[Image], schema: pa.Schema) -> pa.Table:
        """Images (text) as typed rows of `schema`, in order; missing values null. The
        images of each shape are typed a column at a time (`TextColumns`)."""
        groups: dict[Shape, list[int]] = {}
        for i, image in enumerate(images):
            groups.setdefault(image.shape, []).append(i)
        parts: list[pa.Table] = [schema.empty_table()]
        order: list[int] = []
        for shape, positions in groups.items():
            group = [images[i] for i in positions]
            typer = self.columns(shape)
            texts = {
                name: pa.array(
                    [None if name in im.missing else im.values.get(name) for im in group],
                    pa.string(),
                )
                for name in typer.names
            }
            lsns = pa.array([im.lsn for im in group], pa.int64())
            part = fit(_typed(typer, texts, len(group), lsns), schema)
            parts.append(self.fill_older(part, shape, group))
            order.extend(positions)
        data = pa.concat_tables(parts)
        if order != sorted(order):
            inverse = [0] * len(order)
            for at, i in enumerate(order):
                inverse[i] = at
            data = data.take(pa.array(inverse, pa.int64()))
        return data

    def fold(self, run: list[Change]) -> Plan:
        shape = next((c.shape for c in run if c.op != "truncate"), run[0].shape)
        if shape.full_identity:
            return fold_multiset(run)
        return fold_mirror(run) if self.mode == "mirror" else fold_history(run)

    def type_plan(self, plan: Plan, schema: pa.Schema) -> pa.Table:
        """The plan's merge source without the unchanged TOAST values still to be read (for
        a multiset: the versions, then the key image of each key with removals)."""
        data = pa.schema([f for f in schema if f.name not in (START_AT, END_AT)])
        if isinstance(plan, MultisetPlan):
            images = [v.image for v in plan.versions] + [plan.images[k] for k in plan.removals]
            typed = self.type_images(images, data)
            starts: list[dict[str, int] | None] = [seq(v.start) for v in plan.versions]
            starts += [None] * len(plan.removals)
            ends = [seq(v.end) for v in plan.versions] + [None] * len(plan.removals)
            typed = typed.append_column(START_AT, pa.array(starts, SEQUENCE_TYPE))
            return typed.append_column(END_AT, pa.array(ends, SEQUENCE_TYPE))
        if isinstance(plan, MirrorPlan):
            images = [*plan.upserts.values(), *plan.deletes.values()]
            actions = ["upsert"] * len(plan.upserts) + ["delete"] * len(plan.deletes)
            typed = self.type_images(images, data)
            return typed.append_column(ACTION, pa.array(actions, pa.string()))
        closes = list(plan.closes.values())
        images = [image for _, image in closes] + [v.image for v in plan.versions]
        typed = self.type_images(images, data)
        starts = [None] * len(closes)
        starts += [seq(v.start) for v in plan.versions]
        ends = [seq(s) for s, _ in closes] + [seq(v.end) for v in plan.versions]
        actions = ["close"] * len(closes) + ["insert"] * len(plan.versions)
        typed = typed.append_column(START_AT, pa.array(starts, SEQUENCE_TYPE))
        typed = typed.append_column(END_AT, pa.array(ends, SEQUENCE_TYPE))
        return typed.append_column(ACTION, pa.array(actions, pa.string()))

    def fill_older(self, part: pa.Table, shape: Shape, images: list[Image]) -> pa.Table:
        """Typed rows of `shape` with the columns added after it holding their fill, and
        the images made before a column's type change holding its fill in that column."""
        names = {c.name for c in shape.columns}
        for column, (fill, owner) in self.batch_fills.items():
            if column not in part.column_names:
                continue
            if column in names:
                stale = [self.stale(image, column) for image in images]
                if not any(stale):
                    continue
            texts = fill_texts(fill, owner.key_names, [image.values for image in images])
            builder = self.builder(owner)
            index = [c.name for c in owner.columns].index(column)
            encoded = [None if t is None else t.encode() for t in texts]
            values = fill_array(builder, index, encoded, fill)
            if column in names:
                current = part.column(column)
                values = pc.if_else(pa.array(stale), values.cast(current.type), current)
            part = with_column(part, column, values)
        return part


@functools.lru_cache(maxsize=512)
def _text_columns(shape: Shape, registry: TypeRegistry, options: MappingOptions) -> TextColumns:
    """`TextColumns` of a shape: the same for every batch with that shape and registry (a
    registry is one object per set of type descriptions), so made once per process."""
    columns = tuple(
        Column(1 if c.key else 0, c.name, c.type_oid, c.type_modifier) for c in shape.columns
    )
    relation = Relation(
        shape.relation_oid, shape.schema, shape.table, shape.replica_identity, columns
    )
    return TextColumns(relation, registry, options, shape.name)


# --- batches folded in Arrow (`pgcdc.targets.bulk`) ------------------------------------


def _typed(columns: TextColumns, texts: dict[str, pa.Array], rows: int, lsns: pa.Array) -> pa.Table:
    """Rows given as text, typed; a value out of range names its change's LSN."""
    try:
        batch = columns.batch([texts[n] for n in columns.names], rows)
    except ValueOutOfRange as exc:
        if exc.row is None:
            raise
        raise exc.located(lsn=Lsn(lsns[exc.row].as_py() or 0)) from None
    return pa.Table.from_batches([batch])


def _typed_keys(columns: TextColumns, texts: dict[str, pa.Array]) -> pa.Table:
    return pa.table(
        {n: columns.column(i, texts[n])[0] for i, n in enumerate(columns.names) if n in texts}
    )


def bulk_mirror_rows(columns: TextColumns, bulk: BulkMirror, schema: pa.Schema) -> pa.Table:
    """The upserts, then the keys to delete, with their action."""
    assert bulk.upsert_lsns is not None
    upserts = _typed(columns, bulk.upserts, bulk.upsert_rows, bulk.upsert_lsns)
    deletes = _typed_keys(columns, bulk.deletes)
    return pa.concat_tables(
        [
            fit(upserts, schema).append_column(ACTION, pa.repeat("upsert", bulk.upsert_rows)),
            fit(deletes, schema).append_column(ACTION, pa.repeat("delete", bulk.delete_rows)),
        ]
    )


def bulk_history_rows(columns: TextColumns, bulk: BulkHistory, schema: pa.Schema) -> pa.Table:
    """The keys whose target version ends, then the versions, as `type_plan` lays out a
    `HistoryPlan`'s."""
    data = pa.schema([f for f in schema if f.name not in (START_AT, END_AT)])
    versions = _typed(columns, bulk.versions, bulk.version_rows, bulk.version_lsns)
    closes = _typed_keys(columns, bulk.closes)
    parts = []
    for part, starts, ends, action in (
        (closes, pa.nulls(len(bulk.close_ends), SEQUENCE_TYPE), bulk.close_ends, "close"),
        (versions, bulk.starts, bulk.ends, "insert"),
    ):
        typed = fit(part, data).append_column(START_AT, starts).append_column(END_AT, ends)
        parts.append(typed.append_column(ACTION, pa.repeat(action, len(starts))))
    return pa.concat_tables(parts)
