"""What a column added to a source table holds in the rows that existed before it, read from
the source (the pipeline's `pgcdc.targets.added_columns.FillSource`).

* ``ADD COLUMN c … DEFAULT x`` with a non-volatile default stores x as the column's missing
  value (``pg_attribute.atthasmissing``, ``attmissingval``): every older row holds x. It stays
  until the table is rewritten, so the catalog read later still gives the value of the change's
  point.
* A column added without a default is NULL in every older row (later updates stream).
* A column with a default but no missing value was added with a volatile default (an identity
  column's next value, a domain's default checked by the domain's constraints), or the table
  was rewritten since: the values are in the rows only, so they are read from the table by key
  (the column as the walsender session prints it). Reading later than the change is safe for a
  mirror: a row changed since carries its value in its own change, applied after.
* A column that was not appended (renamed, or newly in the publication's column list) holds
  values of its own in the older rows: read by key, whatever its default.
* A column the catalog no longer has by that name (dropped, or renamed, since) is NULL.
* A column whose type changed since is read in its type of now, and says so
  (`ColumnFill.later_type`): the target knows whether it keeps values through that type change
  (a widening, or the same Arrow type: then each value its earlier type can hold is taken) or
  rewrites the column when the stream brings the change (then NULL until that change fills
  every row).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from psycopg import sql

from pgcdc.envelope import Shape
from pgcdc.errors import TargetError
from pgcdc.replication.slots import connect_sql
from pgcdc.targets.added_columns import FILL_VALUE, ColumnFill

__all__ = ["SourceFills"]

log = logging.getLogger(__name__)

_ATTRIBUTE = """
    SELECT a.atthasmissing, (a.attmissingval::text::text[])[1],
           a.atthasdef OR a.attidentity <> ''
               OR t.typdefaultbin IS NOT NULL OR t.typdefault IS NOT NULL,
           COALESCE(pg_partition_root(a.attrelid), a.attrelid)::regclass::text,
           a.atttypid::int, a.atttypmod
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attrelid = %s AND a.attname = %s AND NOT a.attisdropped AND a.attnum > 0"""


@dataclass(frozen=True, slots=True)
class SourceFills:
    """A `FillSource` that asks the source database (picklable: a task may call it)."""

    conninfo: str

    def __call__(self, shape: Shape, column: str, *, appended: bool = True) -> ColumnFill:
        with connect_sql(self.conninfo, pinned_settings=True) as conn:
            row = conn.execute(_ATTRIBUTE, (shape.relation_oid, column)).fetchone()
            if row is None:
                log.warning(
                    "%s.%s: the column is gone from the catalog (dropped or renamed since it "
                    "was added); its older rows hold NULL",
                    shape.name,
                    column,
                )
                return ColumnFill()
            # has_default: the column's own, an identity's or its type's (a domain's)
            has_missing, missing, has_default, table, type_oid, type_modifier = row
            column_info = next(c for c in shape.columns if c.name == column)
            now = (type_oid, type_modifier)
            later = None if now == (column_info.type_oid, column_info.type_modifier) else now
            if appended and has_missing:
                return ColumnFill(text=missing, later_type=later)
            if appended and not has_default:
                return ColumnFill()
            if later is not None and (not shape.key_names or shape.full_identity):
                return ColumnFill()  # the type change stops the table: nothing to read by
            if not shape.key_names or shape.full_identity:
                why = (
                    "added with a volatile default (or the table was rewritten since)"
                    if appended
                    else "renamed (or newly published)"
                )
                raise TargetError(
                    f"{shape.name}.{column}: {why}, so each older row has its own value, "
                    "which a table without a key cannot be matched by; recopy the table"
                )
            names = [*shape.key_names, column]
            query = sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(n)) for n in names),
                sql.SQL(table),  # regclass::text: quoted as needed
            )
            values = list(zip(*conn.execute(query).fetchall(), strict=True)) or [()] * len(names)
        columns = [*shape.key_names, FILL_VALUE]
        return ColumnFill(
            rows=pa.table(
                {n: pa.array(v, pa.string()) for n, v in zip(columns, values, strict=True)}
            ),
            later_type=later,
        )
