"""Which target column each column of a batch is: columns followed by what they are, not by
their names. No I/O.

A relation's columns are identified by attnum (`pgcdc.envelope.ColumnInfo.identity`; the name
when the attnum is not known). Across a batch and the target's last recorded shape, a column
may have been renamed (the same attnum, another name), two names swapped, a column dropped and
another one added under its name, or a column dropped and its name given to another one by a
rename. `plan_naming` says what the target does first and how the batch's rows are named:

* the target's columns are renamed to the names their columns have at the end of the batch
  (a rename keeps the values, exactly as the source did);
* a target column whose name another column takes, and which is no longer in the relation
  (dropped: ``DROP c; ADD c``, ``DROP a; RENAME b TO a``), is removed: its values are not the
  new column's (which get their values as an added column does);
* the batch's rows name each column by its name at the end of the batch; the values of a
  column dropped within the batch whose name another column takes are left out.

A dropped column whose name nobody takes stays in the target (NULL in the rows written after).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pgcdc.envelope import ColumnInfo, Shape

__all__ = ["Naming", "plan_naming"]


@dataclass(frozen=True, slots=True)
class Naming:
    """What `plan_naming` found (see the module docstring)."""

    #: Target column renames, old name -> new name (done together: swaps are fine).
    renames: dict[str, str]
    #: Target columns to remove.
    removed: frozenset[str]
    #: Per batch shape: its column names -> the names its rows use (None: left out).
    names: dict[Shape, dict[str, str | None]]
    #: The target's recorded columns once renamed (and without the removed ones).
    recorded: tuple[ColumnInfo, ...] | None

    @property
    def changes_target(self) -> bool:
        return bool(self.renames or self.removed)

    def shape(self, shape: Shape) -> Shape:
        """`shape` with its columns named as the batch's rows name them."""
        names = self.names.get(shape)
        if names is None or all(names[c.name] == c.name for c in shape.columns):
            return shape
        columns = tuple(
            replace(c, name=new) for c in shape.columns if (new := names[c.name]) is not None
        )
        return replace(shape, columns=columns)


def plan_naming(
    recorded: Sequence[ColumnInfo] | None,
    existing: Sequence[str],
    shapes: Sequence[Shape],
) -> Naming:
    """`recorded`: the relation's columns as of the target's last batch (None: not known, as
    for a new table); `existing`: the target's data columns; `shapes`: the batch's relation
    shapes in sequence order."""
    final: dict[int | str, str] = {}  # identity -> its name at the end of the batch
    for shape in shapes:
        for column in shape.columns:
            final[column.identity] = column.name
    live = {c.identity for c in shapes[-1].columns} if shapes else set()
    # the identity that holds each name at the end: a live column first
    holder: dict[str, int | str] = {}
    for identity, name in final.items():
        if identity in live or name not in holder:
            holder[name] = identity
    names: dict[Shape, dict[str, str | None]] = {}
    for shape in shapes:
        names[shape] = {
            c.name: (final[c.identity] if holder[final[c.identity]] == c.identity else None)
            for c in shape.columns
        }
    if recorded is None:
        return Naming({}, frozenset(), names, None)
    renames: dict[str, str] = {}
    removed: set[str] = set()
    kept: list[ColumnInfo] = []
    for column in recorded:
        identity = column.identity
        if column.name not in existing:  # not in the table (an old table's first batch)
            continue
        name = final.get(identity, column.name)
        if holder.get(name, identity) != identity:
            removed.add(column.name)  # another column has its name now
            continue
        if name != column.name:
            renames[column.name] = name
        kept.append(replace(column, name=name))
    known = {c.name for c in recorded}
    for name in existing:  # columns dropped before the last batch, kept in the table
        if name not in known and name in holder:
            removed.add(name)  # its name is another column's now
    return Naming(renames, frozenset(removed), names, tuple(kept))
