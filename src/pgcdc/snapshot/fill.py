"""What a column added to a source table holds in the rows that existed before it, read from
the source (the pipeline's `pgcdc.targets.added_columns.FillSource`).

* ``ADD COLUMN c … DEFAULT x`` with a non-volatile default stores x as the column's missing
  value (``pg_attribute.atthasmissing``, ``attmissingval``): every older row holds x. It stays
  until the table is rewritten, so the catalog read later still gives the value of the change's
  point.
* A column with no missing value was added without a default (every older row NULL), with a
  volatile default (an identity column's next value, a domain's default checked by the
  domain's constraints), or with a constant one that the table's rewrite since (``CLUSTER``,
  ``VACUUM FULL``, a type change) moved into the rows, perhaps with the default dropped
  afterwards: the catalog cannot tell these apart, the rows can. When no row holds a value the
  older rows are NULL; otherwise the values are read from the table by key, exactly as the
  walsender session prints them (a ``COPY`` in text form: the type's output function, so
  ``char(n)`` keeps its padding). Reading later than the change is safe for a mirror: a row
  changed since carries its value in its own change, applied after.
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
from typing import Any

import pyarrow as pa
from psycopg import sql

from pgcdc.envelope import Shape
from pgcdc.errors import TargetError
from pgcdc.replication.sql_session import SqlSession
from pgcdc.snapshot.copy import copy_texts
from pgcdc.targets.added_columns import FILL_VALUE, ColumnFill

__all__ = ["SourceFills"]

log = logging.getLogger(__name__)

#: The column (by the partitioned table's attnum, or by name when that is not known) as the
#: relation (a table, or the partition the change came from) has it now.
_ATTRIBUTE = """
    SELECT a.atthasmissing, (a.attmissingval::text::text[])[1],
           a.atthasdef OR a.attidentity <> ''
               OR t.typdefaultbin IS NOT NULL OR t.typdefault IS NOT NULL,
           COALESCE(pg_partition_root(a.attrelid), a.attrelid)::regclass::text,
           a.atttypid::int, a.atttypmod
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attrelid = %(relation)s AND NOT a.attisdropped AND a.attnum > 0
      AND a.attname = CASE WHEN %(attnum)s = 0 THEN %(name)s ELSE (
          SELECT r.attname FROM pg_attribute r
          WHERE r.attrelid = COALESCE(pg_partition_root(%(relation)s), %(relation)s)
            AND r.attnum = %(attnum)s AND NOT r.attisdropped) END"""
#: The names of the partitioned table's (a table's own) columns now, by attnum.
_NAMES = """
    SELECT attnum::int, attname::text FROM pg_attribute
    WHERE attrelid = COALESCE(pg_partition_root(%s), %s) AND attnum = ANY(%s)
      AND NOT attisdropped"""


@dataclass(frozen=True, slots=True)
class SourceFills:
    """A `FillSource` that asks the source database (picklable: a task may call it)."""

    conninfo: str

    def __call__(self, shape: Shape, column: str, *, appended: bool = True) -> ColumnFill:
        with SqlSession(self.conninfo, pinned_settings=True) as session:
            return session.run(lambda conn: self._fill(conn, shape, column, appended))

    def _fill(self, conn: Any, shape: Shape, column: str, appended: bool) -> ColumnFill:
        column_info = next(c for c in shape.columns if c.name == column)
        parameters = {"relation": shape.relation_oid, "attnum": column_info.attnum, "name": column}
        row = conn.execute(_ATTRIBUTE, parameters).fetchone()
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
        now = (type_oid, type_modifier)
        later = None if now == (column_info.type_oid, column_info.type_modifier) else now
        if appended and has_missing:
            return ColumnFill(text=missing, later_type=later)
        source = sql.SQL(table)  # regclass::text: quoted as needed
        if (
            appended
            and not has_default
            and not _any_value(conn, source, _names_now(conn, shape, [column])[0])
        ):
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
        names = _names_now(conn, shape, [*shape.key_names, column])
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in names), source
        )
        parts = list(copy_texts(conn, query, len(names)))
        columns = [
            pa.concat_arrays([p[1][i] for p in parts]) if parts else pa.array([], pa.string())
            for i in range(len(names))
        ]
        return ColumnFill(
            rows=pa.table(dict(zip([*shape.key_names, FILL_VALUE], columns, strict=True))),
            later_type=later,
        )


def _names_now(conn: Any, shape: Shape, columns: list[str]) -> list[str]:
    """The names `shape`'s columns have in the source now (renamed since: a key column's
    values are read under its name of now)."""
    info = {c.name: c for c in shape.columns}
    attnums = [info[n].attnum for n in columns if info[n].attnum]
    oid = shape.relation_oid
    now = dict(conn.execute(_NAMES, (oid, oid, attnums)).fetchall()) if attnums else {}
    return [now.get(info[n].attnum, n) if info[n].attnum else n for n in columns]


def _any_value(conn: Any, table: sql.Composable, column: str) -> bool:
    """Whether some row of `table` holds a value (not NULL) in `column`."""
    query = sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE {} IS NOT NULL)").format(
        table, sql.Identifier(column)
    )
    row = conn.execute(query).fetchone()
    return bool(row and row[0])
