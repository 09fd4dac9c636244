"""The live files of a Delta table, read from its log by pgcdc itself.

delta-rs gives a table's files without their deletion vectors (`get_add_actions` has no DV
column, `deletion_vectors()` materializes every file's keep-mask), so a writer of DVs replays
the log: the newest complete checkpoint at or before a version (classic or multi-part
Parquet), then the JSON commits after it, and afterwards only the commits that follow
(`advance`), as `DeltaTable.update_incremental` does. What it keeps: the live `add` actions
by path and the `remove` actions (tombstones) a vacuum still honours, both as the log holds
them (JSON field names).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable

from pgcdc.targets._mor.format import unique_id

__all__ = ["LogGap", "LogState", "commit_path", "read_commit", "tombstone_key"]

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


class LogGap(Exception):
    """A commit between the version known and the one asked for is gone (a log cleanup
    after a checkpoint): the state must be read anew."""


def commit_path(log_dir: str, version: int) -> str:
    return os.path.join(log_dir, f"{version:020d}.json")


def read_commit(log_dir: str, version: int) -> list[dict[str, Any]]:
    """The actions of one commit file."""
    with open(commit_path(log_dir, version), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def local_log_dir(location: str) -> str | None:
    """The ``_delta_log`` directory of a table at `location`, when it is on a local
    filesystem (a path or a ``file://`` URI); None for an object store."""
    if "://" in location and not location.startswith("file://"):
        return None
    return os.path.join(location.removeprefix("file://"), "_delta_log")


def update(table: DeltaTable, log_dir: str | None) -> None:
    """`table` brought up to date (`update_incremental`); for a local table (`log_dir`) only
    when its log has a commit past the version it has (listing the log costs milliseconds
    once it holds thousands of commits; two file checks do not). FileNotFoundError when a
    local table's log is gone (removed under it)."""
    if log_dir is not None:
        if not os.path.isdir(log_dir):
            raise FileNotFoundError(f"{log_dir} is gone")
        version = table.version()
        if os.path.exists(commit_path(log_dir, version)) and not os.path.exists(
            commit_path(log_dir, version + 1)
        ):
            return
    table.update_incremental()


def tombstone_key(remove: dict[str, Any]) -> tuple[str, str]:
    dv = remove.get("deletionVector")
    return remove["path"], "" if not dv else unique_id(dv)


def _plain(value: Any) -> Any:
    """A checkpoint value (Arrow maps as lists of pairs, nulls for absent fields) in the
    shape of the JSON log."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return {k: v for k, v in value}
    return value


@dataclass(slots=True)
class LogState:
    """The live files of the table in `table_dir` as of `version`."""

    table_dir: str
    version: int = -1
    adds: dict[str, dict[str, Any]] = field(default_factory=dict)
    tombstones: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    checkpoint_version: int = -1

    @property
    def log_dir(self) -> str:
        return os.path.join(self.table_dir, "_delta_log")

    @classmethod
    def read(cls, table_dir: str, version: int) -> LogState:
        """The state at `version`, from the newest complete checkpoint at or before it."""
        state = cls(table_dir)
        checkpoint, parts = state._newest_checkpoint(version)
        if checkpoint >= 0:
            for part in parts:
                state._read_checkpoint_part(part)
            state.version = state.checkpoint_version = checkpoint
        state.advance(version)
        return state

    def _newest_checkpoint(self, version: int) -> tuple[int, list[str]]:
        found: dict[int, dict[int, str]] = {}
        expected: dict[int, int] = {}
        for name in os.listdir(self.log_dir):
            match = _CHECKPOINT.match(name)
            if match is None or int(match.group(1)) > version:
                continue
            v = int(match.group(1))
            part, total = (int(match.group(2)), int(match.group(3))) if match.group(2) else (1, 1)
            found.setdefault(v, {})[part] = os.path.join(self.log_dir, name)
            expected[v] = total
        for v in sorted(found, reverse=True):
            if len(found[v]) == expected[v]:
                return v, [found[v][p] for p in sorted(found[v])]
        return -1, []

    def _read_checkpoint_part(self, path: str) -> None:
        columns = [c for c in ("add", "remove") if c in pq.read_schema(path).names]
        table = pq.read_table(path, columns=columns)
        for column in columns:
            for value in table.column(column).to_pylist():
                if value is None:
                    continue
                action = _plain(value)
                action.pop("stats_parsed", None)
                if column == "add":
                    self.adds[action["path"]] = action
                else:
                    self.tombstones[tombstone_key(action)] = action

    def advance(self, version: int) -> None:
        """Reads the commits after the version known up to `version`."""
        for v in range(self.version + 1, version + 1):
            try:
                actions = read_commit(self.log_dir, v)
            except FileNotFoundError:
                raise LogGap(f"{commit_path(self.log_dir, v)} is gone") from None
            self.apply(v, actions)

    def apply(self, version: int, actions: list[dict[str, Any]]) -> None:
        """Applies the actions of commit `version` (the next one)."""
        if version != self.version + 1:
            raise ValueError(f"commit {version} applied to the state of version {self.version}")
        added = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
        for action in actions:
            remove = action.get("remove")
            if remove is not None:
                # a path removed and added in one commit is the same file with a new DV
                if remove["path"] not in added:
                    self.adds.pop(remove["path"], None)
                self.tombstones[tombstone_key(remove)] = remove
        self.adds.update(added)
        self.version = version

    def live_tombstones(self, now_ms: int, retention_ms: int) -> list[dict[str, Any]]:
        """The removes whose files a reader of a version within the retention may need."""
        cutoff = now_ms - retention_ms
        return [r for r in self.tombstones.values() if r.get("deletionTimestamp", 0) > cutoff]
