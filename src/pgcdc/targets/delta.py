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

import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA, ChangeBatch, ColumnInfo, Shape
from pgcdc.errors import TargetError
from pgcdc.protocol import Relation
from pgcdc.targets._arrow import ACTION, conform, same_schema
from pgcdc.targets._meta import (
    CHUNK_KEY,
    COLUMNS,
    POINT_KEY,
    ROWS_KEY,
    batch_commit,
    last_commit,
    latest_columns,
    partial_commit,
    partial_seq,
    recorded,
    recorded_columns,
    recorded_keys,
    unapplied,
)
from pgcdc.targets._mor import logical_row_count
from pgcdc.targets._resync import Reconciler
from pgcdc.targets._schedule import PassSchedule
from pgcdc.targets._table import TableIO
from pgcdc.targets._typing import BatchTyping, bulk_history_rows, bulk_mirror_rows
from pgcdc.targets.added_columns import FillSource
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
from pgcdc.targets.bulk import BulkHistory, BulkMirror, bulk_history, bulk_mirror
from pgcdc.targets.fold import (
    Change,
    MirrorPlan,
    MultisetPlan,
    changes_from_envelope,
    segments,
)
from pgcdc.targets.naming import Naming
from pgcdc.targets.schema import Evolution, plan_evolution, plan_reconcile
from pgcdc.types.arrow import UNCHANGED_TOAST_COLUMN, ArrowBatchBuilder
from pgcdc.types.mapping import DEFAULT_OPTIONS, MappingOptions
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeRegistry

__all__ = ["CHUNK_KEY", "POINT_KEY", "DeltaTarget"]

#: How often (in table versions) `maintain` looks for small files to compact, how many make
#: a compaction worth it, and how often (versions, or seconds of this process) it vacuums.
COMPACT_EVERY = 50
SMALL_FILES = 16
VACUUM_EVERY = 500
VACUUM_SECONDS = 300.0
MERGE_ON_READ_EVERY = 25
#: Attempts at appending a copy's chunk (`DeltaTarget.write_chunk`).
CHUNK_ATTEMPTS = 3


