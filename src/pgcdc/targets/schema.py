"""The schema policy: what a target table's columns become for a batch (no I/O).

`plan_evolution` takes the table's current Arrow schema (None: no table yet), the relation's
columns as of the last batch (`recorded`), and the batch's changes (their relation shapes,
columns named as the target names them: `pgcdc.targets.naming`), and says:

* an added column is added, and the rows written before get the value the source has in them
  (its `added` entry: the shape that first has it, and whether it was appended — then its
  default or missing value — or not: renamed, newly published, its values read per key);
* a dropped column stays; rows written afterwards hold NULL in it;
* a type change to the same Arrow type changes nothing; a lossless widening (int16 → int32 →
  int64, float32 → float64, decimal(p,s) → decimal(p',s) with p' ≥ p, arrays of those) is
  `widened`: the table is rewritten with the wider type; a change back to a narrower type the
  column already holds keeps the wider column; a composite type's attributes added or dropped
  reshape its struct (a cast by name);
* any other type change (int to text, text to int with a USING expression, a scale change,
  timestamp to timestamptz, a composite's attribute renamed) is `retyped`: the column is
  rewritten with the source's values read per key, and the batch's images from before the
  change take them too. A key column's, or one in a table without a key, raises
  `SchemaChangeError` naming the table, column, both types and the LSN of the change.

A column whose source type did not change since the last batch but which the table holds in
another type is ahead of the batch: a crash came after the table was rewritten for a later type
change and before that batch's commit, and the batch is replayed in smaller pieces. Its values
in the batch are left null: the type change comes again with a later batch, and fills every
row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from pgcdc.envelope import ColumnInfo
from pgcdc.errors import SchemaChangeError, TargetError
from pgcdc.protocol import Lsn
from pgcdc.targets._arrow import canonical, column_of, reshaped, same, widens
from pgcdc.targets._typing import BatchTyping
from pgcdc.targets.added_columns import AddedColumn, added_columns
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT, Mode
from pgcdc.targets.fold import Change

__all__ = ["Evolution", "plan_evolution", "plan_reconcile"]

#: Raises when the table format cannot store a field (the source's table name, the field).
Storable = Callable[[str, pa.Field], None]


@dataclass(slots=True)
class Evolution:
    """The table schema a batch needs: `schema` (current columns first, new ones after);
    `widened`: existing columns whose type grows (the table is rewritten); `retyped`: columns
    whose type changed to one their values cannot be cast to, each with the first change of
    its last type change; `added`: the columns new to the relation in the batch; `prior`: the
    relation's columns as of the last batch (None: a new table)."""

    schema: pa.Schema
    widened: set[str]
    retyped: dict[str, Change]
    added: dict[str, AddedColumn]
    prior: list[str] | None


def _composite(t: pa.DataType) -> bool:
    """A composite type's struct, or a list of them."""
    return pa.types.is_struct(t) or (pa.types.is_list(t) and _composite(t.value_type))


def plan_evolution(
    current: pa.Schema | None,
    recorded: tuple[ColumnInfo, ...] | None,
    changes: list[Change],
    source: str,
    mode: Mode,
    typing: BatchTyping,
    storable: Storable,
) -> Evolution:
    """The schema `changes` need (see the module docstring); `typing` gives each shape's
    Arrow types, `storable` refuses a type the table format cannot hold."""
    # the first change of each run of one shape: a shape may come back (a type changed and
    # changed back), and each time counts
    steps = [c for i, c in enumerate(changes) if i == 0 or c.shape != changes[i - 1].shape]
    prior: list[str] | None = None
    prior_types: dict[str, tuple[int, int]] = {}
    if current is not None:
        if recorded is None:
            prior = [n for n in current.names if n not in (START_AT, END_AT)]
        else:
            prior = [c.name for c in recorded]
            prior_types = {c.name: (c.type_oid, c.type_modifier) for c in recorded if c.type_oid}
    added = added_columns(prior, [c.shape for c in steps])
    types: dict[str, pa.DataType] = {} if current is None else {f.name: f.type for f in current}
    source_types = dict(prior_types)
    widened: set[str] = set()
    new: set[str] = set()
    retyped: dict[str, Change] = {}
    for change in steps:
        shape = change.shape
        for f in typing.shape_fields(shape):
            if mode == "history" and f.name in (START_AT, END_AT):
                raise TargetError(f"{source}.{f.name}: the name of a history column")
            column = next((c for c in shape.columns if c.name == f.name), None)
            previous = source_type = None  # (pgcdc's own columns have none)
            if column is not None:
                source_type = (column.type_oid, column.type_modifier)
                previous = source_types.get(f.name)
                source_types[f.name] = source_type
            old = types.get(f.name)
            if old is None:
                storable(source, f)
                types[f.name] = f.type
                new.add(f.name)
                continue
            if (
                previous is not None
                and previous != source_type
                and not typing.follows(previous, f.type)
            ):
                pass  # the source changed the type, its values cannot be cast: retyped
            elif reshaped(old, f.type):  # a composite's attributes added or dropped
                types[f.name] = f.type
                if f.name not in new:
                    widened.add(f.name)
                continue
            elif same(old, f.type) or widens(f.type, old):
                continue
            elif widens(old, f.type):
                storable(source, f)
                types[f.name] = f.type
                if f.name not in new:
                    widened.add(f.name)
                continue
            elif previous is not None and not (previous == source_type and _composite(f.type)):
                continue  # the table is ahead of the batch (see the module docstring)
            # else a composite type described anew (an attribute renamed, or added and
            # dropped): retyped, its values read again
            if f.name in added or typing.retypable(shape, f.name):
                storable(source, f)
                types[f.name] = f.type
                retyped[f.name] = change
            else:
                codec = typing.registry.get(column_of(shape, f.name).type_oid)
                raise SchemaChangeError(
                    table=source,
                    column=f.name,
                    old_type=str(canonical(old)),
                    new_type=f"{canonical(f.type)} ({codec.name})",
                    lsn=Lsn(change.lsn if change.lsn is not None else change.seq[0]),
                )
    fields = [pa.field(name, t) for name, t in types.items()]
    if current is None and mode == "history":
        fields += [pa.field(START_AT, SEQUENCE_TYPE), pa.field(END_AT, SEQUENCE_TYPE)]
    return Evolution(pa.schema(fields), widened - set(retyped), retyped, added, prior)


def plan_reconcile(current: pa.Schema, copied: pa.Schema) -> tuple[pa.Schema, set[str]]:
    """The schema a target takes to be reconciled with a copy of its table (`copied`: the
    copy's columns, as the source has them now): its columns, each in the copy's type where
    the source changed it while the table could not be streamed (widened, a composite
    reshaped, or retyped), then the copy's columns new to it; and the columns whose type
    changes (the table is rewritten with them first). A column the target holds wider than
    the copy stays as it is."""
    fields, changed = [], set()
    for f in current:
        new = copied.field(f.name).type if f.name in copied.names else f.type
        if same(f.type, new) or widens(new, f.type):
            fields.append(f)
        else:
            fields.append(pa.field(f.name, new))
            changed.add(f.name)
    fields += [f for f in copied if f.name not in current.names]
    return pa.schema(fields), changed
