"""The main job: a pgoutput stream applied, batch by batch, to Delta targets.

Each micro-batch is collected on the driver as Arrow, split by source table and applied to
that table's targets (mirror, history, changelog); every target commits its data together
with the batch's highest commit LSN, so a batch replayed after a crash, or a stream restarted
without its checkpoint, changes nothing. The slot moves only after Spark committed a batch, and
once more when the pipeline stops cleanly (to the last batch Spark finished).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding.catalog import Catalog
from pgcdc.errors import ApplyError, PgcdcError, SlotNotFound, TargetError
from pgcdc.protocol import Lsn
from pgcdc.replication.slots import SlotInfo, connect_sql, get_slot
from pgcdc.snapshot.fill import SourceFills
from pgcdc.spark.bindings import TableBindings, bind_partition, bind_tables, partial_truncates
from pgcdc.spark.config import PipelineConfig, TableTarget
from pgcdc.spark.initial_copy import InitialCopy, TableProgress
from pgcdc.spark.quarantine import Quarantine
from pgcdc.spark.session import error_line
from pgcdc.targets import DeltaTarget
from pgcdc.types.catalog import resolve
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeRegistry

__all__ = ["BatchReport", "Pipeline", "PipelineStats", "apply_error_line", "request_recopy"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchReport:
    batch_id: int
    changes: int
    #: Rows applied per target ("schema.table mode"); replayed rows are not counted.
    applied: dict[str, int]
    skipped: int
    last_commit_lsn: Lsn | None
    last_commit_time: datetime | None
    seconds: float


@dataclass(slots=True)
class PipelineStats:
    batches: int = 0
    changes: int = 0
    per_table: dict[str, int] = field(default_factory=dict)
    last_commit_lsn: Lsn | None = None
    last_commit_time: datetime | None = None
    last_batch_at: float | None = None
    started: float = field(default_factory=time.monotonic)

    def add(self, report: BatchReport) -> None:
        self.batches += 1
        self.changes += report.changes
        for name, count in report.applied.items():
            self.per_table[name] = self.per_table.get(name, 0) + count
        if report.last_commit_lsn is not None:
            self.last_commit_lsn = report.last_commit_lsn
            self.last_commit_time = report.last_commit_time
        self.last_batch_at = time.monotonic()


class Pipeline:
    """Runs one configuration on a Spark session (`run`, `stop` from any thread)."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: Any = None,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_copy: Callable[[dict[str, TableProgress]], None] | None = None,
    ) -> None:
        self.config = config
        if spark is None:
            from pgcdc.spark.session import local_session

            spark = local_session(f"pgcdc-{config.name}")
        self.spark = spark
        self.on_batch = on_batch
        self.on_copy = on_copy
        self.copy_progress: dict[str, TableProgress] = {}
        self.registry: TypeRegistry = DEFAULT_REGISTRY.copy()
        self.catalog = Catalog(config.conninfo)
        self.targets: dict[str, list[tuple[TableTarget, DeltaTarget]]] = {}
        fills = SourceFills(config.conninfo)
        for spec in config.targets():
            target = DeltaTarget(
                spec.path,
                spec.mode,
                app_id=config.app_id,
                registry=self.registry,
                source=spec.table,
                fills=fills,
            )
            self.targets.setdefault(spec.table, []).append((spec, target))
        self.stats = PipelineStats()
        self.bindings: TableBindings | None = None
        self.quarantine = Quarantine(Path(config.state_path) / "quarantine.json")
        #: What `watch_wal` last found wrong with the slot's retained WAL (None: nothing).
        self.wal_warning: str | None = None
        self._wal_checked = float("-inf")
        self._unbound: set[int] = set()
        self.query: Any = None
        #: Tables whose targets wait for a copy; their changes go to a pending change log.
        self.pending: dict[str, DeltaTarget] = {}
        self._online: threading.Thread | None = None
        self._online_done: set[str] = set()
        #: Batches and drains of copied tables take turns (Spark's and the run loop's thread).
        self._lock = threading.RLock()
        self._stopping = threading.Event()

    # -- the batch function (Spark calls it on the driver) ---------------------------------

    def _resolve_types(self, rows: pa.Table) -> None:
        columns = pc.list_flatten(rows.column("columns"))
        if len(columns):
            oids = pc.unique(pc.struct_field(columns, "type_oid")).to_pylist()
            resolve(self.registry, self.catalog, [o for o in oids if o is not None])

    def _drain_copied(self) -> None:
        with self._lock:
            self._drain_copied_locked()

    def _drain_copied_locked(self) -> None:
        for table in list(self._online_done):
            self._online_done.discard(table)
            self._drain(table)

    def apply_batch(self, batch: pa.Table, batch_id: int) -> BatchReport:
        """Apply one micro-batch of envelope rows to every target."""
        with self._lock:
            self._drain_copied_locked()
            return self._apply_batch(batch, batch_id)

    def _apply_batch(self, batch: pa.Table, batch_id: int) -> BatchReport:
        started = time.monotonic()
        applied: dict[str, int] = {}
        skipped = 0
        if batch.num_rows:
            self._resolve_types(batch)
            for table, rows in self._route(batch).items():
                targets = self.targets[table]
                if table in self.pending:
                    self.pending[table].apply(rows)
                    applied[f"{table} pending copy"] = rows.num_rows
                    continue
                try:
                    self._check_truncates(table, rows)
                    for spec, target in targets:
                        result = target.apply(rows)
                        applied[f"{table} {spec.mode}"] = result.applied
                        skipped += result.skipped
                except Exception as exc:
                    line = apply_error_line(table, rows, exc)
                    if self.config.on_error.get(table, "stop") != "quarantine":
                        raise ApplyError(
                            f'{line}; nothing of it is confirmed (on_error = "quarantine" '
                            "for this table lets the others stream on)"
                        ) from None
                    self._quarantine(table, line, rows)
                    applied[f"{table} quarantined"] = rows.num_rows
        last_lsn = last_time = None
        if batch.num_rows:
            last = pc.max(batch.column("commit_lsn")).as_py()
            last_lsn = Lsn(last)
            last_time = pc.max(batch.column("commit_ts")).as_py()
        report = BatchReport(
            batch_id,
            batch.num_rows,
            applied,
            skipped,
            last_lsn,
            last_time,
            time.monotonic() - started,
        )
        self.stats.add(report)
        if self.on_batch is not None:
            self.on_batch(report)
        return report

    def _quarantine(self, table: str, line: str, rows: pa.Table) -> None:
        """Set `table` aside: its changes from this batch on go to its pending change log
        (durable before the batch commits, so the slot may move); its targets stay."""
        first = Lsn(pc.min(rows.column("commit_lsn")).as_py())
        self.quarantine.add(table, line, str(first))
        self.pending[table] = self._pending_target(table)
        self.pending[table].apply(rows)
        log.error(
            "%s is quarantined: %s; its changes go to its change log until "
            "`pgcdc recopy PIPELINE.toml %s`",
            table,
            line,
            table,
        )

    def _check_truncates(self, table: str, rows: pa.Table) -> None:
        """A TRUNCATE of some partitions only (a publication without
        publish_via_partition_root sends each partition's own) cannot be applied to the
        parent's targets: they do not know which rows were that partition's."""
        truncates = rows.filter(pc.equal(rows.column("op"), "truncate"))
        if not truncates.num_rows or table not in self.bind().leaves:
            return
        by_commit: dict[int, set[int]] = {}
        for lsn, oid in zip(
            truncates.column("commit_lsn").to_pylist(),
            truncates.column("relation_oid").to_pylist(),
            strict=True,
        ):
            by_commit.setdefault(lsn, set()).add(oid)
        for lsn, oids in by_commit.items():
            partial = partial_truncates(self.bind(), table, oids)
            if partial:
                raise TargetError(
                    f"{table}: TRUNCATE of some of its partitions only (OIDs "
                    f"{', '.join(map(str, sorted(partial)))}) at commit LSN {Lsn(lsn)} cannot "
                    "be applied to the parent's targets; recopy the table"
                )

    def _route(self, batch: pa.Table) -> dict[str, pa.Table]:
        """The batch's rows per configured table, by relation OID (a renamed table keeps its
        targets); rows of relations the pipeline does not follow are left out."""
        bindings = self.bind()
        oids = batch.column("relation_oid")
        by_table: dict[str, list[int]] = {}
        for oid in pc.unique(oids).to_pylist():
            if oid is None or oid in self._unbound:
                continue
            table = bindings.table_of(oid)
            if table is None:
                table = bind_partition(self.config.conninfo, bindings, oid)
                if table is None:
                    self._unbound.add(oid)
                    continue
            by_table.setdefault(table, []).append(oid)
        return {
            table: batch.filter(pc.is_in(oids, value_set=pa.array(members, oids.type)))
            for table, members in by_table.items()
        }

    def bind(self) -> TableBindings:
        """The configured tables' relation OIDs, resolved or re-checked once per run
        (`pgcdc.spark.bindings`): raises `BindingError` naming a table that cannot be
        followed."""
        if self.bindings is None:
            self.bindings = bind_tables(
                self.config.conninfo,
                self.config.publication.split(","),
                self.targets,
                Path(self.config.state_path) / "tables.json",
            )
        return self.bindings

    def _foreach_batch(self, df: Any, batch_id: int) -> None:
        self.apply_batch(df.toArrow(), batch_id)

    # -- running ---------------------------------------------------------------------------

    def start(self) -> Any:
        config = self.config
        options = {
            "conninfo": config.conninfo,
            "slot": config.slot,
            "publication": config.publication,
            "createSlot": str(config.create_slot).lower(),
            "statusInterval": "1",
        }
        if config.max_changes_per_batch is not None:
            options["maxChangesPerBatch"] = str(config.max_changes_per_batch)
        if config.streaming is not None:
            options["streaming"] = config.streaming
        options.update(config.source_options)
        writer = (
            self.spark.readStream.format("pgoutput")
            .options(**options)
            .load()
            .writeStream.foreachBatch(self._foreach_batch)
            .option("checkpointLocation", config.checkpoint_path)
        )
        if config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=config.interval)
        self.query = writer.start()
        return self.query

    def _copier(self) -> InitialCopy:
        config = self.config

        def progress(tables: dict[str, TableProgress]) -> None:
            self.copy_progress = dict(tables)
            if self.on_copy is not None:
                self.on_copy(self.copy_progress)

        return InitialCopy(
            self.spark,
            config.conninfo,
            config.slot,
            {table: [t for _, t in targets] for table, targets in self.targets.items()},
            Path(config.state_path) / "snapshot.json",
            chunk_blocks=config.chunk_blocks,
            on_progress=progress,
            source_names=self.bind().current_names,
        )

    def _check_slot(self) -> None:
        config = self.config
        if not config.create_slot and _slot_or_none(config.conninfo, config.slot) is None:
            raise SlotNotFound(
                f"replication slot '{config.slot}' does not exist (create it with "
                "`pgcdc slot create`, or set create_slot = true in [source])"
            )

    def initial_copy(self) -> None:
        """Copy the tables first when the slot is new (the pipeline creates it with an
        exported snapshot) or a previous copy did not finish (it starts again: see
        `pgcdc.spark.initial_copy`). Once the pipeline has run, a table still without a copy
        (added since, or whose copy failed) is copied while the stream runs. A first run on
        a slot the pipeline did not create copies nothing: the slot holds the tables' changes
        from its creation on.

        A slot that is gone while the targets hold data stops the pipeline: the changes
        between the targets' watermarks and a new slot would be lost."""
        config = self.config
        copier = self._copier()
        status = copier.status if config.snapshot else None
        slot = _slot_or_none(config.conninfo, config.slot)
        watermarks = [t.watermark for ts in self.targets.values() for _, t in ts]
        if status in ("creating", "copying"):
            copier.restart()
        elif slot is None and (status == "done" or any(w is not None for w in watermarks)):
            applied = max((w for w in watermarks if w is not None), default=None)
            raise SlotLost(
                f'replication slot "{config.slot}" is gone, but the targets hold changes up '
                f"to commit LSN {Lsn(applied) if applied is not None else '?'}: the changes "
                "since then cannot be streamed again; move the targets and the pipeline's "
                f"state ({config.state_path}) away to copy everything anew"
            )
        elif slot is None and config.create_slot and config.snapshot:
            copier.start_fresh()
        if not config.snapshot:
            return
        failed = {t for t, p in self.copy_progress.items() if p.error is not None}
        marked = {
            table: all(t.watermark is not None for _, t in targets)
            for table, targets in self.targets.items()
        }
        records = {t: r for t, r in self.quarantine.records().items() if t in self.targets}
        set_aside = {t for t, r in records.items() if r.status == "quarantined"}
        if not any(marked.values()) and not records:
            return  # a first run on a slot made by someone else: the stream has it all
        for table, ready in marked.items():
            if table in set_aside:
                self.pending[table] = self._pending_target(table)
                log.warning("%s stays quarantined: %s", table, records[table].reason)
            elif not ready:  # added since the last run, its copy failed, or a recopy
                self.pending[table] = self._pending_target(table)
            elif Path(self._pending_path(table)).exists():
                self._drain(table)  # a crash came after the copy, before the drain ended
        waiting = sorted(set(self.pending) - failed - set_aside)
        for table in failed:
            log.error("copy of %s failed: %s", table, self.copy_progress[table].error)
        if waiting:
            self._online = threading.Thread(
                target=self._copy_online, args=(waiting,), name="pgcdc-online-copy", daemon=True
            )

    def _pending_path(self, table: str) -> str:
        return str(Path(self.config.state_path) / "pending" / table)

    def _pending_target(self, table: str) -> DeltaTarget:
        return DeltaTarget(
            self._pending_path(table), "changelog", app_id=self.config.app_id, source=table
        )

    def _copy_online(self, tables: list[str]) -> None:
        _, copied = self._copier().copy_online(tables)
        self._online_done.update(copied)
        for table in set(tables) - copied:
            log.error("copy of %s failed: %s", table, self.copy_progress[table].error)

    def _drain(self, table: str) -> None:
        """The table's copy is in: apply what the stream brought meanwhile (the targets skip
        what the copy already holds), then forget the pending log."""
        pending = self._pending_target(table)
        if pending.exists:
            rows = pending.to_arrow()
            for _, target in self.targets[table]:
                target.apply(rows)
        shutil.rmtree(self._pending_path(table), ignore_errors=True)
        self.pending.pop(table, None)
        self.quarantine.lift(table)

    def run(self, *, tick: Callable[[], None] | None = None) -> PipelineStats:
        """Run until caught up (available-now), `stop()` or an error, after an initial copy
        if one is due; `tick` is called about twice a second (for a progress view)."""
        if self.query is None:
            self._check_slot()
            self.bind()
            self.initial_copy()
        query = self.query or self.start()
        if self._online is not None and self._online.ident is None:
            self._online.start()
        from pyspark.errors import StreamingQueryException

        try:
            while query.isActive:
                if self._stopping.is_set() and not query.status.get("isTriggerActive", False):
                    query.stop()  # between batches: the one in progress has finished
                    break
                query.awaitTermination(0.5)
                self._drain_copied()
                self.watch_wal()
                if tick is not None:
                    tick()
            if self._online is not None and self._online.ident is not None:
                self._online.join()  # available-now: the copies finish before the run does
                self._drain_copied()
            exc = query.exception()
            if exc is not None:
                raise PipelineFailed(error_line(exc))
        except StreamingQueryException as exc:
            raise PipelineFailed(error_line(exc)) from None
        finally:
            self._after_stop()
        return self.stats

    def watch_wal(self, every: float = 10.0) -> str | None:
        """At most every `every` seconds, look at the slot: `wal_warning` says (and the log
        warns once) when it retains more WAL than ``max_retained_wal``, or when the server
        will invalidate it soon (``safe_wal_size`` below a tenth of that)."""
        limit = self.config.max_retained_wal
        now = time.monotonic()
        if limit is None or now - self._wal_checked < every:
            return self.wal_warning
        self._wal_checked = now
        try:
            slot = get_slot(self.config.conninfo, self.config.slot)
        except PgcdcError:
            return self.wal_warning  # the stream reports a missing slot itself
        warning = None
        retained, safe = slot.retained_bytes or 0, slot.safe_wal_size
        if retained > limit:
            warning = (
                f"slot {slot.slot_name} retains {_size(retained)} of WAL "
                f"(max_retained_wal {_size(limit)})"
            )
        if safe is not None and safe < limit // 10:
            warning = (
                f"{warning + '; ' if warning else f'slot {slot.slot_name}: '}the server "
                f"invalidates it after {_size(max(safe, 0))} more WAL (max_slot_wal_keep_size)"
            )
        if warning and warning != self.wal_warning:
            log.warning("%s", warning)
        self.wal_warning = warning
        return warning

    def stop(self) -> None:
        """Finish the batch in progress, then stop."""
        self._stopping.set()

    def _after_stop(self) -> None:
        """Move the slot to the last batch Spark committed: the data source process is gone
        before its (one batch late) commit call could."""
        progress = self.query.lastProgress if self.query is not None else None
        end = _end_offset(progress)
        self.catalog.close()
        if end is None:
            return
        try:
            _advance_when_free(self.config.conninfo, self.config.slot, Lsn.parse(end))
        except PgcdcError as exc:
            log.warning("could not move slot %s to %s: %s", self.config.slot, end, exc)


