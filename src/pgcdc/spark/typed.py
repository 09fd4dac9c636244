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

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import types as st

from pgcdc.protocol import Relation, TupleData
from pgcdc.snapshot.relation import catalog_relation
from pgcdc.types.arrow import ArrowBatchBuilder, relation_spark_schema
from pgcdc.types.catalog import TypeDescriptions
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions
from pgcdc.types.registry import TypeRegistry

__all__ = ["table_changes"]

_KEPT = ("commit_lsn", "ordinal", "sequence", "xid", "commit_ts", "origin", "op", "lsn")


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
        source = catalog_relation(conninfo, table)
        relation, types = source.relation, source.types
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
