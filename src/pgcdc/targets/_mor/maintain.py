"""Keeping a merge-on-read table near its live size, between batches.

* purge: files of at least `small_file_bytes` with at least `purge_fraction` of their rows
  deleted are rewritten without them, in their row order (one commit, ``dataChange: false``);
* compaction: files smaller than `small_file_bytes` (the batches' appends), once there are
  `compact_min_files` of them, rewritten together (without their deleted rows) in files of
  about `target_file_bytes` (delta-rs's `optimize.compact` would rewrite every file below its
  target size, the clustered base files included). A small file is left to compaction, not
  purged on its own: under updates of hot keys most of them have rows deleted, and a purge
  would write each again as a small file for the compaction to rewrite once more. "Small"
  is under a quarter of the target size: a batch of wide rows appends files of a megabyte
  or more, and left alone they pile up (measured: 56 files of about 1 MB in a 100 MB table
  after 40 s at 10,000 changes/s), each touched by the next batch's random updates (a new
  DV, its actions, a key search: the cost of a batch grows with the files it touches);
* lite vacuum (`vacuum()`, retention from ``delta.deletedFileRetentionDuration``): it
  deletes the data files of expired removes, never DV files. Never ``vacuum(full=True)``
  on a DV table: delta-rs then deletes the DV files live files use (the table breaks);
* collection: DV files and data files that neither a live file nor a remove within the
  retention refers to (superseded DVs, files of a crash before their commit), once older
  than `min_orphan_age_s` (a writer may be about to commit a younger one). Vacuum and
  collection list every file of the table and go over every remove within the retention:
  the caller asks for them (`sweep`) far less often than for the rest (measured: 356 ms a
  pass after 3,000 commits of small batches);
* a checkpoint (and the log cleanup it allows) every `checkpoint_every` commits: pgcdc's
  commits do not run delta-rs's post-commit hook.

A pass rewrites at most about `rewrite_bytes` of each kind (the files most deleted first,
the oldest small files first) and leaves the rest to the next passes: a pass runs between
two batches, and the changes committed meanwhile wait for it (measured, 10,000 changes/s
with a 2 M-row table under random updates: a pass that purged 11 files, 35 MB, and
compacted 21, 16 MB, took 0.49 s, the tail of commit-to-visible).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from pgcdc.targets._mor.commit import remove_of, write_commit, write_data_files
from pgcdc.targets._mor.format import DeletionVector
from pgcdc.targets._mor.log import tombstone_key as _tombstone_key
from pgcdc.targets._mor.table import MergeOnReadTable, retention_ms

__all__ = ["MaintenancePolicy", "MaintenanceReport", "maintain_deletion_vectors"]


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    """When `maintain_deletion_vectors` rewrites, compacts, collects and checkpoints."""

    purge_fraction: float = 0.3
    small_file_bytes: int = 2 << 20
    compact_min_files: int = 16
    target_file_bytes: int = 8 << 20
    checkpoint_every: int = 100
    vacuum: bool = True
    min_orphan_age_s: float = 3600.0
    rewrite_bytes: int = 16 << 20


@dataclass(slots=True)
class MaintenanceReport:
    """What one maintenance pass did (commits made, files and bytes)."""

    purged_files: int = 0
    purge_bytes: int = 0
    compacted_files: int = 0
    compact_bytes: int = 0
    vacuumed_files: int = 0
    collected: list[str] = field(default_factory=list)
    checkpoint: int | None = None
    commits: int = 0


def maintain_deletion_vectors(
    table: MergeOnReadTable, policy: MaintenancePolicy | None = None, *, sweep: bool = True
) -> MaintenanceReport:
    """One pass of the policy over `table` (kept open), with the vacuum and the collection
    when `sweep`; CommitConflict when another writer committed meanwhile (nothing is left
    behind: try again later)."""
    policy = policy or MaintenancePolicy()
    report = MaintenanceReport()
    table.refresh()
    candidates = []
    for path, add in table.state.adds.items():
        dv = add.get("deletionVector")
        if dv and add["size"] >= policy.small_file_bytes:
            deleted = int(dv["cardinality"]) / max(table.num_records(path), 1)
            if deleted >= policy.purge_fraction:
                candidates.append((-deleted, path))
    purged = _within(table, [[path] for _, path in sorted(candidates)], policy.rewrite_bytes)
    if purged:
        report.purge_bytes = rewrite(table, purged, "purge")
        report.purged_files = len(purged)
        report.commits += 1
    small = sorted(
        (p for p, a in table.state.adds.items() if a["size"] < policy.small_file_bytes),
        key=lambda p: table.state.adds[p].get("modificationTime", 0),
    )
    if len(small) >= policy.compact_min_files:
        bins = _within(table, _bins(table, small, policy.target_file_bytes), policy.rewrite_bytes)
        report.compact_bytes = rewrite(table, bins, "compact")
        report.compacted_files = sum(len(b) for b in bins)
        report.commits += 1
    if policy.vacuum and sweep:  # its start and end are commits
        report.vacuumed_files = len(table.table.vacuum(dry_run=False))
        table.sync()
    if sweep:
        report.collected = collect_unreferenced(table, policy.min_orphan_age_s)
    if table.state.version - _last_checkpoint(table) >= policy.checkpoint_every:
        table.table.create_checkpoint()
        table.table.cleanup_metadata()
        report.checkpoint = table.state.version
    table.forget_deleted()
    return report


def _within(table: MergeOnReadTable, groups: list[list[str]], budget: int) -> list[list[str]]:
    """The first `groups` whose files come to `budget` bytes (the first always)."""
    taken: list[list[str]] = []
    total = 0
    for group in groups:
        size = sum(table.state.adds[p]["size"] for p in group)
        if taken and total + size > budget:
            break
        taken.append(group)
        total += size
    return taken


def _bins(table: MergeOnReadTable, paths: list[str], target: int) -> list[list[str]]:
    """`paths` in groups of about `target` bytes, each of one partition."""
    groups: dict[str, list[list[str]]] = {}
    for path in paths:
        add = table.state.adds[path]
        bins = groups.setdefault(json.dumps(add.get("partitionValues") or {}, sort_keys=True), [[]])
        size = sum(table.state.adds[p]["size"] for p in bins[-1])
        if bins[-1] and size + add["size"] > target:
            bins.append([])
        bins[-1].append(path)
    return [b for bins in groups.values() for b in bins]


def rewrite(table: MergeOnReadTable, groups: list[list[str]], why: str) -> int:
    """Each group of live files rewritten as one new file of its live rows, in their order
    (one commit, ``dataChange: false``); the bytes written."""
    names = table.arrow_schema().names
    now = table.now_ms()
    version = table.state.version + 1
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "OPTIMIZE",
                "operationParameters": {"pgcdc": why},
                "readVersion": table.state.version,
                "isolationLevel": "Serializable",
                "isBlindAppend": False,
                "engineInfo": "pgcdc",
            }
        }
    ]
    written: list[str] = []
    size = 0
    try:
        for group in groups:
            parts = []
            for path in group:
                keep = np.ones(table.num_records(path), np.bool_)
                keep[table.deleted_rows(path).astype(np.int64)] = False
                parts.append(table.read_file(path, names).filter(pa.array(keep)))
                actions.append({"remove": remove_of(table.state.adds[path], now, False)})
            live = pa.concat_tables(parts)
            for add in write_data_files(table, live, data_change=False) if live.num_rows else []:
                written.append(table.file_path(add["path"]))
                size += add["size"]
                actions.append({"add": add})
        write_commit(table, version, actions)
    except BaseException:
        for local in written:
            with contextlib.suppress(OSError):
                os.unlink(local)
        raise
    table.state.apply(version, actions)
    table.table.update_incremental()
    table.sync()
    return size


def _dv_file(table: MergeOnReadTable, action: dict[str, Any]) -> str | None:
    dv = action.get("deletionVector")
    return None if not dv else DeletionVector.from_action(dv).file_path(table.table_dir)


def collect_unreferenced(table: MergeOnReadTable, min_age_s: float) -> list[str]:
    """Deletes the DV and data files no live file and no remove within the retention refers
    to, older than `min_age_s`; their paths (relative to the table)."""
    now = table.now_ms()
    keep_ms = retention_ms(table.configuration)
    tombstones = table.state.live_tombstones(now, keep_ms)
    table.state.tombstones = {_tombstone_key(r): r for r in tombstones}  # the rest expired
    referenced = set()
    for action in [*table.state.adds.values(), *tombstones]:
        referenced.add(os.path.normpath(table.file_path(action["path"])))
        dv_path = _dv_file(table, action)
        if dv_path is not None:
            referenced.add(os.path.normpath(dv_path))
    cutoff = time.time() - min_age_s
    collected = []
    for directory, subdirs, files in os.walk(table.table_dir):
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]
        for name in files:
            if not (name.startswith("deletion_vector_") and name.endswith(".bin")) and not (
                name.endswith(".parquet") and not name.startswith(("_", "."))
            ):
                continue
            local = os.path.normpath(os.path.join(directory, name))
            if local in referenced:
                continue
            try:
                if os.stat(local).st_mtime > cutoff:
                    continue
                os.unlink(local)
            except FileNotFoundError:
                continue
            collected.append(os.path.relpath(local, table.table_dir))
    log_dir = os.path.join(table.table_dir, "_delta_log")
    for name in os.listdir(log_dir):  # commits a crash left unnamed (`write_commit`)
        local = os.path.join(log_dir, name)
        if name.startswith(".") and name.endswith(".tmp") and os.stat(local).st_mtime <= cutoff:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
    return collected


def _last_checkpoint(table: MergeOnReadTable) -> int:
    try:
        with open(os.path.join(table.table_dir, "_delta_log", "_last_checkpoint")) as f:
            return int(json.load(f)["version"])
    except FileNotFoundError:
        return 0
