"""Delta Lake targets (through `deltalake`, delta-rs): one source table into one Delta table.

Modes:

* ``mirror`` (SCD type 1): the table equals the source table. A batch is folded per key
  (`pgcdc.targets.fold`) and written as one MERGE keyed on the replica identity; a batch with
  a TRUNCATE is one overwrite with what follows the truncation.
* ``history`` (SCD type 2, as AUTO CDC's): one row per version, the source columns plus
  ``__START_AT`` and ``__END_AT`` (struct<commit_lsn, ordinal>, the change's sequence;
  ``__END_AT`` null for the current version). One MERGE per batch ends the key's current
  version and inserts the new ones; a TRUNCATE ends every current version.
* ``changelog``: the envelope rows, appended.

Exactly once: the highest commit LSN applied is recorded in the same commit as the data, as
the Delta application transaction version of `app_id`; `apply` first drops rows at or below
it, so a replayed batch changes nothing. Batches must hold whole transactions (all rows of a
commit LSN). When a batch needs more than one commit, only the last one carries the watermark:
table creation and a widening rewrite are idempotent; a batch in which the replica identity
changes is written one run of changes per commit, and each commit but the last names, in its
commit metadata (``pgcdc.partial``), the last change it holds, so that a replay after a crash
between them skips what is in (a watermark cannot say it: the run may end inside a
transaction). A MERGE that changes no row makes no commit in delta-rs; the watermark then goes
in an empty append.

Keys: the replica identity's columns (``t.k = s.k``). Under REPLICA IDENTITY FULL every column
is the key, compared null-safely (``IS NOT DISTINCT FROM``), and the table is a multiset:
identical rows are copies, each counted (`pgcdc.targets.fold.fold_multiset`), so a mirror holds
as many copies as the source, and deleting or updating one copy removes one. Tables with no
identity (REPLICA IDENTITY NOTHING) only accept inserts, which are appended.

Schema changes (each change's ``columns`` describe the relation as of that change), applied
in sequence order, batch by batch:

* an added column is added to the table, and the rows written before get the value the
  source has in them (its default, or per key what the source table holds: a `FillSource`,
  see `pgcdc.targets.added_columns`); without a `FillSource` they hold NULL;
* a dropped column stays; rows written afterwards hold NULL in it;
* a type change to the same Arrow type changes nothing; a lossless widening (int16 → int32 →
  int64, float32 → float64, decimal(p,s) → decimal(p',s) with p' ≥ p, and arrays of those)
  rewrites the table with the wider type in one commit before the batch's data; a change
  back to a narrower type the column already holds keeps the wider column;
* any other type change (int to text, text to int with a USING expression, a scale change,
  timestamp to timestamptz) rewrites the table with the new type, every row holding the
  value the source has now, read per key as for a renamed column (the server rewrote the
  rows without a change; later changes of a row arrive after and are applied over it); a
  history's ended versions keep their values cast to the new type, null where they cannot
  be cast. A key column's type change, or one in a table without a key, raises
  `SchemaChangeError` naming the table, column, both types and the LSN of the change;
  nothing is written (the table can be copied again: `on_error`, ``pgcdc recopy``).

Types Delta cannot store (``time`` as TimeType, ``interval`` as DayTimeIntervalType) raise
`TargetError`; map them to strings (`MappingOptions(time="string", interval="string")`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA, ColumnInfo, Shape
from pgcdc.errors import SchemaChangeError, TargetError, ValueOutOfRange
from pgcdc.protocol import Column, Lsn, Relation, TupleData
from pgcdc.targets.added_columns import (
    AddedColumn,
    ColumnFill,
    FillSource,
    added_columns,
    fill_array,
    fill_texts,
    fill_values,
)
from pgcdc.targets.base import (
    END_AT,
    MODES,
    SEQUENCE_TYPE,
    START_AT,
    ApplyResult,
    Mode,
    Target,
    TargetSpec,
    TargetState,
    copy_watermark,
    history_columns,
)
from pgcdc.targets.bulk import BulkMirror, bulk_mirror
from pgcdc.targets.fold import (
    Change,
    HistoryPlan,
    Image,
    Key,
    MirrorPlan,
    MultisetPlan,
    Seq,
    changes_from_envelope,
    describe_seq,
    fold_history,
    fold_mirror,
    fold_multiset,
    segments,
)
from pgcdc.targets.naming import Naming, plan_naming
from pgcdc.targets.reconcile import diff_by_key, diff_multiset, hashable
from pgcdc.types.arrow import UNCHANGED_TOAST_COLUMN, ArrowBatchBuilder
from pgcdc.types.columns import TextColumns
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions, arrow_type
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeRegistry

__all__ = ["CHUNK_KEY", "POINT_KEY", "DeltaTarget"]

log = logging.getLogger(__name__)

#: Commit metadata of an initial copy's chunk: the chunk, the copy's point, its rows.
CHUNK_KEY, POINT_KEY, ROWS_KEY = (
    "pgcdc.snapshot.chunk",
    "pgcdc.snapshot.point",
    "pgcdc.snapshot.rows",
)

#: How often (in table versions) `maintain` checkpoints, and compacts the files.
CHECKPOINT_EVERY = 100
COMPACT_EVERY = 1000
#: The most commits `maintain` makes in a row (compaction, vacuum start and end).
_MAINTENANCE_COMMITS = 4
#: The ordinal at which a reconcile with a copy at point P ends versions, (P, this); the ones it
#: opens follow. Negative: before every change the stream brings at commit LSN P (ordinal 1 on).
_RECONCILED = -(1 << 62)
#: The merge source's column telling what a row does; never written to the table.
ACTION = "_pgcdc_action"
#: Above this many keys, a lookup of current rows scans instead of listing the keys.
_MAX_IN_LIST = 10_000
_T, _N, _U = 0x74, 0x6E, 0x75
Plan = MirrorPlan | HistoryPlan | MultisetPlan
#: Commit metadata: the last change of a batch's commit that is not its last; the
#: relation's columns as of a batch's last change.
_PARTIAL, _COLUMNS = "pgcdc.partial", "pgcdc.columns"


def _q(name: str) -> str:
    """A quoted SQL identifier (delta-rs predicates are DataFusion SQL)."""
    return '"' + name.replace('"', '""') + '"'


def _canonical(t: pa.DataType) -> pa.DataType:
    """`t` without what Delta does not keep: list item names, string and binary layouts."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(pa.field("element", _canonical(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _canonical(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_canonical(t.key_type), _canonical(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def _same(a: pa.DataType, b: pa.DataType) -> bool:
    return _canonical(a).equals(_canonical(b))


_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def _widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every `old` value is exactly a `new` value (and the types differ)."""
    if old in _INTS and new in _INTS:
        return _INTS.index(new) > _INTS.index(old)
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return old.scale == new.scale and new.precision > old.precision
    if pa.types.is_list(old) and pa.types.is_list(new):
        return _widens(old.value_type, new.value_type)
    return False


def _reshaped(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether `new` is `old` (a composite type's struct, or a list of them) with attributes
    added or dropped, the others the same: the values cast by name (NULL in an attribute
    added, as the server reads a value stored before), the column follows the type."""
    if pa.types.is_list(old) and pa.types.is_list(new):
        return _reshaped(old.value_type, new.value_type)
    if not (pa.types.is_struct(old) and pa.types.is_struct(new)) or _same(old, new):
        return False
    before = {f.name: f.type for f in old}
    kept = [f for f in new if f.name in before]
    same = all(_same(before[f.name], f.type) or _widens(before[f.name], f.type) for f in kept)
    return same and (len(kept) == len(new) or len(kept) == len(old))


def _seq_sql(seq: Seq) -> str:
    lsn, ordinal = seq
    return (
        f"named_struct('commit_lsn', arrow_cast({lsn}, 'Int64'), "
        f"'ordinal', arrow_cast({ordinal}, 'Int64'))"
    )


