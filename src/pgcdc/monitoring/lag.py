"""How far behind its source a pipeline is, in seconds: the server's clock minus the commit
time of the oldest change not yet applied (0 when none waits).

A running pipeline knows it exactly (its spool holds the pending transactions with their
commit times, and its session knows when it has everything) and writes it every few seconds
to ``<state>/lag.json`` beside the Prometheus gauge. `current_lag` is what `pgcdc status`
shows: the running pipeline's figure while that file is fresh; else (the pipeline stopped)
the server's clock minus the last commit applied, growing for as long as WAL waits behind the
slot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pgcdc.errors import StorageError
from pgcdc.storage import FileIO

__all__ = ["LAG_FILE", "LagReport", "current_lag", "read_lag", "write_lag"]

#: The file of the pipeline's state the figure is in.
LAG_FILE = "lag.json"

#: A lag.json older than this is a stopped pipeline's.
FRESH = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class LagReport:
    #: When the pipeline measured it.
    at: datetime
    seconds: float
    #: WAL the server has that the pipeline has not applied (None: not known).
    bytes: int | None


def write_lag(state: FileIO, report: LagReport) -> None:
    """The figure into the pipeline's `state` (not synced to disk: the next comes soon)."""
    data = {"at": report.at.isoformat(), "seconds": report.seconds, "bytes": report.bytes}
    state.write(LAG_FILE, json.dumps(data).encode(), durable=False)


def read_lag(state: FileIO) -> LagReport | None:
    """The running pipeline's last figure (None: none, or it cannot be read: the status
    then works it out from the server)."""
    try:
        text = state.read(LAG_FILE)
        if text is None:
            return None
        data = json.loads(text)
        return LagReport(datetime.fromisoformat(data["at"]), float(data["seconds"]), data["bytes"])
    except (StorageError, ValueError, KeyError, TypeError):
        return None


def current_lag(
    report: LagReport | None,
    server_now: datetime,
    last_applied_commit: datetime | None,
    behind_bytes: int | None,
) -> float | None:
    """The lag in seconds as of `server_now`: a running pipeline's own figure (`report`,
    fresh), else the server's clock minus the last commit applied when WAL waits behind the
    slot (`behind_bytes`), 0 when none does; None when nothing was ever applied."""
    if report is not None and server_now - report.at.astimezone(UTC) <= FRESH:
        return report.seconds
    if behind_bytes is not None and behind_bytes <= 0:
        return 0.0
    if last_applied_commit is None:
        return None
    return max(0.0, (server_now - last_applied_commit).total_seconds())