class DeltaTarget(Target):
    """One Delta table at `path`, kept from one source table's change envelopes.

    `app_id` names the writer in the table's application transactions (the watermark); two
    pipelines writing one table need different ones. `source` ("schema.table") names the
    table in messages and is stored with the table as ``pgcdc.source``. The table stays open
    between batches (its log read from where it was); everything a batch needs beyond it is
    the batch's own (`BatchTyping`)."""

    def __init__(
        self,
        path: str,
        mode: Mode,
        *,
        app_id: str,
        registry: TypeRegistry = DEFAULT_REGISTRY,
        options: MappingOptions = DEFAULT_OPTIONS,
        storage_options: dict[str, str] | None = None,
        properties: dict[str, str] | None = None,
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
        self.properties = properties
        self.io = TableIO(self.path, mode, storage_options, properties)
        self.schedule = PassSchedule(VACUUM_SECONDS)
        self.writer = Reconciler(self.io, mode)

    def __repr__(self) -> str:
        return f"DeltaTarget({self.path!r}, {self.mode!r}, app_id={self.app_id!r})"

    @property
    def spec(self) -> TargetSpec:
        return TargetSpec(self.path, self.mode, "delta", self.storage_options, self.properties)

    @property
    def watermark(self) -> int | None:
        """The highest commit LSN applied (None: nothing applied yet)."""
        table = self.io.open()
        return None if table is None else self.io.watermark(table, self.app_id)

    @property
    def exists(self) -> bool:
        """Whether the table was created (by a first apply with data)."""
        return self.io.exists

    def to_arrow(self) -> pa.Table:
        """The table's current contents (row order unspecified)."""
        table = self.io.open()
        if table is None:
            raise TargetError(f"no Delta table at {self.path}")
        return self.io.read_all(table)

    # --- apply -------------------------------------------------------------------------

    def apply(self, rows: pa.Table | ChangeBatch) -> ApplyResult:
        """Applies one batch of one source table (envelope rows, or a `ChangeBatch`; any
        order).

        Rows at or below the watermark are skipped; the rest are written with the new
        watermark in the same (last) commit. A batch that raises writes nothing."""
        started = time.perf_counter()
        table = self.io.open()
        watermark = None if table is None else self.io.watermark(table, self.app_id)
        last = last_commit(table, self.path)
        partial = partial_seq(last, self.app_id, watermark)
        if isinstance(rows, ChangeBatch):
            first = rows.first_commit_lsn
            replay = watermark is not None and first is not None and first <= watermark
            if replay or partial is not None or self.mode == "changelog":
                rows = rows.envelope()  # (what a replay skips is filtered there)
        total = rows.num_rows
        if isinstance(rows, pa.Table):
            rows = unapplied(rows, watermark, partial)
        skipped = total - rows.num_rows
        if rows.num_rows == 0:
            return ApplyResult(0, skipped, 0, 0, watermark, None)
        high = (
            rows.last_commit_lsn
            if isinstance(rows, ChangeBatch)
            else pc.max(rows.column("commit_lsn")).as_py()
        )
        typing = BatchTyping(self.registry, self.options, self.mode, self.fills)
        if self.mode == "changelog":
            assert isinstance(rows, pa.Table)
            commit = CommitProperties(
                app_transactions=[Transaction(self.app_id, high)],
                custom_metadata=_last_columns(rows),
            )
            upserts, deletes, version, writing = self._append(table, rows, commit)
        elif (bulk := self._bulk(rows)) is not None:
            upserts, deletes, version, writing = self._apply_bulk(typing, table, bulk, high, last)
        else:
            if isinstance(rows, ChangeBatch):
                rows = rows.envelope()
            changes = changes_from_envelope(rows)
            if not changes:  # only logical messages: nothing to write
                return ApplyResult(0, skipped, 0, 0, watermark, None)
            upserts, deletes, version, writing = self._apply_changes(
                typing, table, changes, high, last
            )
        self.io.wrote(self.app_id, version, high)
        done = time.perf_counter()
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
    ) -> tuple[int, int, int, float]:
        writing = time.perf_counter()
        if rows.column_names == ENVELOPE_ARROW_SCHEMA.names:
            rows = conform(rows, ENVELOPE_ARROW_SCHEMA)
        if table is None:
            table = self.io.create(rows.schema, self.source or _source_of(rows))
        elif not same_schema(self.io.schema(table), rows.schema):
            rows = conform(rows, self.io.schema(table))
        write_deltalake(table, rows, mode="append", commit_properties=commit)
        return rows.num_rows, 0, table.version(), writing

    def _prepare(
        self,
        typing: BatchTyping,
        table: DeltaTable | None,
        changes: list[Change],
        last: dict[str, Any],
    ) -> tuple[DeltaTable | None, list[Change], Naming, Evolution, dict[str, Any], str]:
        """What a batch needs before its rows are typed: the target's columns followed to
        the batch's (renamed, removed), the batch's changes named so, the schema it needs,
        and the fills the table's rows need before it is written."""
        source = self._check_source(table, changes)
        shapes = list(dict.fromkeys(c.shape for c in changes))
        table, naming = self.writer.follow_columns(table, last, shapes)
        changes = _renamed(changes, naming)
        typing.latest = changes[-1].shape
        current = None if table is None else self.io.schema(table)
        evolution = plan_evolution(
            current, naming.recorded, changes, source, self.mode, typing, _check_storable
        )
        before = typing.resolve_fills(evolution.prior, evolution.added, evolution.retyped)
        return table, changes, naming, evolution, before, source

    def _apply_changes(
        self,
        typing: BatchTyping,
        table: DeltaTable | None,
        changes: list[Change],
        high: int,
        last: dict[str, Any],
    ) -> tuple[int, int, int, float]:
        table, changes, naming, evolution, before, source = self._prepare(
            typing, table, changes, last
        )
        schema = evolution.schema
        commit = batch_commit(self.app_id, high, changes[-1].shape)
        runs = list(segments(changes))
        # Everything that can fail on the data (typing, the policy on out-of-range values)
        # happens before the first write.
        plans = [typing.fold(run) for run in runs]
        typed = [typing.type_plan(plan, schema) for plan in plans]
        writing = time.perf_counter()
        if table is None:
            table = self.io.create(schema, source)
        elif evolution.widened or before:
            self.writer.rewrite(table, schema, before, typing)
        upserts = deletes = 0
        keys = recorded_keys(naming.recorded)
        writer = self.writer
        for i, (plan, data, run) in enumerate(zip(plans, typed, runs, strict=True)):
            final = i == len(plans) - 1
            shape = run[0].shape
            if keys is not None and shape.key_names != keys:
                writer.check_new_key(table, shape, run[0].seq)
            keys = shape.key_names
            props = commit if final else partial_commit(self.app_id, run[-1].seq)
            if isinstance(plan, MultisetPlan):
                written = writer.write_multiset(table, plan, data, schema, props)
                upserts += len(plan.versions)
                deletes += plan.deletes
            elif isinstance(plan, MirrorPlan):
                written = writer.write_mirror(typing, table, plan, data, schema, props)
                upserts += len(plan.upserts)
                deletes += len(plan.deletes)
            else:
                written = writer.write_history(typing, table, plan, data, schema, props)
                upserts += len(plan.versions)
                deletes += plan.deletes
            if final and not written:  # a merge that changed nothing makes no commit
                self.io.mark(table, commit)
        return upserts, deletes, table.version(), writing

    def _bulk(self, rows: pa.Table | ChangeBatch) -> BulkMirror | BulkHistory | None:
        if self.mode == "mirror":
            return bulk_mirror(rows)
        return bulk_history(rows) if self.mode == "history" else None

    def _apply_bulk(
        self,
        typing: BatchTyping,
        table: DeltaTable | None,
        bulk: BulkMirror | BulkHistory,
        high: int,
        last: dict[str, Any],
    ) -> tuple[int, int, int, float]:
        """A batch folded in Arrow (`pgcdc.targets.bulk`): typed a column at a time, one
        MERGE (or an append)."""
        shape = bulk.shape
        first = Change((0, 0), "insert", shape, None, None, None, (), bulk.first_lsn)
        table, _, _, evolution, before, source = self._prepare(typing, table, [first], last)
        schema = evolution.schema
        commit = batch_commit(self.app_id, high, shape)
        columns = typing.columns(shape)
        if isinstance(bulk, BulkMirror):
            data = bulk_mirror_rows(columns, bulk, schema)
        else:
            data = bulk_history_rows(columns, bulk, schema)
        writing = time.perf_counter()
        if table is None:
            table = self.io.create(schema, source)
        elif evolution.widened or before:
            self.writer.rewrite(table, schema, before, typing)
        writer = self.writer
        if bulk.missing:  # a history's rows: the versions come after the closes
            offset = len(bulk.close_ends) if isinstance(bulk, BulkHistory) else 0
            data = writer.fill_missing(table, shape.key_names, data, bulk.missing, schema, offset)
        if isinstance(bulk, BulkHistory):
            written = writer.merge_history(
                table, shape, data, schema, commit, inserts_only=bulk.inserts_only
            )
            counts = (bulk.version_rows, bulk.deletes)
        elif bulk.inserts_only and not writer.holds_any(table, shape, data):
            written = bulk.upsert_rows > 0 and writer.append_rows(
                table, data.slice(0, bulk.upsert_rows).drop_columns([ACTION]), schema, commit
            )
            counts = (bulk.upsert_rows, bulk.delete_rows)
        else:
            written = writer.merge_mirror(table, shape, data, schema, commit)
            counts = (bulk.upsert_rows, bulk.delete_rows)
        if not written:
            self.io.mark(table, commit)
        return counts[0], counts[1], table.version(), writing

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
            created_for = table.metadata().configuration.get("pgcdc.source")
            if created_for and created_for != source:
                raise TargetError(f"{self.path} was created for {created_for}, not {source}")
        return source

    # --- the initial copy, recovery, state -----------------------------------------------

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
        table = self.io.open()
        if table is None:
            table = self.io.create(
                schema, self.source or f"{relation.namespace}.{relation.relname}"
            )
        columns = recorded_columns(Shape.of(relation, tuple(attnums)).columns)
        write_deltalake(
            table,
            schema.empty_table(),
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=CommitProperties(custom_metadata={COLUMNS: columns}),
        )

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
        """One chunk of a copy, appended in one commit that names it. The chunks of a copy
        are appended side by side; one whose commit lost to a change of the table's metadata
        (another chunk's first open setting pgcdc's table properties on a table made with
        other values) is appended again on the table read anew."""
        if self.mode == "history":
            rows = history_columns(rows, point, position)
        metadata = {CHUNK_KEY: chunk, POINT_KEY: str(int(point)), ROWS_KEY: str(rows.num_rows)}
        for attempt in range(CHUNK_ATTEMPTS):
            table = self.io.open()
            if table is None:
                raise TargetError(f"no Delta table at {self.path} (reset it first)")
            try:
                write_deltalake(
                    table,
                    conform(rows, self.io.schema(table)),
                    mode="append",
                    commit_properties=CommitProperties(custom_metadata=metadata),
                )
                return
            except CommitFailedError:
                if attempt == CHUNK_ATTEMPTS - 1:
                    raise
                self.io.load()

    def copied_chunks(self, point: int) -> dict[str, int]:
        table = self.io.open()
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
        applies changes; with the columns the copy recorded (`reset`), which a restart
        reads the slot's Relation messages against and the first batch follows the
        target's columns from (without them, both went by name: columns renamed or
        swapped meanwhile had their values moved to each other's names)."""
        table = self.io.open()
        if table is None:
            raise TargetError(f"no Delta table at {self.path}")
        columns = latest_columns(table)
        commit = CommitProperties(
            app_transactions=[Transaction(self.app_id, watermark)],
            custom_metadata=None if columns is None else {COLUMNS: columns},
        )
        self.io.mark(table, commit)

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
        metadata = {COLUMNS: recorded_columns(columns)} if columns else None
        commit = CommitProperties(
            app_transactions=[Transaction(self.app_id, copy_watermark(point))],
            custom_metadata=metadata,
        )
        table = self.io.open()
        if table is None or self.mode == "changelog":  # a change log cannot know what it missed
            if table is not None:
                self.io.mark(table, commit)
            return
        if columns:
            shape = Shape("", "", 0, "d", tuple(columns))
            followed, _ = self.writer.follow_columns(table, last_commit(table, self.path), [shape])
            assert followed is not None
            table = followed
        schema, changed = plan_reconcile(self.io.schema(table), rows.schema)
        if changed:  # types the source changed while the table could not be streamed
            self.writer.retype(table, schema, changed)
        data = conform(self.io.read_all(table), schema)  # columns new to the target: null
        if self.mode == "history":
            data = data.filter(pc.is_null(data.column(END_AT)))
        writer = self.writer
        written = (
            writer.reconcile_keyed(table, data, rows, keys, schema, point, commit, keep_missing)
            if keys
            else writer.reconcile_multiset(table, data, rows, schema, point, commit)
        )
        if not written:
            self.io.mark(table, commit)

    def recorded_columns(self) -> tuple[ColumnInfo, ...] | None:
        table = self.io.open()
        if table is None:
            return None
        return recorded(last_commit(table, self.path)) or recorded(
            {COLUMNS: latest_columns(table)}  # a copy's, before its chunks
        )

    def warm(self) -> None:
        table, keys = self.io.open(), recorded_keys(self.recorded_columns())
        if table is not None and keys:
            self.writer.mor.warm(table, keys)

    def state(self) -> TargetState:
        table = self.io.open()
        if table is None:
            return TargetState(False)
        if table.protocol().reader_features and "deletionVectors" in (
            table.protocol().reader_features or ()
        ):
            rows = logical_row_count(table)
        else:
            actions = pa.table(table.get_add_actions(flatten=True))  # an arro3 table: pyarrow
            rows = pc.sum(actions.column("num_records")).as_py() or 0
        last = table.history(1)
        at = None
        if last and last[0].get("timestamp") is not None:
            at = datetime.fromtimestamp(last[0]["timestamp"] / 1000, UTC)
        return TargetState(True, self.io.watermark(table, self.app_id), rows, table.version(), at)

    def maintain(self) -> bool:
        """Keeps the lake near its live size, cheaply (after a batch, or between batches):
        every `COMPACT_EVERY` versions many small files (appends, a MERGE's rewrites) are
        compacted into files of the target size; every `VACUUM_EVERY` versions, or
        `VACUUM_SECONDS` after this process's last vacuum, files removed longer ago than
        ``delta.deletedFileRetentionDuration`` are deleted (delta-rs checkpoints the log and
        drops expired entries itself). A table with deletion vectors follows their policy,
        every `MERGE_ON_READ_EVERY` versions (`pgcdc.targets._mor.maintain`). "Every N
        versions": once N have passed since the last multiple of N this process saw. Whether
        a pass ran; when none can be due, nothing is read (on an object store, a listing)."""
        cached = self.io.cached
        if cached is not None and not self._may_be_due(cached):
            return False
        table = self.io.open()
        if table is None:
            return False
        version = table.version()
        if self.writer.mor.active(table):
            if not self.schedule.due("mor", version, MERGE_ON_READ_EVERY):
                return False
            self.writer.mor.maintain(table, sweep=self.schedule.vacuum_due(version, VACUUM_EVERY))
            return True
        compact = self.schedule.due("compact", version, COMPACT_EVERY)
        if compact:
            self._compact(table)
        vacuum = self.schedule.vacuum_due(version, VACUUM_EVERY)
        if vacuum:
            table.vacuum(retention_hours=None, dry_run=False, enforce_retention_duration=True)
        return compact or vacuum

    def _may_be_due(self, table: DeltaTable) -> bool:
        """Whether a pass may be due, by the table as last read (no I/O)."""
        version, schedule = table.version(), self.schedule
        if self.writer.mor.active(table):
            return schedule.passed("mor", version, MERGE_ON_READ_EVERY)
        return schedule.vacuum_may_be_due(version, VACUUM_EVERY) or schedule.passed(
            "compact", version, COMPACT_EVERY
        )

    def _compact(self, table: DeltaTable) -> None:
        size = int(self.io.properties["delta.targetFileSize"])
        actions = pa.table(table.get_add_actions(flatten=True))
        small = pc.sum(pc.less(actions.column("size_bytes"), size // 4)).as_py() or 0
        if small >= SMALL_FILES:
            table.optimize.compact(target_size=size)


def _last_columns(rows: pa.Table) -> dict[str, str] | None:
    """A change log's commit metadata: the columns of the relation as of the batch's last
    row that has them (a change; a message has none), as a mirror's batch records them
    (`batch_commit`): what a restart reads the slot's Relation messages against
    (`pgcdc.pipeline._columns`). None when no row has columns."""
    counts = pc.list_value_length(rows.column("columns"))
    rows = rows.filter(pc.fill_null(pc.greater(counts, 0), False))
    if not rows.num_rows:
        return None
    order = pc.sort_indices(
        rows.select(["commit_lsn", "ordinal"]),
        [("commit_lsn", "descending"), ("ordinal", "descending")],
    )
    last = rows.column("columns")[order[0].as_py()].as_py()
    columns = [
        ColumnInfo(c["name"], c["type_oid"], c["type_modifier"], bool(c["key"]), c["attnum"] or 0)
        for c in last
    ]
    return {COLUMNS: recorded_columns(columns)}


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


def _check_storable(source: str, f: pa.Field) -> None:
    try:
        deltalake.Schema.from_arrow(pa.schema([f]))
    except Exception as exc:
        raise TargetError(
            f"{source}.{f.name}: Delta Lake cannot store {f.type} ({str(exc).splitlines()[0]});"
            " map the type to a string (MappingOptions time='string', interval='string')"
        ) from None


def _source_of(rows: pa.Table) -> str:
    if "schema" in rows.column_names and "table" in rows.column_names and rows.num_rows:
        schema, table = rows.column("schema")[0].as_py(), rows.column("table")[0].as_py()
        if table is not None:
            return f"{schema}.{table}"
    return ""
