"""The pipeline's batch log: one JSON line per batch, for `pgcdc status` and its plot.

Appended and flushed line by line by one writer; read at any time by others (a line still
being written, without its newline, is not read yet). Bounded on disk: past `max_bytes` the
file becomes ``NAME.1`` (replacing the one before) and a new file starts, so the log holds
between `max_bytes` and twice that, and `read` reads both files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pgcdc.errors import MonitoringError

__all__ = ["DEFAULT_MAX_BYTES", "BatchLog", "BatchRecord", "TargetApply"]

DEFAULT_MAX_BYTES = 8 << 20

#: Per target ("schema.table mode"): {"rows": rows applied, "seconds": time applying them}.
TargetApply = dict[str, dict[str, int | float]]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch of the pipeline, as it finished."""

    #: When the batch finished (UTC, timezone-aware).
    time: datetime
    #: The batch's number.
    batch: int
    #: Changes in the batch, and their size in bytes.
    changes: int
    bytes: int
    #: Commit LSNs (``X/Y``) of the batch's first and last transactions.
    first_commit_lsn: str | None = None
    last_commit_lsn: str | None = None
    #: Commit time of the batch's last transaction.
    last_commit_time: datetime | None = None
    #: The server's WAL position when the batch was planned (``X/Y``).
    server_lsn: str | None = None
    #: What the server had that the targets had not yet, after this batch: in bytes of WAL
    #: and in seconds (the server's clock minus the last commit applied).
    lag_bytes: int | None = None
    lag_seconds: float | None = None
    #: The whole batch, in seconds.
    seconds: float = 0.0
    targets: TargetApply = field(default_factory=dict)
    #: Where the batch's time went, in seconds: "plan" (the driver), "apply" (wall, until
    #: every table's work returned: "inline" when the driver applied the batch itself, "job"
    #: for a Spark job), and summed over the tables: "read" (spool to envelope), "fold"
    #: (folding, typing), "write" (MERGE or append and its commit), "maintain".
    phases: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("time", "last_commit_time"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"BatchRecord.{name} must be timezone-aware, got {value}")

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time.isoformat(),
            "batch": self.batch,
            "changes": self.changes,
            "bytes": self.bytes,
            "first_commit_lsn": self.first_commit_lsn,
            "last_commit_lsn": self.last_commit_lsn,
            "last_commit_time": (
                None if self.last_commit_time is None else self.last_commit_time.isoformat()
            ),
            "server_lsn": self.server_lsn,
            "lag_bytes": self.lag_bytes,
            "lag_seconds": self.lag_seconds,
            "seconds": self.seconds,
            "targets": self.targets,
            "phases": self.phases,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRecord:
        """The inverse of `to_json`; ValueError, KeyError or TypeError for anything else."""
        last_commit = data.get("last_commit_time")
        targets = data.get("targets") or {}
        phases = data.get("phases") or {}
        if not isinstance(targets, dict) or not isinstance(phases, dict):
            raise TypeError("targets and phases must be objects")
        return cls(
            time=datetime.fromisoformat(data["time"]),
            batch=int(data["batch"]),
            changes=int(data["changes"]),
            bytes=int(data["bytes"]),
            first_commit_lsn=data.get("first_commit_lsn"),
            last_commit_lsn=data.get("last_commit_lsn"),
            last_commit_time=None if last_commit is None else datetime.fromisoformat(last_commit),
            server_lsn=data.get("server_lsn"),
            lag_bytes=None if data.get("lag_bytes") is None else int(data["lag_bytes"]),
            lag_seconds=None if data.get("lag_seconds") is None else float(data["lag_seconds"]),
            seconds=float(data.get("seconds", 0.0)),
            targets={
                str(name): {"rows": int(t["rows"]), "seconds": float(t["seconds"])}
                for name, t in targets.items()
            },
            phases={str(name): float(seconds) for name, seconds in phases.items()},
        )


class BatchLog:
    """The batch log at `path` (and its older half ``path.1``)."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.path = Path(path)
        self.rotated = self.path.with_name(self.path.name + ".1")
        self.max_bytes = max_bytes

    def append(self, record: BatchRecord) -> None:
        """Add one line (flushed; not fsynced: a lost line costs a point of a plot)."""
        line = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        try:
            if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                os.replace(self.path, self.rotated)
            with open(self.path, "ab") as file:
                file.write(line)
        except OSError as exc:
            raise MonitoringError(f"cannot write the batch log {self.path}: {exc}") from None

    def read(self, since: datetime | None = None) -> list[BatchRecord]:
        """The records (oldest first), those at or after `since` if given."""
        records = [r for p in (self.rotated, self.path) for r in self._read_file(p)]
        return records if since is None else [r for r in records if r.time >= since]

    def _read_file(self, path: Path) -> list[BatchRecord]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise MonitoringError(f"cannot read the batch log {path}: {exc}") from None
        records = []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written comes later
        for number, line in enumerate(complete.splitlines(), 1):
            try:
                records.append(BatchRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MonitoringError(
                    f"{path}: line {number} is not a batch record: {type(exc).__name__}: {exc}"
                ) from None
        return records
