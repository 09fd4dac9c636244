"""One Delta table as a target holds it: opened once and kept between batches (its log read
again only from the version it knows: `update_incremental`; pgcdc's own merge-on-read
commits only when something needs them: `pgcdc.targets._mor.kept`), created with the
target's mode, source and table properties, read through DataFusion.

The table properties bound what a batch rewrites and what the lake keeps (`TABLE_PROPERTIES`,
each one overridable per target): a MERGE writes files of at most ``delta.targetFileSize``
(delta-rs's default, 100 MB, would make one file of a table and rewrite it whole for any
change), files a commit removed are deleted by the periodic vacuum once older than
``delta.deletedFileRetentionDuration`` (a reader's query must finish within it), and log
entries older than ``delta.logRetentionDuration`` go at each checkpoint (time travel reaches
that far back; no further than the files are kept; and delta-rs lists the whole log each time
it reads a table on, so every entry kept costs each batch of each target). A table made
before, or with other values, gets them at its first open. A local table also gets deletion
vectors (``delta.enableDeletionVectors``): pgcdc then writes a batch's changed rows
merge-on-read (`pgcdc.targets._merge_on_read`); on an object store pgcdc cannot write them
yet, and merges copy-on-write.

A column added to a table may need a table feature: a timestamp without time zone (Delta's
TIMESTAMP_NTZ, also inside a struct or a list) needs ``timestampNtz``. delta-rs's writes that
replace or append the schema enable it, but a MERGE that evolves the schema does not, and
commits a table no reader (delta-rs included) opens any more; `TableIO.adds_columns` enables
the features first, for every write that adds columns."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, TableFeatures, write_deltalake

from pgcdc.errors import TargetError
from pgcdc.targets._arrow import conform
from pgcdc.targets._mor.kept import KeptTable
from pgcdc.targets._mor.log import local_log_dir, update
from pgcdc.targets.base import Mode

__all__ = ["LOCAL_PROPERTIES", "TABLE_PROPERTIES", "TableIO"]

#: pgcdc's table properties (see the module docstring); a target's own override them.
TABLE_PROPERTIES = {
    "delta.targetFileSize": str(8 << 20),
    "delta.deletedFileRetentionDuration": "interval 30 minutes",
    "delta.logRetentionDuration": "interval 30 minutes",
}
#: And a local table's.
LOCAL_PROPERTIES = {"delta.enableDeletionVectors": "true"}
#: A DeltaTable kept open is read anew after this many versions (`KeptTable.read_anew`).
RENEW_EVERY = 200


class TableIO:
    """The Delta table at `path` of a target of `mode` (None until it exists)."""

    def __init__(
        self,
        path: str,
        mode: Mode,
        storage_options: dict[str, str] | None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.mode = mode
        self.storage_options = storage_options
        local = {} if "://" in path and not path.startswith("file://") else LOCAL_PROPERTIES
        self.properties = {**TABLE_PROPERTIES, **local, **(properties or {})}
        self._table: KeptTable | None = None
        self._log_dir = local_log_dir(path)
        #: The version the DeltaTable was last read anew at (`load`, `KeptTable.read_anew`).
        self._loaded_at = -1
        #: Per application id: its transaction's version (the watermark) as of a version of
        #: the table (the DeltaTable it was read from, the version, the watermark).
        self._watermarks: dict[str, tuple[DeltaTable, int, int | None]] = {}

    def open(self) -> DeltaTable | None:
        """The table as of now (its log read from where it was), or None when there is none
        yet; refuses one of another mode."""
        table = self._table
        if table is not None:
            try:
                update(table, self._log_dir)
                if table.version() - self._loaded_at >= RENEW_EVERY:
                    table.read_anew()
                    self._loaded_at = table.version()
                return table
            except Exception:  # removed, or replaced under us: read it anew
                self._table = None
        if not DeltaTable.is_deltatable(self.path, self.storage_options):
            return None
        table = self.load()
        configuration = table.metadata().configuration
        mode = configuration.get("pgcdc.mode")
        if mode is not None and mode != self.mode:
            self._table = None
            raise TargetError(f"{self.path} is a pgcdc {mode} table, not {self.mode}")
        changed = {k: v for k, v in self.properties.items() if configuration.get(k) != v}
        if changed:
            table.alter.set_table_properties(changed, raise_if_not_exists=False)
        return table

    @property
    def cached(self) -> DeltaTable | None:
        """The table as last read, its log not read on (None before the first read)."""
        return self._table

    def load(self) -> KeptTable:
        """The table read anew."""
        self._table = KeptTable(self.path, storage_options=self.storage_options)
        self._loaded_at = self._table.version()
        return self._table

    def create(self, schema: pa.Schema, source: str) -> DeltaTable:
        configuration = {**self.properties, "pgcdc.mode": self.mode, "pgcdc.source": source}
        DeltaTable.create(
            self.path,
            schema,
            mode="ignore",
            name=source,
            configuration=configuration,
            storage_options=self.storage_options,
            raise_if_key_not_exists=False,  # delta-rs refuses keys outside delta.* otherwise
        )
        return self.load()

    def adds_columns(self, table: DeltaTable, schema: pa.Schema) -> bool:
        """Whether `schema` has columns the table lacks (a write must evolve the table's
        schema); if so, the table features their types need are enabled first, in a commit
        of their own (see the module docstring)."""
        held = set(self.schema(table).names)
        new = [f for f in schema if f.name not in held]
        if not new:
            return False
        protocol = table.protocol()
        enabled = set(protocol.reader_features or ()) & set(protocol.writer_features or ())
        if "timestampNtz" not in enabled and any(_timestamp_ntz(f.type) for f in new):
            table.alter.add_feature(
                TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True
            )
        return True

    @property
    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.path, self.storage_options)

    @staticmethod
    def schema(table: DeltaTable) -> pa.Schema:
        return pa.schema(table.schema().to_arrow())

    def query(self, table: DeltaTable, sql: str, schema: pa.Schema) -> pa.Table:
        """`sql` over the table (registered as ``t``), cast to `schema`.

        Through DataFusion rather than `to_pyarrow_table`: pyarrow's dataset scan over
        delta-rs's Python file system can abort the interpreter at exit; DataFusion also
        returns string_view columns, hence the cast."""
        result = pa.table(QueryBuilder().register("t", table).execute(sql))
        return conform(result, schema)

    def read_all(self, table: DeltaTable) -> pa.Table:
        return self.query(table, "SELECT * FROM t", self.schema(table))

    def watermark(self, table: DeltaTable, app_id: str) -> int | None:
        """The version of `app_id`'s application transaction in `table` (a target's
        watermark), read from the log once per version of the table
        (`DeltaTable.transaction_version` replays the log's transactions each time)."""
        version = table.version()
        known = self._watermarks.get(app_id)
        if known is not None and known[0] is table and known[1] == version:
            return known[2]
        value = table.transaction_version(app_id)
        self._watermarks[app_id] = (table, version, value)
        return value

    def wrote(self, app_id: str, version: int, watermark: int) -> None:
        """The commit that made `version` of the table carries `watermark` for `app_id`."""
        table = self._table
        if table is not None and table.version() == version:
            self._watermarks[app_id] = (table, version, watermark)

    def mark(self, table: DeltaTable, commit: CommitProperties) -> None:
        """A commit that only records the watermark (an empty append)."""
        write_deltalake(
            table, self.schema(table).empty_table(), mode="append", commit_properties=commit
        )


def _timestamp_ntz(t: pa.DataType) -> bool:
    """Whether `t` is, or holds, a timestamp without time zone (Delta's TIMESTAMP_NTZ)."""
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_map(t):
        return _timestamp_ntz(t.key_type) or _timestamp_ntz(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _timestamp_ntz(t.value_type)
    if pa.types.is_struct(t):
        return any(_timestamp_ntz(t.field(i).type) for i in range(t.num_fields))
    return False
