"""Copies made while the stream goes on: a table added to a running pipeline's configuration,
one whose copy failed or was asked for again (`pgcdc recopy`), one to resynchronize. Until
its copy is in, a table's changes go to its pending change log (a Delta table in the
pipeline's state); then they are applied over the copy (the targets skip what it holds) and
the log is forgotten (`OnlineCopies.drain`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pyarrow.compute as pc

from pgcdc.envelope import ColumnInfo
from pgcdc.errors import PgcdcError, PipelineFailed
from pgcdc.pipeline._copy import InitialCopy, TableProgress
from pgcdc.pipeline._tables import FollowedTables
from pgcdc.pipeline.config import PipelineConfig, TableTarget
from pgcdc.storage import FileIO
from pgcdc.targets import Target, TargetSpec, open_target
from pgcdc.types.catalog import TypeCatalog

__all__ = ["OnlineCopies", "pending_name"]

log = logging.getLogger(__name__)


def pending_name(table: str) -> str:
    """The pending change log of `table` in the pipeline's state (a Delta table)."""
    return f"pending/{table}"


class OnlineCopies:
    """The copies running (or due) beside the stream, and what they left to do: the driver
    calls `finish` between batches, which drains the tables copied and reports the copies
    that failed (`failed`)."""

    def __init__(
        self,
        config: PipelineConfig,
        state: FileIO,
        tables: FollowedTables,
        types: TypeCatalog,
        *,
        copier: Callable[[], InitialCopy],
        open_target: Callable[[TableTarget], Target],
        progress: Callable[[], dict[str, TableProgress]],
    ) -> None:
        self.config = config
        self.state = state
        self.tables = tables
        self.types = types
        self._copier = copier
        self._open = open_target
        self._progress = progress
        self._threads: list[threading.Thread] = []
        #: Tables whose copy is in, to drain (`finish`).
        self._done: set[str] = set()
        #: Tables whose copy failed, with the error (`finish`).
        self._failures: dict[str, str] = {}

    def later(self, tables: list[str], *, resync: bool, now: bool) -> None:
        """Copy (or resynchronize) `tables` in a thread while the stream goes on: at once if
        `now`, else at `start_all`. Their changes go to their pending change logs meanwhile."""
        thread = threading.Thread(
            target=self._copy, args=(tables, resync), name="pgcdc-online-copy", daemon=True
        )
        self._threads.append(thread)
        if now:
            thread.start()

    def start_all(self) -> None:
        """Start the copies asked for before the stream ran."""
        for thread in self._threads:
            if thread.ident is None:
                thread.start()

    def join_all(self) -> None:
        """Wait for every copy (available-now: the copies finish before the run does)."""
        for thread in self._threads:
            thread.join()

    def _copy(self, tables: list[str], resync: bool) -> None:
        """The copy thread's work: whatever it raises is a failure of its tables, reported
        by `finish` in the pipeline's thread (a thread that died would leave them pending
        and the run going on as if nothing happened)."""
        keep = frozenset(t for t in tables if self.config.on_detach.get(t) == "keep")
        try:
            _, copied = self._copier().copy_online(tables, resync=resync, keep=keep)
        except Exception as exc:
            if isinstance(exc, PgcdcError):
                error = str(exc)
            else:
                log.debug("the copy of %s failed", ", ".join(tables), exc_info=True)
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            self._failures.update(dict.fromkeys(tables, error))
            return
        self._done.update(copied)
        for table in set(tables) - copied:
            self._failures[table] = self._progress()[table].error or "failed"

    def failed(self, table: str, error: str) -> None:
        """A table's copy failed: with ``on_error = "stop"`` the pipeline stops with one line
        (the next run copies it again); with "quarantine" the table is set aside, or, when
        it waits for a copy already (a recopy or a resynchronization asked for), stays so,
        its changes logged, and is copied again at the next run."""
        line = f"copy of {table} failed: {error}"
        if self.config.on_error.get(table, "stop") == "stop":
            raise PipelineFailed(f"{line}; it is copied again at the next run")
        if table not in self.tables.quarantine.records():
            self.tables.set_aside(table, line, "")
        else:
            log.error(
                "%s; its changes go to its change log, it is copied again at the next run", line
            )

    def pending_location(self, table: str) -> str:
        """Where the table's pending change log is (a Delta table in the state)."""
        return self.state.location(pending_name(table))

    def pending_held(self, table: str) -> tuple[int | None, tuple[ColumnInfo, ...] | None]:
        """The last commit LSN the table's pending change log holds (None: it holds none),
        and the relation's columns as of it (None: not recorded)."""
        log = TargetSpec(
            self.pending_location(table), "changelog", storage_options=self.state.storage_options
        )
        target = open_target(log, app_id=self.config.app_id)
        return target.watermark, target.recorded_columns()

    def drain(self, table: str) -> None:
        """The table's copy is in: apply what the stream brought meanwhile (the targets skip
        what the copy already holds), then forget the pending log."""
        log = TargetSpec(
            self.pending_location(table), "changelog", storage_options=self.state.storage_options
        )
        pending = open_target(log, app_id=self.config.app_id)
        if pending.exists:
            rows = pending.to_arrow()
            columns = pc.list_flatten(rows.column("columns"))
            if len(columns):
                oids = pc.unique(pc.struct_field(columns, "type_oid")).to_pylist()
                self.types.describe(o for o in oids if o is not None)
            for spec, _ in self.tables.targets[table]:
                self._open(spec).apply(rows)
        self.state.delete_tree(pending_name(table))
        self.tables.pending.discard(table)
        self.tables.quarantine.lift(table)

    def finish(self) -> None:
        """Between batches: the copies that failed are reported (`failed`), the tables
        copied drained."""
        for table, error in list(self._failures.items()):
            del self._failures[table]
            self.failed(table, error)
        for table in list(self._done):
            self._done.discard(table)
            self.drain(table)
