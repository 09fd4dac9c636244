"""Row-by-row comparison of a source table with its targets: the demo's verdict and the tests'.

The source is read in one snapshot as the walsender would print it (a ``COPY`` in text form
under the same pinned session settings: each value its type's output) and typed through the
same type mapping as the targets, so a
difference is a difference of data, never of formatting. Rows compare as multisets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from psycopg import sql

from pgcdc.replication.slots import connect_sql
from pgcdc.snapshot.copy import copy_schema, read_copy
from pgcdc.snapshot.relation import catalog_relation

__all__ = ["Verdict", "compare_history", "compare_mirror", "source_rows"]


@dataclass(frozen=True, slots=True)
class Verdict:
    table: str
    source_rows: int
    target_rows: int
    #: Rows of the source the target lacks, and rows of the target the source lacks (a few).
    missing: list[dict[str, Any]]
    extra: list[dict[str, Any]]

    @property
    def equal(self) -> bool:
        return not self.missing and not self.extra and self.source_rows == self.target_rows

    def __str__(self) -> str:
        if self.equal:
            return f"{self.table}: identical ({self.source_rows} rows)"
        return (
            f"{self.table}: DIFFERENT (source {self.source_rows} rows, target "
            f"{self.target_rows}; {len(self.missing)} missing, {len(self.extra)} extra)"
        )


def source_rows(
    conninfo: str,
    table: str,
    where: sql.Composable | None = None,
    publications: Sequence[str] = (),
) -> pa.Table:
    """The table's current rows (those `where` selects: a condition), typed like the
    targets' columns: the columns `publications` publish (else all but generated ones)."""
    described = catalog_relation(conninfo, table, publications)
    relation, registry = described.relation, described.types.registry()
    names = [c.name for c in relation.columns]
    select = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    source = sql.Identifier(relation.namespace, relation.relname)
    query = sql.SQL("SELECT {} FROM {}").format(select, source)
    if where is not None:
        query += sql.SQL(" WHERE ") + where
    copy = sql.SQL("COPY ({}) TO STDOUT").format(query)
    with connect_sql(conninfo, pinned_settings=True) as conn, conn.transaction():
        batches = list(read_copy(conn, copy, relation, registry))
    return pa.Table.from_batches(batches, schema=copy_schema(relation, registry)).select(names)


def _keyed(table: pa.Table, names: list[str]) -> Counter[str]:
    return Counter(repr(tuple(row[n] for n in names)) for row in table.to_pylist())


def _compare(table: str, source: pa.Table, target: pa.Table | None) -> Verdict:
    if target is None:  # never created: nothing was ever applied
        target = source.schema.empty_table()
    names = source.column_names
    missing_cols = [n for n in names if n not in target.column_names]
    if missing_cols:
        return Verdict(table, source.num_rows, target.num_rows, [{"columns": missing_cols}], [])
    target = target.select(names)
    want, got = _keyed(source, names), _keyed(target, names)
    missing = list((want - got).elements())[:5]
    extra = list((got - want).elements())[:5]
    return Verdict(
        table,
        source.num_rows,
        target.num_rows,
        [{"row": r} for r in missing],
        [{"row": r} for r in extra],
    )


def compare_mirror(
    conninfo: str,
    table: str,
    target: pa.Table | None,
    where: sql.Composable | None = None,
    publications: Sequence[str] = (),
) -> Verdict:
    """A mirror's rows (None: the target table does not exist) against the source's (those
    `where` selects, when `target` holds the mirror's rows that match it; the columns
    `publications` publish)."""
    return _compare(table, source_rows(conninfo, table, where, publications), target)


def compare_history(
    conninfo: str, table: str, history: pa.Table | None, publications: Sequence[str] = ()
) -> Verdict:
    """A history table's current versions (``__END_AT`` null) against the source; also
    checks that no version was written twice."""
    if history is None:
        return compare_mirror(conninfo, table, None, publications=publications)
    starts = history.column("__START_AT").to_pylist()
    key_names = [n for n in history.column_names if not n.startswith("__")]
    versions = Counter(
        (repr(tuple(r[n] for n in key_names)), repr(s))
        for r, s in zip(history.to_pylist(), starts, strict=True)
    )
    duplicated = [v for v, count in versions.items() if count > 1]
    current = history.filter(pa.compute.is_null(history.column("__END_AT")))
    verdict = _compare(table, source_rows(conninfo, table, publications=publications), current)
    if duplicated:
        return Verdict(
            verdict.table,
            verdict.source_rows,
            verdict.target_rows,
            verdict.missing,
            verdict.extra + [{"duplicated version": d} for d in duplicated[:5]],
        )
    return verdict
