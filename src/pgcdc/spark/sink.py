"""The streaming sink ``pgcdc``: envelope rows (the ``pgoutput`` source's) applied to mirror,
history or change log targets through the same `pgcdc.targets.Target` contract as
``pgcdc run``, exactly once. It is what a Spark Declarative Pipeline writes into with
``dp.create_sink(name, format="pgcdc", options={...})`` (see `pgcdc.spark.sdp`), and it works
in any streaming query (``writeStream.format("pgcdc")``).

Each micro-batch: the tasks (``write``, on executors) hand their rows back as Arrow IPC bytes;
``commit`` (on the driver, once every task succeeded) groups them by source table and applies
each table's rows to its targets, one ``Target.apply`` per target: one Delta commit carrying
the highest commit LSN applied as the target's watermark. A batch replayed after a crash (the
query restarted from its checkpoint, or the source sent it again because its slot was not
confirmed) holds only rows at or below that watermark, which `apply` skips: every change is
applied once. A table's rows are never applied in parts, since a part would move the
watermark past the rest.

Options:

* ``path`` (required): the lake; a table's targets are ``<path>/<schema>.<table>`` (mirror),
  ``…__history`` and ``…__changelog``, as ``pgcdc run`` lays them out.
* ``conninfo`` (required): the source database, which describes user-defined types and gives
  an added column's values for the rows written before it.
* ``modes``: ``mirror`` (default), ``history``, ``changelog``, or several, comma-separated.
* ``tables``: the tables to apply (comma-separated ``schema.table``); default every table
  in the stream.
* ``name``: the targets' application id is ``pgcdc:<name>`` (default ``sdp``), the key of
  their watermark: two writers of one target must not share it.
* ``storage.<KEY>``: delta-rs storage options (``storage.AWS_REGION`` …; Spark lowers an
  option's case, the sink gives delta-rs the key in capitals), for a lake on an object store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA
from pgcdc.errors import TargetError
from pgcdc.pipeline.config import target_path
from pgcdc.targets.base import MODES, Mode, TargetSpec, open_target

__all__ = ["PgcdcSink", "SinkOptions", "StagedRows"]

#: The envelope operations a target applies (messages are not a table's).
_APPLIED = ("insert", "update", "delete", "truncate", "read")


@dataclass(frozen=True, slots=True)
class SinkOptions:
    path: str
    conninfo: str
    modes: tuple[Mode, ...] = ("mirror",)
    tables: frozenset[str] | None = None
    name: str = "sdp"
    storage_options: Mapping[str, str] | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        given = {k.lower(): v for k, v in options.items()}
        missing = [n for n in ("path", "conninfo") if not given.get(n)]
        if missing:
            raise TargetError(f"the pgcdc sink needs the option(s) {', '.join(missing)}")
        modes = tuple(m.strip() for m in given.get("modes", "mirror").split(",") if m.strip())
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise TargetError(
                f"option modes={given.get('modes')!r}: each must be one of {', '.join(MODES)}"
            )
        tables = given.get("tables")
        # Spark hands options with lower-case keys; delta-rs documents its own in capitals
        prefix = len("storage.")
        storage = {k[prefix:].upper(): v for k, v in given.items() if k.startswith("storage.")}
        return cls(
            path=given["path"],
            conninfo=given["conninfo"],
            modes=modes,  # type: ignore[arg-type]
            tables=None
            if tables is None
            else frozenset(t if "." in t else f"public.{t}" for t in _words(tables)),
            name=given.get("name", "sdp"),
            storage_options=storage or None,
        )

    @property
    def app_id(self) -> str:
        return f"pgcdc:{self.name}"

    def target(self, table: str, mode: Mode) -> TargetSpec:
        path = target_path(self.path, table, mode)
        return TargetSpec(path, mode, storage_options=self.storage_options)


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


@dataclass(frozen=True, slots=True)
class StagedRows(WriterCommitMessage):
    """One task's rows of a micro-batch, as an Arrow IPC stream."""

    ipc: bytes
    rows: int


def envelope_rows(table: pa.Table) -> pa.Table:
    """`table` (the rows a flow gave the sink) in the envelope's exact Arrow form; one line
    naming what is missing when it is not envelope rows."""
    missing = [f.name for f in ENVELOPE_ARROW_SCHEMA if f.name not in table.column_names]
    if missing:
        raise TargetError(
            f"the pgcdc sink takes the pgoutput source's rows; these columns are missing: "
            f"{', '.join(missing)}"
        )
    return table.select(ENVELOPE_ARROW_SCHEMA.names).cast(ENVELOPE_ARROW_SCHEMA)


class PgcdcStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        batches = list(iterator)
        sink = pa.BufferOutputStream()
        if batches:
            with pa.ipc.new_stream(sink, batches[0].schema) as stream:
                for batch in batches:
                    stream.write_batch(batch)
        return StagedRows(sink.getvalue().to_pybytes(), sum(b.num_rows for b in batches))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tables = [
            pa.ipc.open_stream(m.ipc).read_all()
            for m in messages
            if isinstance(m, StagedRows) and m.rows
        ]
        if tables:
            apply_rows(self.options, envelope_rows(pa.concat_tables(tables)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was applied: `commit` alone writes."""


def apply_rows(options: SinkOptions, rows: pa.Table) -> dict[str, int]:
    """Each source table's rows in `rows` applied to its targets (see the module); rows
    applied per target ("schema.table mode")."""
    from pgcdc.decoding.catalog import Catalog
    from pgcdc.snapshot.fill import SourceFills
    from pgcdc.types.catalog import TypeCatalog

    rows = rows.filter(pc.is_in(rows.column("op"), pa.array(_APPLIED)))
    names = pc.binary_join_element_wise(rows.column("schema"), rows.column("table"), ".")
    applied: dict[str, int] = {}
    with contextlib.closing(Catalog(options.conninfo)) as catalog:
        types = TypeCatalog(catalog)
        for table in sorted(set(names.to_pylist())):
            if options.tables is not None and table not in options.tables:
                continue
            changes = rows.filter(pc.equal(names, table))
            columns = pc.list_flatten(changes.column("columns"))
            oids = pc.unique(pc.struct_field(columns, "type_oid")).to_pylist()
            types.describe(o for o in oids if o is not None)
            for mode in options.modes:
                target = open_target(
                    options.target(table, mode),
                    app_id=options.app_id,
                    registry=types.registry,
                    source=table,
                    fills=SourceFills(options.conninfo),
                )
                applied[f"{table} {mode}"] = target.apply(changes).applied
    return applied


class PgcdcSink(DataSource):
    """``format("pgcdc")``: a streaming sink (see the module)."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def schema(self) -> StructType:
        from pgcdc.spark.envelope import ENVELOPE_SCHEMA

        return ENVELOPE_SCHEMA

    def streamWriter(self, schema: StructType, overwrite: bool) -> PgcdcStreamWriter:
        return PgcdcStreamWriter(SinkOptions.parse(self.options))


def register_sink(spark: Any) -> None:
    """Make ``format("pgcdc")`` available in `spark`."""
    spark.dataSource.register(PgcdcSink)