def _end_offset(progress: Any) -> str | None:
    """The source's end offset in a StreamingQueryProgress (an object or a dict, the offset
    a dict or its JSON)."""
    if progress is None:
        return None
    sources = getattr(progress, "sources", None)
    if sources is None:
        sources = progress.get("sources") if isinstance(progress, dict) else None
    if not sources:
        return None
    first = sources[0]
    end = getattr(first, "endOffset", None)
    if end is None and isinstance(first, dict):
        end = first.get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return end.get("lsn") if isinstance(end, dict) else None


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def request_recopy(config: PipelineConfig, table: str) -> list[str]:
    """Ask for a new copy of `table` (quarantined or not), with the pipeline stopped: its
    targets are removed now; the next run copies it while the others stream, then applies
    the changes logged meanwhile and lifts any quarantine. The removed target paths."""
    table = table if "." in table else f"public.{table}"
    if table not in config.tables:
        raise PgcdcError(f"{table} is not a table of pipeline {config.name!r}")
    paths = [spec.path for spec in config.targets() if spec.table == table]
    remote = [p for p in paths if "://" in p]
    if remote:
        raise PgcdcError(f"{remote[0]}: recopy removes local targets only")
    Quarantine(Path(config.state_path) / "quarantine.json").request_recopy(table)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    return paths


