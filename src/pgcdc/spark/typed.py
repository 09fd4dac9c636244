"""Typed per-table DataFrames from the envelope.

`table_changes(envelope, "public.orders", conninfo=...)` keeps one table's rows and replaces
the text maps ``key``, ``before`` and ``after`` by structs of the table's columns, typed through
`pgcdc.types` exactly as the Delta targets are (same Spark mapping, same out-of-range policy).
The conversion runs on the executors (``mapInArrow``). The columns are the table's as the
catalog describes it now, or those of a given `Relation`; a value of a column the row does not
have (added later, dropped since) is null, and ``unchanged_toast`` still lists the columns whose
value an update did not send.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import types as st

from pgcdc.decoding.catalog import Catalog
from pgcdc.protocol import Column, Relation, TupleData
from pgcdc.types.arrow import ArrowBatchBuilder, relation_spark_schema
from pgcdc.types.catalog import TypeCatalog, TypeDescriptions
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions
from pgcdc.types.registry import TypeRegistry

__all__ = ["catalog_relation", "table_changes"]

_KEPT = ("commit_lsn", "ordinal", "sequence", "xid", "commit_ts", "origin", "op", "lsn")
_COLUMNS_SQL = """
SELECT a.attname, a.atttypid::int8, a.atttypmod,
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


def catalog_relation(
    conninfo: str, table: str, publications: Sequence[str] = ()
) -> tuple[Relation, TypeDescriptions]:
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
        columns = tuple(
            Column(int(bool(k)), n, int(oid), int(mod))
            for n, oid, mod, k, generated in rows
            if (n in published if published else not generated)
        )
        types = TypeCatalog(catalog).describe(c.type_oid for c in columns)
    finally:
        catalog.close()
    return Relation(0, schema, name, "d", columns), types


def _row_struct(relation: Relation, registry: TypeRegistry, options: MappingOptions) -> Any:
    fields = relation_spark_schema(relation, registry, options).fields[: len(relation.columns)]
    return st.StructType(fields)


def table_changes(
    envelope: Any,
    table: str,
    *,
    conninfo: str | None = None,
    relation: Relation | None = None,
    options: MappingOptions = DEFAULT_OPTIONS,
) -> Any:
    """`envelope`'s insert/update/delete rows of `table`, with typed ``key``/``before``/
    ``after`` structs; give `conninfo` (the catalog says the columns and resolves user-defined
    types) or a `relation` of built-in types."""
    types = TypeDescriptions()
    if relation is None:
        if conninfo is None:
            raise ValueError("table_changes needs conninfo or relation")
        relation, types = catalog_relation(conninfo, table)
    registry = types.registry()
    schema_name, _, table_name = table.rpartition(".")
    row = _row_struct(relation, registry, options)
    out_schema = st.StructType(
        [envelope.schema[name] for name in _KEPT]
        + [
            st.StructField("key", row),
            st.StructField("before", row),
            st.StructField("after", row),
            st.StructField("unchanged_toast", st.ArrayType(st.StringType())),
        ]
    )
    names = [c.name for c in relation.columns]
    qualified = f"{schema_name or 'public'}.{table_name}"

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        builder = ArrowBatchBuilder(relation, types.registry(), options)
        row_type = pa.struct(list(builder.schema)[: len(names)])
        for batch in batches:
            yield _typed_batch(batch, builder, names, row_type)

    del registry  # executors build their own from `types`
    rows = envelope.where(
        (envelope["schema"] == (schema_name or "public"))
        & (envelope["table"] == table_name)
        & envelope["op"].isin("insert", "update", "delete")
    )
    typed = rows.select(*_KEPT, "key", "before", "after", "unchanged_toast")
    result = typed.mapInArrow(convert, out_schema)
    result.pgcdc_table = qualified
    return result


def _typed_batch(
    batch: pa.RecordBatch, builder: ArrowBatchBuilder, names: list[str], row_type: pa.DataType
) -> pa.RecordBatch:
    arrays = [batch.column(name) for name in _KEPT]
    for field in ("key", "before", "after"):
        present = []
        for pairs in batch.column(field).to_pylist():
            present.append(pairs is not None)
            values = dict(pairs or ())
            kinds = bytes(0x74 if values.get(n) is not None else 0x6E for n in names)
            encoded = tuple(None if values.get(n) is None else values[n].encode() for n in names)
            builder.append(TupleData(kinds, encoded))
        typed = builder.flush()
        struct = pa.StructArray.from_arrays(
            typed.columns[: len(names)],
            fields=list(row_type),
            mask=pa.array([not p for p in present], pa.bool_()),
        )
        arrays.append(struct)
    arrays.append(batch.column("unchanged_toast"))
    fields = [batch.schema.field(n) for n in _KEPT]
    fields += [pa.field(f, row_type) for f in ("key", "before", "after")]
    fields.append(batch.schema.field("unchanged_toast"))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
