"""Columns added to a source table, and the value they have in the rows that existed before.

``ALTER TABLE … ADD COLUMN c … DEFAULT x`` rewrites nothing and sends no change: the rows
that existed hold x from then on (the catalog's missing value, ``pg_attribute.attmissingval``),
and a volatile default rewrites the table, again without a change. A target learns of the
column from the next change's relation (its Relation message) and must give every older row
the value the source has, or it is no longer equal to its source.

A column also appears under a new name when it is renamed (``RENAME COLUMN``), or when a
publication's column list grows; then the older rows hold values of their own. The stream
cannot tell these from an added column by the name alone, but by the place: ``ADD COLUMN``
appends after every column the table had, while a renamed column keeps its place and its old
name is gone. An `AddedColumn` that is not `appended` must be read from the source per key.

`added_columns` finds, in a batch, the columns that appear after a relation shape that lacked
them (the previous batch's last shape, recorded with the target, or an earlier shape of the
batch); `ColumnFill` is what a `FillSource` (the pipeline's, reading the source's catalog)
says their value is; `fill_values` types it for rows of the target.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from pgcdc.envelope import Shape
from pgcdc.types.arrow import ArrowBatchBuilder

__all__ = [
    "FILL_VALUE",
    "AddedColumn",
    "ColumnFill",
    "FillSource",
    "added_columns",
    "fill_array",
    "fill_texts",
    "fill_values",
]

#: The name of the value column in `ColumnFill.rows`.
FILL_VALUE = "value"
_FOUND, _ROW = "__pgcdc_fill", "__pgcdc_row"


@dataclass(frozen=True, slots=True)
class ColumnFill:
    """The value an added column has in the rows that existed before it was added.

    Either `text`, one value for every such row (the server's text; None: NULL), or `rows`:
    per row, the table's key columns and the column (named `FILL_VALUE`), as the server's
    text, read from the source table (a volatile default, or a table rewritten since).

    `later_type`: the source type (OID, modifier) the values are in, when the column no
    longer has the type of the shape that added it (changed since; None: the same). Typed
    as the shape's column, a value that type cannot hold is then null: its row has changed
    since, and its change comes later in the stream."""

    text: str | None = None
    rows: pa.Table | None = None
    later_type: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class AddedColumn:
    """A column that appeared: the first shape that has it, and whether it came after every
    column of the shape before (``ADD COLUMN``; else renamed, or newly published, and the
    older rows hold values of their own)."""

    shape: Shape
    appended: bool


class FillSource(Protocol):
    """Given the shape that has the column, the column's name and whether it was appended,
    its value in the rows that existed before."""

    def __call__(self, shape: Shape, column: str, *, appended: bool) -> ColumnFill: ...


def added_columns(prior: Sequence[str] | None, shapes: Sequence[Shape]) -> dict[str, AddedColumn]:
    """The columns of `shapes` (a batch's relation shapes, in sequence order) that a shape
    before them lacked: `prior` (the target's last shape, its columns in order; None for a
    new table), then each shape of the batch. Maps each to the first shape that has it."""
    added: dict[str, AddedColumn] = {}
    previous = None if prior is None else list(prior)
    for shape in shapes:
        names = [c.name for c in shape.columns]
        if previous is not None:
            # ADD COLUMN keeps every column and appends: the old ones are a prefix
            appended = names[: len(previous)] == previous
            for name in names:
                if name not in previous and name not in added:
                    added[name] = AddedColumn(shape, appended)
        previous = names
    return added


def fill_texts(
    fill: ColumnFill, key_names: Sequence[str], keys: Iterable[dict[str, str | None]]
) -> list[str | None]:
    """The fill as text for rows given by their key values (text, by column name)."""
    if fill.rows is None:
        return [fill.text for _ in keys]
    columns = [fill.rows.column(n).to_pylist() for n in (*key_names, FILL_VALUE)]
    by_key = {tuple(row[:-1]): row[-1] for row in zip(*columns, strict=True)}
    return [by_key.get(tuple(k.get(n) for n in key_names)) for k in keys]


def fill_values(
    builder: ArrowBatchBuilder,
    column: str,
    fill: ColumnFill,
    keys: pa.Table,
    key_builder: ArrowBatchBuilder | None = None,
) -> pa.Array:
    """The fill typed as `column` of `builder`'s relation, for the rows whose typed key
    columns are `keys` (one value per row of `keys`; null where the source has no row). The
    key values read are typed as `key_builder`'s relation has its key columns (the relation
    as the values were read: a key widened since holds values the older type cannot)."""
    position = {c.name: i for i, c in enumerate(builder.relation.columns)}
    field = builder.schema.field(position[column])
    if fill.rows is None:
        text = None if fill.text is None else fill.text.encode()
        value = fill_array(builder, position[column], [text], fill)
        return pa.repeat(value[0], keys.num_rows).cast(field.type)

    by_key = builder if key_builder is None else key_builder
    key_position = {c.name: i for i, c in enumerate(by_key.relation.columns)}

    def typed(name: str, source: str) -> pa.Array:
        assert fill.rows is not None
        texts = [None if v is None else v.encode() for v in fill.rows.column(source).to_pylist()]
        if source == FILL_VALUE:
            return fill_array(builder, position[name], texts, fill)
        key = by_key.column_from_text(key_position[name], texts)[0]
        return key.cast(keys.column(name).type)

    names = keys.column_names
    values = typed(column, FILL_VALUE)
    # joined by key to the value's place (a join carries no nested type: the value is taken)
    places = pa.array(range(len(values)), pa.int64())
    found = pa.table({**{n: typed(n, n) for n in names}, _FOUND: places})
    order = pa.array(range(keys.num_rows), pa.int64())  # (typed: a table may have no rows)
    rows = pa.table({**{n: keys.column(n) for n in names}, _ROW: order})
    joined = rows.join(found, names, join_type="left outer").sort_by(_ROW)
    return values.take(joined.column(_FOUND)).cast(field.type)


def fill_array(
    builder: ArrowBatchBuilder, i: int, texts: list[bytes | None], fill: ColumnFill
) -> pa.Array:
    """`fill`'s values (the server's text, for some rows) typed as column `i` of `builder`'s
    relation; read in a later type (`ColumnFill.later_type`), a value the column's type
    cannot hold is null."""
    if fill.later_type is None:
        return builder.column_from_text(i, texts)[0]
    try:
        return builder.column_from_text(i, texts)[0]
    except Exception:  # some value does not parse or fit: each on its own
        cells = []
        for text in texts:
            try:
                cells.append(builder.column_from_text(i, [text])[0])
            except Exception:
                cells.append(pa.nulls(1, builder.schema.field(i).type))
        return pa.concat_arrays(cells) if cells else builder.column_from_text(i, [])[0]