def _before(a: str, b: str) -> str:
    """SQL: sequence struct `a` orders before `b`."""
    return (
        f"({a}['commit_lsn'] < {b}['commit_lsn'] OR ({a}['commit_lsn'] = {b}['commit_lsn'] "
        f"AND {a}['ordinal'] < {b}['ordinal']))"
    )


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with `schema`'s columns, in its order: missing ones null, others cast."""
    n = table.num_rows
    names = set(table.column_names)
    arrays = [
        table.column(f.name).cast(f.type) if f.name in names else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _fit(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`_conform`, but values of a type the table no longer holds (a later type change is
    in the table already, or this batch's fills them: `DeltaTarget._fill_older`) are null."""
    stale = [
        f.name
        for f in table.schema
        if f.name in schema.names
        and not (
            _same(f.type, schema.field(f.name).type) or _widens(f.type, schema.field(f.name).type)
        )
    ]
    return _conform(table.drop_columns(stale), schema)


@dataclass(slots=True)
class _Evolution:
    """The table schema a batch needs: `schema` (current columns first, new ones after);
    `widened`: existing columns whose type grows (the table is rewritten); `retyped`: columns
    whose type changed to one their values cannot be cast to, each with the first change of
    its last type change (the table is rewritten with the source's values, and so are the
    batch's images from before that change)."""

    schema: pa.Schema
    widened: set[str]
    retyped: dict[str, Change]


class DeltaTarget(Target):
    """One Delta table at `path`, kept from one source table's change envelopes.

    `app_id` names the writer in the table's application transactions (the watermark); two
    pipelines writing one table need different ones. `source` ("schema.table") names the
    table in messages and is stored with the table as ``pgcdc.source``."""

    def __init__(
        self,
        path: str,
        mode: Mode,
        *,
        app_id: str,
        registry: TypeRegistry = DEFAULT_REGISTRY,
        options: MappingOptions = DEFAULT_OPTIONS,
        storage_options: dict[str, str] | None = None,
        source: str | None = None,
        fills: FillSource | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not app_id:
            raise ValueError("app_id must not be empty")
        self.path = str(path)
        self.mode: Mode = mode
        self.app_id = app_id
        self.registry = registry
        self.options = options
        self.storage_options = storage_options
        self.source = source
        #: The value of columns added to the source for the rows before (None: NULL).
        self.fills = fills
        self._builders: dict[Shape, ArrowBatchBuilder] = {}
        #: Per batch: the added columns' fills and the shape that has each.
        self._batch_fills: dict[str, tuple[ColumnFill, Shape]] = {}
        #: Per batch: the columns whose type changed beyond a widening, and the sequence of
        #: the first change of their last type change (see `_evolve`).
        self._retyped: dict[str, Seq] = {}
        #: Per batch: its last relation shape (the key's type as values are read now).
        self._latest: Shape | None = None
        self._writing_since: float | None = None

    def __repr__(self) -> str:
        return f"DeltaTarget({self.path!r}, {self.mode!r}, app_id={self.app_id!r})"

    @property
    def spec(self) -> TargetSpec:
        return TargetSpec(self.path, self.mode, "delta", self.storage_options)

    # --- the table ---------------------------------------------------------------------

    def _open(self) -> DeltaTable | None:
        """The table, or None when there is none yet; refuses one of another mode or source."""
        if not DeltaTable.is_deltatable(self.path, self.storage_options):
            return None
        table = self._load()
        config = table.metadata().configuration
        mode = config.get("pgcdc.mode")
        if mode is not None and mode != self.mode:
            raise TargetError(f"{self.path} is a pgcdc {mode} table, not {self.mode}")
        return table

    def _load(self) -> DeltaTable:
        return DeltaTable(self.path, storage_options=self.storage_options)

    def _create(self, schema: pa.Schema, source: str) -> DeltaTable:
        configuration = {"pgcdc.mode": self.mode, "pgcdc.source": source}
        return DeltaTable.create(
            self.path,
            schema,
            mode="ignore",
            name=source,
            configuration=configuration,
            storage_options=self.storage_options,
            raise_if_key_not_exists=False,  # delta-rs refuses keys outside delta.* otherwise
        )

    @property
    def watermark(self) -> int | None:
        """The highest commit LSN applied (None: nothing applied yet)."""
        table = self._open()
        return None if table is None else table.transaction_version(self.app_id)

    def _schema(self, table: DeltaTable) -> pa.Schema:
        return pa.schema(table.schema().to_arrow())

    def _query(self, table: DeltaTable, sql: str, schema: pa.Schema) -> pa.Table:
        """`sql` over the table (registered as ``t``), cast to `schema`.

        Through DataFusion rather than `to_pyarrow_table`: pyarrow's dataset scan over
        delta-rs's Python file system can abort the interpreter at exit; DataFusion also
        returns string_view columns, hence the cast."""
        result = pa.table(QueryBuilder().register("t", table).execute(sql))
        return _conform(result, schema)

    @property
    def exists(self) -> bool:
        """Whether the table was created (by a first apply with data)."""
        return DeltaTable.is_deltatable(self.path, self.storage_options)

    def to_arrow(self) -> pa.Table:
        """The table's current contents (row order unspecified)."""
        table = self._open()
        if table is None:
            raise TargetError(f"no Delta table at {self.path}")
        return self._query(table, "SELECT * FROM t", self._schema(table))

    # --- apply -------------------------------------------------------------------------

    def apply(self, rows: pa.Table) -> ApplyResult:
        """Applies one batch of envelope rows of one source table (any order).

        Rows at or below the watermark are skipped; the rest are written with the new
        watermark in the same (last) commit. A batch that raises writes nothing."""
        # Builders live for one batch: the registry may learn types between batches, and a
        # failed batch must leave no rows in them.
        started = time.perf_counter()
        self._builders.clear()
        self._batch_fills.clear()
        self._retyped = {}
        self._latest = None
        self._writing_since = None
        table = self._open()
        watermark = None if table is None else table.transaction_version(self.app_id)
        total = rows.num_rows
        if watermark is not None and total:
            rows = rows.filter(pc.greater(rows.column("commit_lsn"), pa.scalar(watermark)))
        skipped = total - rows.num_rows
        if rows.num_rows == 0:
            return ApplyResult(0, skipped, 0, 0, watermark, None)
        last = self._last_commit(table)
        if (partial := self._partial(last, watermark)) is not None:
            lsn, ordinal = partial  # a crash came between the commits of a batch
            lsns, ordinals = rows.column("commit_lsn"), rows.column("ordinal")
            done = pc.or_(
                pc.less(lsns, lsn), pc.and_(pc.equal(lsns, lsn), pc.less_equal(ordinals, ordinal))
            )
            rows = rows.filter(pc.invert(done))
            skipped = total - rows.num_rows
            if rows.num_rows == 0:
                return ApplyResult(0, skipped, 0, 0, watermark, None)
        high = pc.max(rows.column("commit_lsn")).as_py()
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, high)])
        if self.mode == "changelog":
            upserts, deletes, version = self._append(table, rows, commit)
        elif self.mode == "mirror" and (bulk := bulk_mirror(rows)) is not None:
            upserts, deletes, version = self._apply_bulk(table, bulk, rows, high, last)
        else:
            changes = changes_from_envelope(rows)
            if not changes:  # only logical messages: nothing to write
                return ApplyResult(0, skipped, 0, 0, watermark, None)
            upserts, deletes, version = self._apply_changes(table, changes, high, last)
        done = time.perf_counter()
        writing = self._writing_since or done
        return ApplyResult(
            rows.num_rows,
            skipped,
            upserts,
            deletes,
            high,
            version,
            writing - started,
            done - writing,
        )

    def _append(
        self, table: DeltaTable | None, rows: pa.Table, commit: CommitProperties
    ) -> tuple[int, int, int]:
        self._writing_since = time.perf_counter()
        if rows.column_names == ENVELOPE_ARROW_SCHEMA.names:
            rows = _conform(rows, ENVELOPE_ARROW_SCHEMA)
        if table is None:
            table = self._create(rows.schema, self.source or _source_of(rows))
        elif not _same_schema(self._schema(table), rows.schema):
            rows = _conform(rows, self._schema(table))
        write_deltalake(table, rows, mode="append", commit_properties=commit)
        return rows.num_rows, 0, self._load().version()

    def _apply_changes(
        self, table: DeltaTable | None, changes: list[Change], high: int, last: dict[str, Any]
    ) -> tuple[int, int, int]:
        source = self._check_source(table, changes)
        shapes = list(dict.fromkeys(c.shape for c in changes))
        table, recorded = self._follow_columns(table, last, shapes)
        changes = _renamed(changes, recorded)
        self._latest = changes[-1].shape
        evolution, before = self._schema_change(table, recorded.recorded, changes, source)
        schema = evolution.schema
        commit = self._commit(high, changes[-1].shape)
        runs = list(segments(changes))
        # Everything that can fail on the data (typing, the policy on out-of-range values)
        # happens before the first write.
        plans = [self._fold(run) for run in runs]
        typed = [self._type_plan(plan, schema) for plan in plans]
        self._writing_since = time.perf_counter()
        if table is None:
            table = self._create(schema, source)
        elif evolution.widened or before:
            self._rewrite(table, schema, before)
        upserts = deletes = 0
        keys = _recorded_keys(recorded.recorded)
        for i, (plan, data, run) in enumerate(zip(plans, typed, runs, strict=True)):
            final = i == len(plans) - 1
            table = self._load()
            shape = run[0].shape
            if keys is not None and shape.key_names != keys:
                self._check_new_key(table, shape, run[0].seq)
            keys = shape.key_names
            props = commit if final else self._partial_commit(run[-1].seq)
            if isinstance(plan, MultisetPlan):
                written = self._write_multiset(table, plan, data, schema, props)
                upserts += len(plan.versions)
                deletes += plan.deletes
            elif isinstance(plan, MirrorPlan):
                written = self._write_mirror(table, plan, data, schema, props)
                upserts += len(plan.upserts)
                deletes += len(plan.deletes)
            else:
                written = self._write_history(table, plan, data, schema, props)
                upserts += len(plan.versions)
                deletes += plan.deletes
            if final and not written:  # a merge that changed nothing makes no commit
                self._mark(table, commit)
        return upserts, deletes, self._load().version()

    def reset(
        self,
        relation: Relation,
        registry: TypeRegistry | None = None,
        attnums: Sequence[int] = (),
    ) -> None:
        """Empty the table and give it `relation`'s columns (a copy that starts over: the
        source's columns may have changed since the table was made; `attnums`: what they
        are), in one commit that records them as the columns of the rows to come."""
        schema = self._relation_schema(relation, registry)
        table = self._open()
        if table is None:
            self._create(schema, self._relation_source(relation))
            table = self._load()
        columns = _recorded_columns(Shape.of(relation, tuple(attnums)).columns)
        write_deltalake(
            table,
            schema.empty_table(),
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=CommitProperties(custom_metadata={_COLUMNS: columns}),
        )

    def _relation_source(self, relation: Relation) -> str:
        return self.source or f"{relation.namespace}.{relation.relname}"

    def _relation_schema(self, relation: Relation, registry: TypeRegistry | None) -> pa.Schema:
        """The table's schema for `relation`'s columns (and a history's version columns)."""
        if self.mode == "changelog":
            return ENVELOPE_ARROW_SCHEMA
        source = f"{relation.namespace}.{relation.relname}"
        builder = ArrowBatchBuilder(relation, registry or self.registry, self.options)
        fields = [f for f in builder.schema if f.name != UNCHANGED_TOAST_COLUMN]
        for f in fields:
            _check_storable(source, f)
        if self.mode == "history":
            fields += [pa.field(START_AT, SEQUENCE_TYPE), pa.field(END_AT, SEQUENCE_TYPE)]
        return pa.schema(fields)

    def write_chunk(self, rows: pa.Table, chunk: str, point: int, position: int) -> None:
        table = self._open()
        if table is None:
            raise TargetError(f"no Delta table at {self.path} (reset it first)")
        if self.mode == "history":
            rows = history_columns(rows, point, position)
        metadata = {CHUNK_KEY: chunk, POINT_KEY: str(int(point)), ROWS_KEY: str(rows.num_rows)}
        data = _conform(rows, self._schema(table))
        write_deltalake(
            table, data, mode="append", commit_properties=CommitProperties(custom_metadata=metadata)
        )

    def state(self) -> TargetState:
        table = self._open()
        if table is None:
            return TargetState(False)
        actions = pa.table(table.get_add_actions(flatten=True))  # an arro3 table: to pyarrow
        rows = pc.sum(actions.column("num_records")).as_py() or 0
        last = table.history(1)
        at = None
        if last and last[0].get("timestamp") is not None:
            at = datetime.fromtimestamp(last[0]["timestamp"] / 1000, UTC)
        return TargetState(True, table.transaction_version(self.app_id), rows, table.version(), at)

    def maintain(self) -> None:
        """Every `CHECKPOINT_EVERY` versions a checkpoint (readers then replay a few log
        entries, not all) and the log entries it makes unneeded go; every `COMPACT_EVERY`
        the small files of many commits are rewritten into few (and files removed a week
        ago, which no reader of the last week's versions needs, are deleted)."""
        table = self._open()
        if table is None:
            return
        version = table.version()
        if version and version % COMPACT_EVERY == 0:
            table.optimize.compact()
            table.vacuum(retention_hours=168, dry_run=False)
            table = self._load()
        if version and version % CHECKPOINT_EVERY == 0:
            table.create_checkpoint()
            table.cleanup_metadata()

    def reconcile(
        self,
        rows: pa.Table,
        point: int,
        keys: Sequence[str],
        *,
        keep_missing: bool = False,
        columns: Sequence[ColumnInfo] = (),
    ) -> None:
        """Make the table equal `rows`, the source table at `point` (typed rows from a copy
        under a new slot's snapshot, after the old slot was lost), changing only what
        differs (`pgcdc.targets.reconcile`), in one commit that records the copy's
        watermark (`copy_watermark`: the copy holds the commits before `point`). A mirror
        upserts the rows that differ or are missing and deletes the ones the source no longer
        has; a history ends the current versions of those and opens new ones, at `point`
        (before any change at `point`). `keys`: the table's key (none: whole rows, counted).
        `keep_missing`: rows the source does not have stay (a keyed table's). `columns`: the
        source's columns as of the copy, with their attnums: the target's are followed to
        them first (renamed, replaced: `pgcdc.targets.naming`), and recorded as the columns
        of the rows to come."""
        metadata = {_COLUMNS: _recorded_columns(columns)} if columns else None
        commit = CommitProperties(
            app_transactions=[Transaction(self.app_id, copy_watermark(point))],
            custom_metadata=metadata,
        )
        table = self._open()
        if table is None or self.mode == "changelog":  # a change log cannot know what it missed
            if table is not None:
                self._mark(table, commit)
            return
        if columns:
            shape = Shape("", "", 0, "d", tuple(columns))
            followed, _ = self._follow_columns(table, self._last_commit(table), [shape])
            assert followed is not None
            table = followed
        current = self._schema(table)
        names = rows.column_names
        schema = pa.schema(
            [*current] + [rows.schema.field(n) for n in names if n not in current.names]
        )
        data = _conform(self.to_arrow(), schema)  # columns new to the target: null
        if self.mode == "history":
            data = data.filter(pc.is_null(data.column(END_AT)))
        written = (
            self._reconcile_keyed(table, data, rows, keys, schema, point, commit, keep_missing)
            if keys
            else self._reconcile_multiset(table, data, rows, schema, point, commit)
        )
        if not written:
            self._mark(self._load(), commit)

    def _reconcile_keyed(
        self,
        table: DeltaTable,
        data: pa.Table,
        rows: pa.Table,
        keys: Sequence[str],
        schema: pa.Schema,
        point: int,
        commit: CommitProperties,
        keep_missing: bool = False,
    ) -> bool:
        diff = diff_by_key(data, rows, keys)
        if keep_missing:
            diff = replace(diff, deletes=diff.deletes.slice(0, 0))
        if diff.empty:
            return False
        match = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
        if self.mode == "mirror":
            source = pa.concat_tables(
                [
                    _with_action(_conform(diff.inserts, _data_schema(schema)), "upsert"),
                    _with_action(_conform(diff.updates, _data_schema(schema)), "upsert"),
                    _with_action(_conform(diff.deletes, _data_schema(schema)), "delete"),
                ]
            )
            shape = Shape("", "", 0, "d", tuple(ColumnInfo(k, 0, -1, True) for k in keys))
            return self._merge_mirror(table, shape, source, _data_schema(schema), commit)
        ended = pa.concat_tables([diff.updates.select(list(keys)), diff.deletes])
        opened = pa.concat_tables([diff.updates, diff.inserts])
        closes = _conform(ended, _data_schema(schema))
        closes = closes.append_column(START_AT, pa.nulls(len(closes), SEQUENCE_TYPE))
        # ended at (point, _RECONCILED), before the new versions start: no overlap
        closes = closes.append_column(
            END_AT, pa.repeat(pa.scalar(_seq((point, _RECONCILED)), SEQUENCE_TYPE), len(closes))
        )
        opens = _conform(opened, _data_schema(schema))
        opens = opens.append_column(START_AT, _sequences(point, _RECONCILED + 1, len(opens)))
        opens = opens.append_column(END_AT, pa.nulls(len(opens), SEQUENCE_TYPE))
        source = pa.concat_tables([_with_action(closes, "close"), _with_action(opens, "insert")])
        return self._merge_versions(table, source, match, schema, commit)

    def _reconcile_multiset(
        self,
        table: DeltaTable,
        data: pa.Table,
        rows: pa.Table,
        schema: pa.Schema,
        point: int,
        commit: CommitProperties,
    ) -> bool:
        diff = diff_multiset(data, rows)
        if diff.empty:
            return False
        names = rows.column_names
        held = set(self._schema(table).names)  # (a column new to the target: not compared)
        match = " AND ".join(
            f"(t.{_q(n)} IS NOT DISTINCT FROM s.{_q(n)})" for n in names if n in held
        )
        if self.mode == "mirror":
            # a row with copies too many: every copy goes, and as many as the source has
            # come back (MERGE cannot delete some of several identical rows); the rest stay
            whole = data.select(names)
            rows_of = [hashable(tuple(r.values())) for r in whole.to_pylist()]
            counts = Counter(rows_of)
            back = [i for i, gone in diff.surplus.items() for _ in range(counts[rows_of[i]] - gone)]
            surplus = whole.take(pa.array(list(diff.surplus), pa.int64()))
            returning = whole.take(pa.array(back, pa.int64()))
            source = pa.concat_tables(
                [
                    _with_action(_conform(surplus, schema), "delete"),
                    _with_action(_conform(returning, schema), "insert"),
                    _with_action(_conform(diff.additions, schema), "insert"),
                ]
            )
            deleting = f"{match} AND s.{_q(ACTION)} = 'delete'"
            self._merge_copies(table, source, deleting, schema, commit)
            return True
        values = data.select(names).to_pylist()
        starts = data.column(START_AT).to_pylist()
        copies: dict[Any, list[int]] = {}
        for i, row in enumerate(values):
            copies.setdefault(hashable(tuple(row.values())), []).append(i)
        removed = [copies[hashable(tuple(values[i].values()))] for i in diff.surplus]
        again: list[int] = []
        ends: list[dict[str, int] | None] = []
        for at, count in zip(removed, diff.surplus.values(), strict=True):
            at.sort(key=lambda i: (starts[i]["commit_lsn"], starts[i]["ordinal"]))
            again += at  # every current copy goes, and comes back: the oldest `count` ended
            ends += [_seq((point, _RECONCILED))] * count + [None] * (len(at) - count)
        kept = _conform(data.take(pa.array(again, pa.int64())), schema)
        kept = _with_column(kept, END_AT, pa.array(ends, SEQUENCE_TYPE))
        matches = data.select(names).take(pa.array(list(diff.surplus), pa.int64()))
        matches = _conform(matches, schema)
        added = _conform(diff.additions, _data_schema(schema))
        added = added.append_column(START_AT, _sequences(point, _RECONCILED + 1, len(added)))
        added = added.append_column(END_AT, pa.nulls(len(added), SEQUENCE_TYPE))
        source = pa.concat_tables(
            [
                _with_action(matches, "close"),
                _with_action(kept, "insert"),
                _with_action(_conform(added, schema), "insert"),
            ]
        )
        return self._merge_versions(table, source, match, schema, commit, replace=True)

    def _merge_copies(
        self,
        table: DeltaTable,
        source: pa.Table,
        match: str,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> None:
        """One MERGE of whole-row copies: "delete" rows remove every copy they match,
        "insert" rows are added."""
        (
            table.merge(
                source,
                match,
                source_alias="s",
                target_alias="t",
                merge_schema=not set(schema.names) <= set(self._schema(table).names),
                commit_properties=commit,
            )
            .when_matched_delete()
            .when_not_matched_insert(
                {_q(n): f"s.{_q(n)}" for n in schema.names},
                predicate=f"s.{_q(ACTION)} = 'insert'",
            )
            .execute()
        )

    def _merge_versions(
        self,
        table: DeltaTable,
        source: pa.Table,
        match: str,
        schema: pa.Schema,
        commit: CommitProperties,
        *,
        replace: bool = False,
    ) -> bool:
        """One MERGE into a history: "close" rows end (or, `replace`, delete: the copies are
        inserted again) the current versions they match; "insert" rows are added."""
        action = f"s.{_q(ACTION)}"
        predicate = f"{match} AND t.{_q(END_AT)} IS NULL AND {action} = 'close'"
        merger = table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            merge_schema=not set(schema.names) <= set(self._schema(table).names),
            commit_properties=commit,
        )
        if replace:
            merger = merger.when_matched_delete()
        else:
            merger = merger.when_matched_update({_q(END_AT): f"s.{_q(END_AT)}"})
        merger.when_not_matched_insert(
            {_q(n): f"s.{_q(n)}" for n in schema.names}, predicate=f"{action} = 'insert'"
        ).execute()
        return True

    def recorded_columns(self) -> tuple[ColumnInfo, ...] | None:
        table = self._open()
        return None if table is None else _recorded(self._last_commit(table))

    def copied_chunks(self, point: int) -> dict[str, int]:
        table = self._open()
        if table is None:
            return {}
        done = {}
        for commit in table.history():
            chunk = commit.get(CHUNK_KEY)
            if chunk is not None and commit.get(POINT_KEY) == str(int(point)):
                done[chunk] = int(commit.get(ROWS_KEY, 0))
        return done

    def mark(self, watermark: int) -> None:
        """Record `watermark` without data: an initial copy's point, from where the stream
        applies changes."""
        table = self._open()
        if table is None:
            raise TargetError(f"no Delta table at {self.path}")
        self._mark(table, CommitProperties(app_transactions=[Transaction(self.app_id, watermark)]))

    def _apply_bulk(
        self,
        table: DeltaTable | None,
        bulk: BulkMirror,
        rows: pa.Table,
        high: int,
        last: dict[str, Any],
    ) -> tuple[int, int, int]:
        """A batch `bulk_mirror` folded in Arrow: typed a column at a time, one MERGE."""
        shape = bulk.shape
        first = Change((0, 0), "insert", shape, None, None, None, (), rows.column("lsn")[0].as_py())
        source = self._check_source(table, [first])
        table, recorded = self._follow_columns(table, last, [shape])
        self._latest = shape
        evolution, before = self._schema_change(table, recorded.recorded, [first], source)
        schema = evolution.schema
        commit = self._commit(high, shape)
        columns = TextColumns(self._builder(shape).relation, self.registry, self.options, source)
        names = [c.name for c in shape.columns]
        try:
            upserts = columns.batch([bulk.upserts[n] for n in names], bulk.upsert_rows)
        except ValueOutOfRange as exc:
            if exc.row is None or bulk.upsert_lsns is None:
                raise
            raise exc.located(lsn=Lsn(bulk.upsert_lsns[exc.row].as_py() or 0)) from None
        deletes = pa.table(
            {
                n: columns.column(i, bulk.deletes[n])[0]
                for i, n in enumerate(names)
                if n in bulk.deletes
            }
        )
        data = pa.concat_tables(
            [
                _fit(pa.Table.from_batches([upserts]), schema).append_column(
                    ACTION, pa.repeat("upsert", bulk.upsert_rows)
                ),
                _fit(deletes, schema).append_column(ACTION, pa.repeat("delete", bulk.delete_rows)),
            ]
        )
        self._writing_since = time.perf_counter()
        if table is None:
            table = self._create(schema, source)
        elif evolution.widened or before:
            self._rewrite(table, schema, before)
            table = self._load()
        if not self._merge_mirror(table, shape, data, schema, commit):
            self._mark(table, commit)
        return bulk.upsert_rows, bulk.delete_rows, self._load().version()

    def _partial_commit(self, seq: Seq) -> CommitProperties:
        """The commit properties of a batch's commit that is not its last: the last change
        it holds (`_partial` reads it back)."""
        marker = json.dumps({"app_id": self.app_id, "commit_lsn": seq[0], "ordinal": seq[1]})
        return CommitProperties(custom_metadata={_PARTIAL: marker})

    def _last_commit(self, table: DeltaTable | None) -> dict[str, Any]:
        """The information (custom metadata included) of the latest commit that applied
        changes: maintenance (`maintain`) commits in between are passed over."""
        for commit in [] if table is None else table.history(_MAINTENANCE_COMMITS + 1):
            if _PARTIAL in commit or _COLUMNS in commit:
                return commit
        return {}

    def _commit(self, high: int, shape: Shape) -> CommitProperties:
        """A batch's last commit: the watermark, and the columns of the relation as of the
        batch's last change, with their types (the next batch tells added and retyped columns
        by them)."""
        columns = _recorded_columns(shape.columns)
        return CommitProperties(
            app_transactions=[Transaction(self.app_id, high)],
            custom_metadata={_COLUMNS: columns},
        )

    def _partial(self, last: dict[str, Any], watermark: int | None) -> Seq | None:
        """The last change in the table, when its latest commit is one of a batch that did
        not finish (a crash came before the batch's last commit)."""
        marker = last.get(_PARTIAL)
        if marker is None:
            return None
        data = json.loads(marker)
        seq = (int(data["commit_lsn"]), int(data["ordinal"]))
        if data.get("app_id") != self.app_id or (watermark is not None and seq[0] <= watermark):
            return None
        return seq

    def _mark(self, table: DeltaTable, commit: CommitProperties) -> None:
        """A commit that only records the watermark (an empty append)."""
        empty = self._schema(table).empty_table()
        write_deltalake(table, empty, mode="append", commit_properties=commit)

    def _check_source(self, table: DeltaTable | None, changes: list[Change]) -> str:
        """The source's name; refuses a batch of several tables, or of another table than
        the one the target was created for."""
        if self.source is None:  # with `source`, the caller routed the rows by relation OID
            names = {c.shape.name for c in changes}  # (a renamed table has two names)
            if len(names) > 1:
                raise TargetError(f"{self.path}: a batch holds several tables: {sorted(names)}")
            source = names.pop()
        else:
            source = self.source
        if table is not None:
            recorded = table.metadata().configuration.get("pgcdc.source")
            if recorded and recorded != source:
                raise TargetError(f"{self.path} was created for {recorded}, not {source}")
        return source

    # --- schema ------------------------------------------------------------------------

    def _builder(self, shape: Shape) -> ArrowBatchBuilder:
        builder = self._builders.get(shape)
        if builder is None:
            columns = tuple(
                Column(1 if c.key else 0, c.name, c.type_oid, c.type_modifier)
                for c in shape.columns
            )
            relation = Relation(
                shape.relation_oid, shape.schema, shape.table, shape.replica_identity, columns
            )
            builder = ArrowBatchBuilder(
                relation,
                self.registry,
                self.options,
                schema_name=shape.schema,
                table_name=shape.table,
            )
            self._builders[shape] = builder
        return builder

    def _shape_fields(self, shape: Shape) -> list[pa.Field]:
        schema = self._builder(shape).schema
        return [f for f in schema if f.name != UNCHANGED_TOAST_COLUMN]

    def _follow_columns(
        self, table: DeltaTable | None, last: dict[str, Any], shapes: list[Shape]
    ) -> tuple[DeltaTable | None, Naming]:
        """Columns followed by what they are (`pgcdc.targets.naming`): the target's columns
        renamed, and those whose names other columns took removed, in one commit without a
        watermark that records the columns as renamed (done again after a crash, it finds
        nothing to do)."""
        recorded = None if table is None else _recorded(last)
        existing = [] if table is None else _data_schema(self._schema(table)).names
        naming = plan_naming(recorded, existing, shapes)
        if table is None or not naming.changes_target:
            return table, naming
        data = self._query(table, "SELECT * FROM t", self._schema(table))
        data = data.drop_columns(list(naming.removed))
        data = data.rename_columns([naming.renames.get(n, n) for n in data.column_names])
        assert naming.recorded is not None
        metadata = {_COLUMNS: _recorded_columns(naming.recorded)}
        write_deltalake(
            table,
            data,
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
        log.info(
            "%s: columns renamed (%s) and removed (%s) as the source's",
            self.path,
            ", ".join(f"{a} to {b}" for a, b in naming.renames.items()) or "none",
            ", ".join(sorted(naming.removed)) or "none",
        )
        return self._load(), naming

    def _schema_change(
        self,
        table: DeltaTable | None,
        recorded: tuple[ColumnInfo, ...] | None,
        changes: list[Change],
        source: str,
    ) -> tuple[_Evolution, dict[str, tuple[ColumnFill, Shape]]]:
        """The schema the batch's rows need (`_evolve`), and the fills of the columns the
        target's rows need before the batch is written (`_resolve_fills`)."""
        current = None if table is None else self._schema(table)
        # the first change of each run of one shape: a shape may come back (a type changed
        # and changed back), and each time counts
        steps = [c for i, c in enumerate(changes) if i == 0 or c.shape != changes[i - 1].shape]
        shapes = [c.shape for c in steps]
        prior: list[str] | None = None
        prior_types: dict[str, tuple[int, int]] = {}
        if current is not None:
            if recorded is None:
                prior = [n for n in current.names if n not in (START_AT, END_AT)]
            else:
                prior = [c.name for c in recorded]
                prior_types = {
                    c.name: (c.type_oid, c.type_modifier) for c in recorded if c.type_oid
                }
        added = added_columns(prior, shapes)
        evolution = self._evolve(current, steps, source, set(added), prior_types)
        return evolution, self._resolve_fills(prior, added, evolution.retyped)

    def _evolve(
        self,
        current: pa.Schema | None,
        steps: list[Change],
        source: str,
        readded: set[str],
        prior_types: dict[str, tuple[int, int]],
    ) -> _Evolution:
        """The schema the batch's rows need, by the policy in the module docstring (`steps`:
        the first change of each run of one relation shape; `readded`: the columns that appear
        in the batch, some perhaps with a name the table holds from a column dropped before;
        `prior_types`: the source types of the columns as of the last batch applied).

        A column whose source type did not change since the last batch but which the table
        holds in another type is ahead of the batch: a crash came after the table was
        rewritten for a later type change and before that batch's commit, and the batch is
        replayed in smaller pieces. Its values in the batch are left null (`_type`): the
        type change comes again with a later batch, and fills every row."""
        types: dict[str, pa.DataType] = {} if current is None else {f.name: f.type for f in current}
        source_types = dict(prior_types)
        widened: set[str] = set()
        added: set[str] = set()
        retyped: dict[str, Change] = {}
        for change in steps:
            shape = change.shape
            for f in self._shape_fields(shape):
                if self.mode == "history" and f.name in (START_AT, END_AT):
                    raise TargetError(f"{source}.{f.name}: the name of a history column")
                column = next((c for c in shape.columns if c.name == f.name), None)
                previous = source_type = None  # (pgcdc's own columns have none)
                if column is not None:
                    source_type = (column.type_oid, column.type_modifier)
                    previous = source_types.get(f.name)
                    source_types[f.name] = source_type
                old = types.get(f.name)
                if old is None:
                    _check_storable(source, f)
                    types[f.name] = f.type
                    added.add(f.name)
                    continue
                if (
                    previous is not None
                    and previous != source_type
                    and not self._follows(previous, f.type)
                ):
                    pass  # the source changed the type, its values cannot be cast: retyped
                elif _reshaped(old, f.type):  # a composite's attributes added or dropped
                    types[f.name] = f.type
                    if f.name not in added:
                        widened.add(f.name)
                    continue
                elif _same(old, f.type) or _widens(f.type, old):
                    continue
                elif _widens(old, f.type):
                    _check_storable(source, f)
                    types[f.name] = f.type
                    if f.name not in added:
                        widened.add(f.name)
                    continue
                elif previous is not None and previous != source_type:
                    continue  # the table is ahead of the batch (see above)
                # else the same type, described anew (a composite's attribute renamed or
                # dropped): retyped, its values read again
                if f.name in readded or self._retypable(shape, f.name):
                    _check_storable(source, f)
                    types[f.name] = f.type
                    retyped[f.name] = change
                else:
                    codec = self.registry.get(_column(shape, f.name).type_oid)
                    raise SchemaChangeError(
                        table=source,
                        column=f.name,
                        old_type=str(_canonical(old)),
                        new_type=f"{_canonical(f.type)} ({codec.name})",
                        lsn=Lsn(change.lsn if change.lsn is not None else change.seq[0]),
                    )
        fields = [pa.field(name, t) for name, t in types.items()]
        if current is None and self.mode == "history":
            fields += [pa.field(START_AT, SEQUENCE_TYPE), pa.field(END_AT, SEQUENCE_TYPE)]
        return _Evolution(pa.schema(fields), widened - set(retyped), retyped)

    def _follows(self, previous: tuple[int, int], new: pa.DataType) -> bool:
        """Whether values of source type `previous` (OID, modifier) cast to `new` (the same
        Arrow type, or one widens the other)."""
        try:
            old = arrow_type(*previous, self.registry, self.options)
        except Exception:  # a type the registry no longer knows
            return False
        return _same(old, new) or _widens(old, new) or _widens(new, old)

    def _retypable(self, shape: Shape, column: str) -> bool:
        """Whether a column of `shape` whose type changed beyond a widening can take the
        source's values again, read per key (`FillSource`): not a key column, and the table
        has a key that is not the whole row."""
        return (
            self.fills is not None
            and bool(shape.key_names)
            and not shape.full_identity
            and column not in shape.key_names
        )

    def _stale(self, image: Image, column: str) -> bool:
        """Whether `image` was made before the last type change of `column` in this batch
        (its value is then the fill, the source's, as the table's rows are: the server
        rewrote the row without a change)."""
        since = self._retyped.get(column)
        return since is not None and image.seq is not None and image.seq < since

    def _rewrite(
        self, table: DeltaTable, schema: pa.Schema, fills: dict[str, tuple[ColumnFill, Shape]]
    ) -> None:
        """The whole table again, in one commit without a watermark: with wider column types,
        and each added or retyped column holding its fill (a history: in its current
        versions; a retyped column's ended versions keep their values cast to the new type,
        or null where they cannot be). Done again after a crash, it writes the same."""
        data = self._query(table, "SELECT * FROM t", self._schema(table))
        ended: dict[str, pa.Array] = {}
        for column in set(self._retyped) & set(data.column_names):
            old = data.column(column)
            if self.mode == "history":
                ended[column] = _cast_or_null(old, schema.field(column).type, self.path, column)
            data = data.drop_columns([column])
        data = _conform(data, schema)
        for column, (fill, shape) in fills.items():
            keys = data.select(list(shape.key_names)) if fill.rows is not None else data.select([])
            latest = self._builder(self._latest) if self._latest is not None else None
            values = fill_values(self._builder(shape), column, fill, keys, latest)
            if self.mode == "history":
                current = pc.is_null(data.column(END_AT))
                before = ended.get(column, pa.nulls(len(values), values.type))
                values = pc.if_else(current, values, before)
            data = _with_column(data, column, values)
        write_deltalake(table, data, mode="overwrite", schema_mode="overwrite")

    def _resolve_fills(
        self,
        prior: list[str] | None,
        added: dict[str, AddedColumn],
        retyped: dict[str, Change],
    ) -> dict[str, tuple[ColumnFill, Shape]]:
        """Ask for the fills of the batch's added columns (kept for typing the batch's older
        images) and the values of its retyped columns that were not added (read per key);
        the ones the target's rows (`prior`: its columns, None for no table) need now."""
        for column, found in added.items():
            fill = self._fill_of(found.shape, column, appended=found.appended)
            self._batch_fills[column] = (fill, found.shape)
        for column, change in retyped.items():
            shape = change.shape
            appeared = added.get(column)
            if appeared is not None and _same_type(appeared.shape, shape, column):
                continue  # added (again) in this batch, in the type it ends with: its fill
            if self.fills is None or not self._retypable(shape, column):
                raise TargetError(
                    f"{shape.name}.{column}: its type changed within the batch, after it was "
                    "added, and its values cannot be read again by key (a key column, or a "
                    "table without a key); recopy the table"
                )
            self._batch_fills[column] = (self._fill_of(shape, column, appended=False), shape)
        self._retyped = {column: change.seq for column, change in retyped.items()}
        if prior is None:
            return {}
        return {c: f for c, f in self._batch_fills.items() if c not in prior or c in retyped}

    def _fill_of(self, shape: Shape, column: str, *, appended: bool) -> ColumnFill:
        """`column`'s fill for the rows before `shape`. Values read in a type the source
        changed the column to since: kept (those `shape`'s type can hold) when the target
        keeps values through that change, else NULL (the change rewrites the column with
        the source's values when the stream brings it)."""
        if self.fills is None:
            return ColumnFill()
        fill = self.fills(shape, column, appended=appended)
        later = fill.later_type
        if later is not None and not self._follows(later, self._shape_type(shape, column)):
            return ColumnFill()
        return fill

    def _shape_type(self, shape: Shape, column: str) -> pa.DataType:
        builder = self._builder(shape)
        names = [c.name for c in builder.relation.columns]
        return builder.schema.field(names.index(column)).type

    # --- typing ------------------------------------------------------------------------

    def _type(self, images: Sequence[Image], schema: pa.Schema) -> pa.Table:
        """Images (text) as typed rows of `schema`, in order; missing values null."""
        groups: dict[Shape, list[int]] = {}
        for i, image in enumerate(images):
            groups.setdefault(image.shape, []).append(i)
        parts: list[pa.Table] = [schema.empty_table()]
        order: list[int] = []
        for shape, positions in groups.items():
            builder = self._builder(shape)
            for i in positions:
                builder.append(_tuple(images[i], shape), images[i].lsn)
            part = _fit(pa.Table.from_batches([builder.flush()]), schema)
            parts.append(self._fill_older(part, shape, [images[i] for i in positions]))
            order.extend(positions)
        data = pa.concat_tables(parts)
        if order != sorted(order):
            inverse = [0] * len(order)
            for at, i in enumerate(order):
                inverse[i] = at
            data = data.take(pa.array(inverse, pa.int64()))
        return data

    def _fold(self, run: list[Change]) -> Plan:
        shape = next((c.shape for c in run if c.op != "truncate"), run[0].shape)
        if shape.full_identity:
            return fold_multiset(run)
        return fold_mirror(run) if self.mode == "mirror" else fold_history(run)

    def _type_plan(self, plan: Plan, schema: pa.Schema) -> pa.Table:
        """The plan's merge source without the unchanged TOAST values still to be read (for
        a multiset: the versions, then the key image of each key with removals)."""
        data = pa.schema([f for f in schema if f.name not in (START_AT, END_AT)])
        if isinstance(plan, MultisetPlan):
            images = [v.image for v in plan.versions] + [plan.images[k] for k in plan.removals]
            typed = self._type(images, data)
            starts: list[dict[str, int] | None] = [_seq(v.start) for v in plan.versions]
            starts += [None] * len(plan.removals)
            ends = [_seq(v.end) for v in plan.versions] + [None] * len(plan.removals)
            typed = typed.append_column(START_AT, pa.array(starts, SEQUENCE_TYPE))
            return typed.append_column(END_AT, pa.array(ends, SEQUENCE_TYPE))
        if isinstance(plan, MirrorPlan):
            images = [*plan.upserts.values(), *plan.deletes.values()]
            actions = ["upsert"] * len(plan.upserts) + ["delete"] * len(plan.deletes)
            typed = self._type(images, data)
            return typed.append_column(ACTION, pa.array(actions, pa.string()))
        closes = list(plan.closes.values())
        images = [image for _, image in closes] + [v.image for v in plan.versions]
        typed = self._type(images, data)
        starts = [None] * len(closes)
        starts += [_seq(v.start) for v in plan.versions]
        ends = [_seq(seq) for seq, _ in closes] + [_seq(v.end) for v in plan.versions]
        actions = ["close"] * len(closes) + ["insert"] * len(plan.versions)
        typed = typed.append_column(START_AT, pa.array(starts, SEQUENCE_TYPE))
        typed = typed.append_column(END_AT, pa.array(ends, SEQUENCE_TYPE))
        return typed.append_column(ACTION, pa.array(actions, pa.string()))

    def _fill_older(self, part: pa.Table, shape: Shape, images: list[Image]) -> pa.Table:
        """Typed rows of `shape` with the columns added after it holding their fill, and
        the images made before a column's type change holding its fill in that column."""
        names = {c.name for c in shape.columns}
        for column, (fill, owner) in self._batch_fills.items():
            if column not in part.column_names:
                continue
            if column in names:
                stale = [self._stale(image, column) for image in images]
                if not any(stale):
                    continue
            texts = fill_texts(fill, owner.key_names, [image.values for image in images])
            builder = self._builder(owner)
            index = [c.name for c in owner.columns].index(column)
            encoded = [None if t is None else t.encode() for t in texts]
            values = fill_array(builder, index, encoded, fill)
            if column in names:
                current = part.column(column)
                values = pc.if_else(pa.array(stale), values.cast(current.type), current)
            part = _with_column(part, column, values)
        return part

    # --- unchanged TOAST values from the target -----------------------------------------

    def _fill(
        self,
        table: DeltaTable,
        data: pa.Table,
        images: Sequence[Image],
        offset: int,
        lookups: dict[Key, Image],
        schema: pa.Schema,
    ) -> pa.Table:
        """`data` (rows `offset`… are `images`) with each `missing` value taken from the
        target's current row of its key; a key the target lacks leaves null."""
        present = set(self._schema(table).names)  # a column added by this batch has no value
        columns = sorted({c for image in images for c in image.missing if c in present})
        if not columns or not lookups:
            return data
        keys = list(lookups)
        key_names = list(lookups[keys[0]].shape.key_names)
        if not present.issuperset(key_names):
            return data
        typed_keys = self._type([lookups[k] for k in keys], _pick(schema, key_names))
        typed_rows = typed_keys.select(key_names).to_pylist()
        by_text = {k: hashable(tuple(r.values())) for k, r in zip(keys, typed_rows, strict=True)}
        current = self._current(table, key_names, columns, typed_keys, schema)
        index = {
            hashable(tuple(r[n] for n in key_names)): i
            for i, r in enumerate(current.select(key_names).to_pylist())
        }
        for column in columns:
            positions: list[int | None] = [None] * data.num_rows
            for i, image in enumerate(images):
                key = image.missing.get(column)
                if key is not None:
                    positions[offset + i] = index.get(by_text[key])
            if all(p is None for p in positions):
                continue
            at = data.schema.get_field_index(column)
            values = data.column(at).combine_chunks()
            found = current.column(column).take(pa.array(positions, pa.int64()))
            merged = pa.concat_arrays([values, found.combine_chunks().cast(values.type)])
            n = data.num_rows
            pick = [i if p is None else n + i for i, p in enumerate(positions)]
            data = data.set_column(at, column, merged.take(pa.array(pick, pa.int64())))
        return data

    def _current(
        self,
        table: DeltaTable,
        key_names: list[str],
        columns: list[str],
        typed_keys: pa.Table,
        schema: pa.Schema,
    ) -> pa.Table:
        """The target's current rows of the keys: key columns and `columns`."""
        wanted = list(dict.fromkeys([*key_names, *columns]))
        conditions = []
        if self.mode == "history":
            conditions.append(f"t.{_q(END_AT)} IS NULL")
        if key_names and typed_keys.num_rows <= _MAX_IN_LIST:  # narrows; matched exactly later
            first = typed_keys.column(key_names[0])
            literals = _literals(first)
            if literals is not None:
                narrow = f"t.{_q(key_names[0])} IN ({', '.join(literals)})"
                if first.null_count:  # a key of identity FULL may hold NULL
                    narrow = f"({narrow} OR t.{_q(key_names[0])} IS NULL)"
                conditions.append(narrow)
        sql = f"SELECT {', '.join('t.' + _q(c) for c in wanted)} FROM t"
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        return self._query(table, sql, _pick(schema, wanted))

    # --- writing -----------------------------------------------------------------------

    def _check_new_key(self, table: DeltaTable, shape: Shape, seq: Seq) -> None:
        """Rows are matched by `shape`'s key from `seq` on, a key other than before (a new
        primary key or replica identity index). The source has a value in each of its
        columns in every row; a row of the target without one (a column added with values
        read per key, missing for a row deleted or re-keyed since) would never be matched
        again: stop rather than keep it, or insert its next version beside it."""
        if shape.full_identity or not shape.key_names or self.mode == "changelog":
            return
        if not set(self._schema(table).names).issuperset(shape.key_names):
            return  # a key column new to the table: added by this batch, with its values
        nulls = " OR ".join(f"{_q(k)} IS NULL" for k in shape.key_names)
        current = f" AND {_q(END_AT)} IS NULL" if self.mode == "history" else ""
        counted = self._query(
            table,
            f"SELECT count(*) AS n FROM t WHERE ({nulls}){current}",
            pa.schema([("n", pa.int64())]),
        )
        missing = counted.column("n")[0].as_py()
        if missing:
            raise TargetError(
                f"{shape.name}: rows are matched by ({', '.join(shape.key_names)}) from "
                f"{describe_seq(seq)} on, and {missing} row(s) of the target hold no value "
                "in it (values read per key from the source, for rows changed or deleted "
                "since): their later changes could not find them; recopy the table"
            )

    def _key_match(self, shape: Shape | None) -> list[str]:
        if shape is None or not shape.key_names:
            return ["FALSE"]  # no identity: rows are only ever inserted
        if shape.full_identity:
            return [f"(t.{_q(k)} IS NOT DISTINCT FROM s.{_q(k)})" for k in shape.key_names]
        return [f"t.{_q(k)} = s.{_q(k)}" for k in shape.key_names]

    def _write_mirror(
        self,
        table: DeltaTable,
        plan: MirrorPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One commit: an overwrite after a truncation, else a MERGE. Whether it wrote."""
        images = list(plan.upserts.values())
        data = self._fill(table, data, images, 0, plan.lookups, schema)
        current = self._schema(table)
        if plan.truncated:
            write_deltalake(
                table,
                _conform(data, schema),
                mode="overwrite",
                schema_mode=None if _same_schema(current, schema) else "overwrite",
                commit_properties=commit,
            )
            return True
        if data.num_rows == 0:
            return False
        shape = (images or list(plan.deletes.values()))[0].shape
        return self._merge_mirror(table, shape, data, schema, commit)

    def _merge_mirror(
        self,
        table: DeltaTable,
        shape: Shape,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """`data` (with its action column) merged by key. Whether it wrote."""
        current = self._schema(table)
        if not shape.key_names:
            return self._append_rows(table, data, schema, commit)
        match = self._key_match(shape)
        before = table.version()
        columns = {_q(n): f"s.{_q(n)}" for n in schema.names}
        (
            table.merge(
                data,
                " AND ".join(match),
                source_alias="s",
                target_alias="t",
                merge_schema=not set(schema.names) <= set(current.names),
                commit_properties=commit,
            )
            .when_matched_update(columns, predicate=f"s.{_q(ACTION)} = 'upsert'")
            .when_matched_delete(predicate=f"s.{_q(ACTION)} = 'delete'")
            .when_not_matched_insert(columns, predicate=f"s.{_q(ACTION)} = 'upsert'")
            .execute()
        )
        return self._load().version() != before

    def _write_history(
        self,
        table: DeltaTable,
        plan: HistoryPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One MERGE: "close" rows end the current version of their key (one that started
        before), "insert" rows add versions not already there; after a truncation, the
        versions no row matched end at it."""
        images = [v.image for v in plan.versions]
        data = self._fill(table, data, images, len(plan.closes), plan.lookups, schema)
        if data.num_rows == 0 and plan.truncated_at is None:
            return False
        shapes = [image.shape for _, image in plan.closes.values()] + [i.shape for i in images]
        shape = shapes[0] if shapes else None
        if shape is not None and not shape.key_names and plan.truncated_at is None:
            return self._append_rows(table, data, schema, commit)
        match = self._key_match(shape)
        action = f"s.{_q(ACTION)}"
        start, end = f"t.{_q(START_AT)}", f"t.{_q(END_AT)}"
        closing = f"{action} = 'close' AND {end} IS NULL AND {_before(start, f's.{_q(END_AT)}')}"
        same_start = (
            f"{start}['commit_lsn'] = s.{_q(START_AT)}['commit_lsn'] AND "
            f"{start}['ordinal'] = s.{_q(START_AT)}['ordinal']"
        )
        inserting = f"{action} = 'insert' AND {same_start}"
        if match == ["FALSE"]:
            predicate = "FALSE"
        else:
            predicate = " AND ".join([*match, f"(({closing}) OR ({inserting}))"])
        current = self._schema(table)
        before = table.version()
        merger = (
            table.merge(
                data,
                predicate,
                source_alias="s",
                target_alias="t",
                merge_schema=not set(schema.names) <= set(current.names),
                commit_properties=commit,
            )
            .when_matched_update({_q(END_AT): f"s.{_q(END_AT)}"}, predicate=f"{action} = 'close'")
            .when_not_matched_insert(
                {_q(n): f"s.{_q(n)}" for n in schema.names}, predicate=f"{action} = 'insert'"
            )
        )
        if plan.truncated_at is not None:
            at = _seq_sql(plan.truncated_at)
            merger = merger.when_not_matched_by_source_update(
                {_q(END_AT): at}, predicate=f"{end} IS NULL AND {_before(start, at)}"
            )
        merger.execute()
        return self._load().version() != before

    def _write_multiset(
        self,
        table: DeltaTable,
        plan: MultisetPlan,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """One commit for a REPLICA IDENTITY FULL table, whose rows are a multiset. Keys that
        lose copies of the target's own are read, then replaced: every current copy of the
        key is deleted and what remains inserted again (a mirror: the copies left; a
        history: the current versions, the oldest ones ended at the removals' sequences), as
        MERGE cannot delete some of several identical rows. Added copies are inserted.
        After a truncation, a mirror is overwritten with the copies added since."""
        history = self.mode == "history"
        count = len(plan.versions)
        added, keys = data.slice(0, count), data.slice(count)
        if not history:
            added = added.filter(pc.is_null(added.column(END_AT))).drop_columns([START_AT, END_AT])
            keys = keys.drop_columns([START_AT, END_AT])
        if plan.truncated_at is not None and not history:
            write_deltalake(
                table,
                _conform(added, schema),
                mode="overwrite",
                schema_mode=None if _same_schema(self._schema(table), schema) else "overwrite",
                commit_properties=commit,
            )
            return True
        kept = self._remaining_copies(table, plan, keys, schema)
        if history and plan.truncated_at is not None and kept.num_rows:
            open_ = pc.is_null(kept.column(END_AT))
            ends = pc.if_else(
                open_, pa.scalar(_seq(plan.truncated_at), SEQUENCE_TYPE), kept.column(END_AT)
            )
            kept = _with_column(kept, END_AT, ends)
        source = pa.concat_tables(
            [
                _conform(keys, schema).append_column(ACTION, pa.repeat("delete", keys.num_rows)),
                _conform(added, schema).append_column(ACTION, pa.repeat("insert", added.num_rows)),
                _conform(kept, schema).append_column(ACTION, pa.repeat("insert", kept.num_rows)),
            ]
        )
        if source.num_rows == 0 and plan.truncated_at is None:
            return False
        shape = next(iter(plan.images.values())).shape if plan.images else None
        match = " AND ".join([*self._key_match(shape), f"s.{_q(ACTION)} = 'delete'"])
        if history:
            match += f" AND t.{_q(END_AT)} IS NULL"
        current = self._schema(table)
        before = table.version()
        merger = (
            table.merge(
                source,
                match,
                source_alias="s",
                target_alias="t",
                merge_schema=not set(schema.names) <= set(current.names),
                commit_properties=commit,
            )
            .when_matched_delete()
            .when_not_matched_insert(
                {_q(n): f"s.{_q(n)}" for n in schema.names},
                predicate=f"s.{_q(ACTION)} = 'insert'",
            )
        )
        if history and plan.truncated_at is not None:
            at = _seq_sql(plan.truncated_at)
            end, start = f"t.{_q(END_AT)}", f"t.{_q(START_AT)}"
            merger = merger.when_not_matched_by_source_update(
                {_q(END_AT): at}, predicate=f"{end} IS NULL AND {_before(start, at)}"
            )
        merger.execute()
        return self._load().version() != before

    def _remaining_copies(
        self, table: DeltaTable, plan: MultisetPlan, keys: pa.Table, schema: pa.Schema
    ) -> pa.Table:
        """The target's current copies of each key with removals, minus the removed ones (a
        history: all of them, the oldest ended at the removals' sequences). Raises when the
        target holds fewer copies than the changes remove."""
        history = self.mode == "history"
        names = list(next(iter(plan.images.values())).shape.key_names) if plan.removals else []
        wanted = [*names, START_AT] if history else names
        if not plan.removals:
            return _pick(schema, wanted).empty_table() if history else schema.empty_table()
        columns = [f.name for f in schema if f.name not in (START_AT, END_AT)]
        extra = [START_AT, END_AT] if history else []
        current = self._current(table, names, [*columns, *extra], keys.select(names), schema)
        by_key: dict[Any, list[int]] = {}
        for i, row in enumerate(current.select(names).to_pylist()):
            by_key.setdefault(hashable(tuple(row.values())), []).append(i)
        take: list[int] = []
        ends: list[dict[str, int] | None] = []
        starts = current.column(START_AT).to_pylist() if history else None
        for typed, (key, removals) in zip(
            keys.select(names).to_pylist(), plan.removals.items(), strict=True
        ):
            copies = by_key.get(hashable(tuple(typed.values())), [])
            if len(copies) < len(removals):
                image = plan.images[key]
                raise TargetError(
                    f"{image.shape.name}: {len(removals)} change(s) up to "
                    f"{describe_seq(removals[-1])} remove a row the target holds "
                    f"{len(copies)} time(s): "
                    f"({', '.join(f'{k}={v}' for k, v in image.values.items())})"
                )
            if history:
                assert starts is not None
                copies.sort(key=lambda i: (starts[i]["commit_lsn"], starts[i]["ordinal"]))
                take += copies
                ends += [_seq(seq) for seq in removals] + [None] * (len(copies) - len(removals))
            else:
                take += copies[len(removals) :]
        kept = current.take(pa.array(take, pa.int64()))
        if history:
            kept = _with_column(kept, END_AT, pa.array(ends, SEQUENCE_TYPE))
        return kept

    def _append_rows(
        self,
        table: DeltaTable,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> bool:
        """Rows of a table without identity: nothing to match, so an append (a MERGE would
        compare every new row with every row of the table)."""
        current = self._schema(table)
        write_deltalake(
            table,
            _conform(data, schema),
            mode="append",
            schema_mode=None if set(schema.names) <= set(current.names) else "merge",
            commit_properties=commit,
        )
        return True


def _tuple(image: Image, shape: Shape) -> TupleData:
    """The image as the TupleData of `shape`: text, NULL, or unchanged TOAST for `missing`."""
    values, missing = image.values, image.missing
    kinds = bytearray()
    cells: list[bytes | None] = []
    for column in shape.columns:
        name = column.name
        value = values.get(name)
        if name in missing:
            kinds.append(_U)
            cells.append(None)
        elif value is None:
            kinds.append(_N)
            cells.append(None)
        else:
            kinds.append(_T)
            cells.append(value.encode())
    return TupleData(bytes(kinds), tuple(cells))


def _seq(seq: Seq | None) -> dict[str, int] | None:
    return None if seq is None else {"commit_lsn": seq[0], "ordinal": seq[1]}


def _recorded_columns(columns: Iterable[ColumnInfo]) -> str:
    """The `_COLUMNS` commit metadata: [name, type OID, type modifier, key, attnum] per
    column."""
    return json.dumps([[c.name, c.type_oid, c.type_modifier, c.key, c.attnum] for c in columns])


def _recorded(last: dict[str, Any]) -> tuple[ColumnInfo, ...] | None:
    """The relation's columns recorded with the last batch (None: not recorded). Older
    tables recorded fewer fields (names only, then no key flag, then no attnum)."""
    recorded = json.loads(last.get(_COLUMNS) or "null")
    if recorded is None:
        return None
    columns = []
    for entry in recorded:
        fields: list[Any] = [entry] if isinstance(entry, str) else list(entry)
        name, type_oid, modifier, key, attnum = [*fields, 0, -1, None, 0][:5]
        columns.append(ColumnInfo(str(name), int(type_oid), int(modifier), bool(key), int(attnum)))
    return tuple(columns)


def _recorded_keys(recorded: tuple[ColumnInfo, ...] | None) -> tuple[str, ...] | None:
    """The key columns recorded with the last batch (None: not recorded)."""
    if recorded is None or not recorded or any(c.type_oid == 0 for c in recorded):
        return None
    return tuple(c.name for c in recorded if c.key)


def _renamed(changes: list[Change], naming: Naming) -> list[Change]:
    """The changes with their columns named as `naming` says (a value left out, gone)."""
    if all(naming.shape(s) is s for s in naming.names):
        return changes
    shapes = {shape: naming.shape(shape) for shape in naming.names}
    out = []
    for change in changes:
        names = naming.names[change.shape]
        if shapes[change.shape] is change.shape:
            out.append(change)
            continue
        unchanged = tuple(n for c in change.unchanged if (n := names.get(c, c)) is not None)
        out.append(
            replace(
                change,
                shape=shapes[change.shape],
                key=_rename(change.key, names),
                before=_rename(change.before, names),
                after=_rename(change.after, names),
                unchanged=unchanged,
            )
        )
    return out


def _rename(
    values: dict[str, str | None] | None, names: dict[str, str | None]
) -> dict[str, str | None] | None:
    """A row image's values under their new names (None: left out)."""
    if values is None:
        return None
    return {new: v for k, v in values.items() if (new := names.get(k, k)) is not None}


def _same_type(a: Shape, b: Shape, column: str) -> bool:
    """Whether `column` has the same type (and modifier) in shapes `a` and `b`."""
    x, y = _column(a, column), _column(b, column)
    return x.type_oid == y.type_oid and x.type_modifier == y.type_modifier


def _cast_or_null(
    values: pa.ChunkedArray, to: pa.DataType, path: str, column: str
) -> pa.ChunkedArray:
    """A retyped column's values in a history's ended versions: cast to the new type, or
    null (with a warning) when any of them cannot be."""
    try:
        return values.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        log.warning(
            "%s: column %s changed its type to %s; its values in the versions that ended "
            "before cannot be cast (%s) and are null there",
            path,
            column,
            to,
            str(exc).splitlines()[0],
        )
        return pa.chunked_array([pa.nulls(len(values), to)])


def _with_action(table: pa.Table, action: str) -> pa.Table:
    return table.append_column(ACTION, pa.repeat(pa.scalar(action), len(table)))


def _data_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` without a history's version columns."""
    return pa.schema([f for f in schema if f.name not in (START_AT, END_AT)])


def _sequences(point: int, first: int, count: int) -> pa.Array:
    """(point, first), (point, first + 1), … as sequence structs."""
    return pa.array([_seq((point, first + i)) for i in range(count)], SEQUENCE_TYPE)


def _with_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """`table` with column `name` replaced by `values` (cast to the column's type)."""
    at = table.schema.get_field_index(name)
    field = table.schema.field(at)
    return table.set_column(at, field, values.cast(field.type))


def _pick(schema: pa.Schema, names: Iterable[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


def _same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    return a.names == b.names and all(_same(x.type, y.type) for x, y in zip(a, b, strict=True))


def _column(shape: Shape, name: str) -> Any:
    return next(c for c in shape.columns if c.name == name)


def _check_storable(source: str, f: pa.Field) -> None:
    try:
        deltalake.Schema.from_arrow(pa.schema([f]))
    except Exception as exc:
        raise TargetError(
            f"{source}.{f.name}: Delta Lake cannot store {f.type} ({str(exc).splitlines()[0]});"
            " map the type to a string (MappingOptions time='string', interval='string')"
        ) from None


def _literals(column: pa.ChunkedArray) -> list[str] | None:
    """SQL literals of an integer or string key column's values; None for other types."""
    values = [v for v in column.to_pylist() if v is not None]
    if pa.types.is_integer(column.type):
        return [str(int(v)) for v in values] or ["NULL"]
    if pa.types.is_string(column.type):
        return ["'" + v.replace("'", "''") + "'" for v in values] or ["NULL"]
    return None


def _source_of(rows: pa.Table) -> str:
    if "schema" in rows.column_names and "table" in rows.column_names and rows.num_rows:
        schema, table = rows.column("schema")[0].as_py(), rows.column("table")[0].as_py()
        if table is not None:
            return f"{schema}.{table}"
    return ""