_DATA_FILE = re.compile(r"\S*\.parquet\b|\b(?:file|s3a?|abfss?|gs)://\S+")


def apply_error_line(table: str, rows: pa.Table, exc: BaseException) -> str:
    """One line for a batch of `table` its targets could not take: the commit LSNs, the
    first change and its key, and the error's first line without data file names."""
    lsns = rows.column("commit_lsn")
    low, high = Lsn(pc.min(lsns).as_py()), Lsn(pc.max(lsns).as_py())
    order = pc.sort_indices(
        rows.select(["commit_lsn", "ordinal"]),
        [("commit_lsn", "ascending"), ("ordinal", "ascending")],
    )
    first = rows.take(order.slice(0, 1)).to_pylist()[0]
    key = ", ".join(f"{k}={v}" for k, v in (first["key"] or []))
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    reason = _DATA_FILE.sub("<data file>", reason)
    span = f"commit LSN {low}" if low == high else f"commit LSNs {low} to {high}"
    return (
        f"{table}: cannot apply {rows.num_rows} change{'' if rows.num_rows == 1 else 's'} "
        f"at {span} (first: {first['op']} "
        f"of key ({key}) at LSN {Lsn(first['lsn'] or 0)}): {reason}"
    )


def _slot_or_none(conninfo: str, slot: str) -> SlotInfo | None:
    try:
        return get_slot(conninfo, slot)
    except SlotNotFound:
        return None


class SlotLost(PgcdcError):
    """The pipeline's slot no longer exists though its targets hold data."""


class PipelineFailed(PgcdcError):
    """The streaming query stopped with an error (the first line of Spark's, cleaned up)."""


def _advance_when_free(conninfo: str, slot: str, lsn: Lsn, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (info := get_slot(conninfo, slot)).active:
        if time.monotonic() > deadline:
            return  # someone else runs it now; it will confirm on its own
        time.sleep(0.2)
    if info.confirmed_flush_lsn is not None and info.confirmed_flush_lsn >= lsn:
        return
    with connect_sql(conninfo) as conn:
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(lsn)))
