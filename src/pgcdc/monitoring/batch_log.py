"""The pipeline's batch log: one JSON line per batch, for `pgcdc status` and its plot.

It lives where the pipeline's state does, a local directory or an object store, which has no
append: the log is a directory of segments (``batches/0000000001.jsonl``, ...), each a few
hundred lines. Its one writer holds the newest segment and writes it whole after every batch
(an atomic replacement: a reader sees a segment with or without the new line, never a part);
a segment past `segment_bytes` is left as it is and the next one starts; the oldest are
removed so that the log stays under `max_bytes`. A writer that starts again goes on with the
newest segment. Readers read every segment at any time, oldest first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgcdc.errors import MonitoringError, StorageError
from pgcdc.storage import FileIO, open_file_io

__all__ = [
    "BATCH_LOG",
    "DEFAULT_MAX_BYTES",
    "SEGMENT_BYTES",
    "BatchLog",
    "BatchRecord",
    "TargetApply",
]

#: The directory of a pipeline's state the log is in.
BATCH_LOG = "batches"

DEFAULT_MAX_BYTES = 8 << 20
#: A segment's size, about: what one batch costs to write (one PUT on an object store).
SEGMENT_BYTES = 128 << 10

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
    #: (folding, typing), "write" (MERGE or append and its commit), "maintain" (in a job's
    #: tasks; for batches the driver applies, its passes between the last batch and this).
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
    """The batch log whose segments are the files of `log` (see the module docstring)."""

    def __init__(
        self,
        log: FileIO,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError(f"max_bytes and segment_bytes must be positive, got {max_bytes}")
        self.log = log
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        #: Segments kept (the newest, the one being written included): under `max_bytes`.
        self._keep = max(1, max_bytes // self.segment_bytes)
        #: The newest segment's number and content (the writer's), once known.
        self._number = 0
        self._segment = bytearray()

    @classmethod
    def at(
        cls,
        location: str | os.PathLike[str],
        storage_options: Mapping[str, str] | None = None,
        **limits: int,
    ) -> BatchLog:
        """The batch log in the directory (or under the URI) `location`."""
        try:
            return cls(open_file_io(str(location), storage_options), **limits)
        except StorageError as exc:
            raise MonitoringError(f"the batch log: {exc}") from None

    @property
    def location(self) -> str:
        return self.log.root

    @staticmethod
    def _name(number: int) -> str:
        return f"{number:010d}.jsonl"

    def _segments(self) -> list[tuple[int, str]]:
        found = []
        for name in self.log.list():
            stem = name.removesuffix(".jsonl")
            if name.endswith(".jsonl") and stem.isdigit():
                found.append((int(stem), name))
        return sorted(found)

    def _resume(self) -> None:
        """Go on with the newest segment (a new one after it when it is full or was left
        with a line cut short), and remove what is past the budget."""
        segments = self._segments()
        self._number = segments[-1][0] if segments else 1
        newest = self.log.read(segments[-1][1]) if segments else None
        if newest is not None and len(newest) < self.segment_bytes and newest.endswith(b"\n"):
            self._segment = bytearray(newest)
        elif segments:
            self._number += 1
        self._prune([n for n, _ in segments])

    def _prune(self, numbers: list[int]) -> None:
        """Keep the newest segments that fit in `max_bytes` (the one written now included)."""
        for number in numbers:
            if number <= self._number - self._keep:
                self.log.delete(self._name(number))

    def _next_segment(self) -> None:
        self._number += 1
        self._segment = bytearray()
        self._prune([self._number - self._keep])

    def append(self, record: BatchRecord) -> None:
        """Add one line (not synced to disk locally: a lost line costs a point of a plot)."""
        line = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        try:
            if not self._number:
                self._resume()
            if self._segment and len(self._segment) + len(line) > self.segment_bytes:
                self._next_segment()
            self._segment += line
            self.log.write(self._name(self._number), bytes(self._segment), durable=False)
        except StorageError as exc:
            raise MonitoringError(f"cannot write the batch log: {exc}") from None

    def read(self, since: datetime | None = None) -> list[BatchRecord]:
        """The records (oldest first), those at or after `since` if given."""
        try:
            segments = self._segments()
            records = [r for _, name in segments for r in self._read_segment(name)]
        except StorageError as exc:
            raise MonitoringError(f"cannot read the batch log: {exc}") from None
        return records if since is None else [r for r in records if r.time >= since]

    def _read_segment(self, name: str) -> list[BatchRecord]:
        data = self.log.read(name)
        if data is None:  # removed by the writer since the listing
            return []
        records = []
        # A line cut short (by a writer that died mid-append: not this one) is not read.
        complete = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(complete.splitlines(), 1):
            try:
                records.append(BatchRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MonitoringError(
                    f"{self.log.location(name)}: line {number} is not a batch record: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        return records
