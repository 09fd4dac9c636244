"""The configured tables as the pipeline follows them: by relation OID, bound once per run and
checked again for what the stream cannot show; set aside (quarantined) or resynchronized when
they change behind the stream's back.

`FollowedTables` is the driver's one place for a table's standing: bound or not, pending (its
changes go to its pending change log while it waits for a copy or is quarantined), or
streaming. What the events are and how they are found is `pgcdc.pipeline._bindings`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pgcdc.errors import PipelineFailed
from pgcdc.monitoring import PipelineMetrics
from pgcdc.pipeline._bindings import (
    BindingError,
    Inspection,
    TableBindings,
    bind_partition,
    inspect_tables,
)
from pgcdc.pipeline._quarantine import Quarantine
from pgcdc.pipeline.config import PipelineConfig, TableTarget
from pgcdc.protocol import Relation
from pgcdc.spool._spool import MESSAGES
from pgcdc.storage import FileIO
from pgcdc.targets import Target

__all__ = ["FollowedTables"]

log = logging.getLogger(__name__)


class FollowedTables:
    """The configured tables' bindings (relation OIDs, partitions, names now), which are
    pending, and the quarantine records. `on_resync` is called with the tables a check found
    changed with no change in the stream: they are to be copied again while the stream goes
    on (their changes already go to their pending change logs)."""

    def __init__(
        self,
        config: PipelineConfig,
        targets: dict[str, list[tuple[TableTarget, Target]]],
        state: FileIO,
        *,
        on_resync: Callable[[list[str]], None],
    ) -> None:
        self.config = config
        self.targets = targets
        self.state = state
        self.quarantine = Quarantine(state)
        self.bindings: TableBindings | None = None
        #: The last inspection (what the next one compares with).
        self._inspection: Inspection | None = None
        #: Tables whose targets wait for a copy, or are quarantined: their changes go to
        #: their pending change log.
        self.pending: set[str] = set()
        #: The gauges to keep, while the pipeline serves metrics.
        self.metrics: PipelineMetrics | None = None
        self._on_resync = on_resync
        #: Relations of no configured table (met in the stream, looked up once).
        self._unbound: set[int] = set()
        #: Tables whose loss was warned about (once each).
        self._warned: set[str] = set()
        self._checked = time.monotonic()

    def bind(self) -> TableBindings:
        """The configured tables' relation OIDs, resolved or re-checked once per run
        (`pgcdc.pipeline._bindings`): raises `BindingError` naming a table that cannot be
        followed; a table whose rows changed since with no change in the stream is
        resynchronized."""
        if self.bindings is None:
            inspection = inspect_tables(
                self.config.conninfo, self.config.publications, self.targets, self.state
            )
            for event in inspection.events:
                if not event.resync:
                    raise BindingError(event.line)
            self._react(inspection)
            self.bindings = inspection.bindings
        return self.bindings

    def table_of(self, relid: int, relation: Relation | None) -> str | None:
        """The configured table a relation of the stream belongs to (itself, or a partition
        of it), or None. A configured table's name under a new OID means it was dropped and
        created again: the pipeline stops (its targets hold the old table)."""
        if relid == MESSAGES or relid in self._unbound:
            return None
        bindings = self.bind()
        table = bindings.table_of(relid)
        if table is None:
            table = bind_partition(self.config.conninfo, bindings, relid)
            if table is not None:
                self._checked = float("-inf")  # an attached partition: look now
            elif relation is not None:
                name = f"{relation.namespace}.{relation.relname}"
                for configured, current in bindings.current_names.items():
                    if name in (configured, current):
                        raise PipelineFailed(
                            f"table {name} was dropped and created again while the pipeline "
                            f"ran (OID {bindings.oids[configured]}, now {relid}): its "
                            "targets hold the old table; move them away (or delete them) "
                            f"and remove {configured} from the pipeline's tables.json to copy "
                            "the new one"
                        )
                self._unbound.add(relid)
        return table

    def watch(self, every: float = 5.0) -> None:
        """At most every `every` seconds, look for what the stream cannot show
        (`pgcdc.pipeline._bindings.inspect_tables`): a table dropped and created again, one that
        left its publication, stops the pipeline (or sets the table aside, with
        ``on_error = "quarantine"``); a table that came back to its publication, or gained
        or lost partitions, is resynchronized while the others stream."""
        now = time.monotonic()
        if now - self._checked < every:
            return
        self._checked = now
        config = self.config
        bindings = self.bind()
        inspection = inspect_tables(
            config.conninfo, config.publications, self.targets, self.state, self._inspection
        )
        for relid, table in bindings.routes.items():  # partitions bound on the way
            inspection.bindings.routes.setdefault(relid, table)
        events = inspection.events
        stopping = [e for e in events if e.kind in ("recreated", "publish")]
        stopping += [
            e
            for e in events
            if e.kind == "unpublished" and config.on_error.get(e.table, "stop") == "stop"
        ]
        if stopping:  # (nothing recorded: the next run finds the events again)
            raise PipelineFailed(stopping[0].line)
        for event in events:
            if event.kind == "gone" and event.table not in self._warned:
                self._warned.add(event.table)
                log.warning("%s", event.line)
        self._react(inspection)
        self.bindings = inspection.bindings

    def _react(self, inspection: Inspection) -> None:
        """Act on what `inspection` found — set aside the tables that left their publication
        (with ``on_error = "quarantine"``), resynchronize those changed with no change in the
        stream — and only then record it (`Inspection.record`). A table already waiting for
        a copy keeps its records: that copy's snapshot may be older than the change."""
        waiting = set(self.pending)
        resync = []
        for event in inspection.events:
            if event.table in self.pending:
                continue
            if event.kind == "unpublished":
                self.set_aside(event.table, event.line, "")
                continue
            if not event.resync:
                continue
            on_detach = self.config.on_detach.get(event.table, "remove")
            if event.kind == "partitions" and not event.attached and on_detach == "keep":
                log.warning('%s; on_detach = "keep": their rows stay', event.line)
                continue
            log.warning("%s", event.line)
            self.quarantine.request_resync(event.table, event.line)
            self.pending.add(event.table)
            resync.append(event.table)
        inspection.record(keep=waiting)
        self._inspection = inspection
        if resync:
            self._on_resync(resync)

    def set_aside(self, table: str, reason: str, since: str) -> None:
        """Quarantine `table`: its changes go to its pending change log from now on."""
        self.quarantine.add(table, reason, since)
        self.pending.add(table)
        if self.metrics is not None:
            self.metrics.set_quarantined(table, reason)
        log.error(
            "%s is quarantined: %s; its changes go to its change log until "
            "`pgcdc recopy PIPELINE.toml %s`",
            table,
            reason,
            table,
        )
