"""A relation as one change saw it: what typing and key matching need.

The envelope carries it per row (``schema``, ``table``, ``relation_oid``, ``replica_identity``,
``columns``); a Relation message gives it (`Shape.of`). A table's shape changes with its
DDL, so the changes of one table in one batch may have several.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pgcdc.protocol import Relation

__all__ = ["ColumnInfo", "Shape"]


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_oid: int
    type_modifier: int
    key: bool
    #: What the column is: its attnum (the partitioned table's, for a partition's column);
    #: 0 when not known (then its name is all there is).
    attnum: int = 0

    @property
    def identity(self) -> int | str:
        """The column's identity across renames: its attnum, else its name."""
        return self.attnum or self.name


@dataclass(frozen=True, slots=True)
class Shape:
    """The relation as one change saw it."""

    schema: str
    table: str
    relation_oid: int
    replica_identity: str
    columns: tuple[ColumnInfo, ...]
    key_names: tuple[str, ...] = field(init=False, compare=False)
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_names", tuple(c.name for c in self.columns if c.key))
        # Shapes key every per-row dict; hashing the column tuple each time would dominate.
        fields = (self.schema, self.table, self.relation_oid, self.replica_identity)
        object.__setattr__(self, "_hash", hash((*fields, self.columns)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, relation: Relation, attnums: tuple[int, ...] = ()) -> Shape:
        numbers = attnums or (0,) * len(relation.columns)
        columns = tuple(
            ColumnInfo(c.name, c.type_oid, c.type_modifier, c.is_key, n)
            for c, n in zip(relation.columns, numbers, strict=True)
        )
        return cls(
            relation.schema, relation.relname, relation.relid, relation.replica_identity, columns
        )

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def full_identity(self) -> bool:
        """REPLICA IDENTITY FULL: every column is the key, NULLs included."""
        return self.replica_identity == "f"
