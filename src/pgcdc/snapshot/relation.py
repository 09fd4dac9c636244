"""A source table as the stream describes it: the columns a Relation message would list now
(the ones the publications publish), the descriptions of their types, and their attnums. The
initial copy, the resync after a lost slot and `verify` read tables this way, so that what
they copy or compare is what the stream sends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgcdc.decoding.catalog import Catalog
from pgcdc.protocol import Column, Relation
from pgcdc.types.catalog import TypeCatalog, TypeDescriptions

__all__ = ["SourceTable", "catalog_relation"]

_COLUMNS_SQL = """
SELECT a.attnum::int, a.attname, a.atttypid::int8, a.atttypmod,
       a.attnum = ANY(coalesce((
           SELECT i.indkey::int2[] FROM pg_catalog.pg_index i
           WHERE i.indrelid = a.attrelid AND (i.indisreplident OR i.indisprimary)
           ORDER BY i.indisreplident DESC LIMIT 1), '{}')),
       a.attgenerated <> ''
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
#: The columns the publications publish of the table (or of its partitions), PostgreSQL 15+:
#: a column list, and generated columns (published only on 18+, when the publication says).
_PUBLISHED_SQL = """
SELECT DISTINCT unnest(pt.attnames)
FROM pg_catalog.pg_publication_tables pt
JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY(%s)
  AND (c.oid = %s::regclass
       OR c.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree(%s::regclass)))
"""


@dataclass(frozen=True, slots=True)
class SourceTable:
    """A table as a Relation message would describe it now, the descriptions of its columns'
    types, and what its columns are (their attnums)."""

    relation: Relation
    types: TypeDescriptions
    attnums: tuple[int, ...]


def catalog_relation(conninfo: str, table: str, publications: Sequence[str] = ()) -> SourceTable:
    """`table` ("schema.name") as a Relation message would describe it now, and the
    descriptions of its columns' types: the columns `publications` publish (their column
    lists; generated columns where a PostgreSQL 18 publication publishes them), or without
    publications every column but generated ones (which no publication sends before 18)."""
    schema, _, name = table.rpartition(".")
    schema = schema or "public"
    catalog = Catalog(conninfo)
    try:
        regclass = f"{catalog.quote_identifier(schema)}.{catalog.quote_identifier(name)}"
        rows = catalog.query(_COLUMNS_SQL, (regclass,))
        published: set[str] = set()
        if publications and int(catalog.query("SHOW server_version_num")[0][0]) >= 150000:
            found = catalog.query(_PUBLISHED_SQL, (list(publications), regclass, regclass))
            published = {name for (name,) in found}
        sent = [row for row in rows if (row[1] in published if published else not row[5])]
        columns = tuple(
            Column(int(bool(k)), n, int(oid), int(mod)) for _, n, oid, mod, k, _ in sent
        )
        types = TypeCatalog(catalog).describe(c.type_oid for c in columns)
    finally:
        catalog.close()
    relation = Relation(0, schema, name, "d", columns)
    return SourceTable(relation, types, tuple(row[0] for row in sent))
