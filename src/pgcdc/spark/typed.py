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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as st

from pgcdc.protocol import Relation
from pgcdc.snapshot.relation import catalog_relation
from pgcdc.types.arrow import relation_spark_schema
from pgcdc.types.catalog import TypeDescriptions
from pgcdc.types.columns import TextColumns
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
        columns = TextColumns(relation, types.registry(), options, qualified)
        row_type = pa.struct(list(columns.schema)[: len(names)])
        for batch in batches:
            yield _typed_batch(batch, columns, names, row_type)

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
    batch: pa.RecordBatch, columns: TextColumns, names: list[str], row_type: pa.DataType
) -> pa.RecordBatch:
    """`batch` with its maps ``key``, ``before`` and ``after`` typed: each column's texts
    taken out of the maps by name (NULL where a row's map lacks it), typed a column at a time."""
    arrays = [batch.column(name) for name in _KEPT]
    rows = batch.num_rows
    for field in ("key", "before", "after"):
        maps = batch.column(field)
        present = pc.invert(pc.is_null(maps))
        # every entry's keys and items, flat, and the row each belongs to (from the offsets:
        # pyarrow 26 aborts in list_parent_indices on a map array)
        offsets = maps.offsets.to_numpy()
        start, end = int(offsets[0]), int(offsets[-1])
        flat_keys = maps.keys.slice(start, end - start)
        flat_items = maps.items.slice(start, end - start)
        parents = pa.array(np.repeat(np.arange(rows), np.diff(offsets)))
        typed = []
        for i, name in enumerate(names):
            hit = pc.equal(flat_keys, name)
            texts = pa.nulls(rows, pa.string())
            if pc.any(hit).as_py():
                where = pc.filter(parents, hit).to_numpy()
                texts = pc.replace_with_mask(
                    texts,
                    pa.array(np.isin(np.arange(rows), where)),
                    pc.filter(flat_items, hit),
                )
            typed.append(columns.column(i, texts)[0])
        arrays.append(
            pa.StructArray.from_arrays(typed, fields=list(row_type), mask=pc.invert(present))
        )
    arrays.append(batch.column("unchanged_toast"))
    fields = [batch.schema.field(n) for n in _KEPT]
    fields += [pa.field(f, row_type) for f in ("key", "before", "after")]
    fields.append(batch.schema.field("unchanged_toast"))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
