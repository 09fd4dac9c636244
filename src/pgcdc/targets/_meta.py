"""What a Delta target records in its commits' metadata, beside its data (no I/O but reading a
table's latest commits).

* a batch's last commit: the watermark (the application transaction of the writer's app id)
  and the relation's columns as of the batch's last change (`COLUMNS`: name, type OID, type
  modifier, key, attnum), which the next batch tells added, renamed and retyped columns by;
* a batch's commit that is not its last (a batch in which the replica identity changes is
  written one run at a time): the last change it holds (`PARTIAL`), so that a replay after a
  crash between them skips what is in;
* an initial copy's chunk: the chunk, the copy's point and its rows (`CHUNK_KEY`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.targets._mor.log import commit_path, local_log_dir
from pgcdc.targets.fold import Seq

__all__ = [
    "CHUNK_KEY",
    "COLUMNS",
    "PARTIAL",
    "POINT_KEY",
    "ROWS_KEY",
    "batch_commit",
    "last_commit",
    "latest_columns",
    "partial_commit",
    "partial_seq",
    "recorded",
    "recorded_columns",
    "recorded_keys",
    "unapplied",
]

#: Commit metadata of an initial copy's chunk: the chunk, the copy's point, its rows.
CHUNK_KEY, POINT_KEY, ROWS_KEY = (
    "pgcdc.snapshot.chunk",
    "pgcdc.snapshot.point",
    "pgcdc.snapshot.rows",
)
#: Commit metadata: the last change of a batch's commit that is not its last; the
#: relation's columns as of a batch's last change.
PARTIAL, COLUMNS = "pgcdc.partial", "pgcdc.columns"
#: The most commits `DeltaTarget.maintain` makes in a row (compaction, vacuum start and end).
MAINTENANCE_COMMITS = 4


def recorded_columns(columns: Iterable[ColumnInfo]) -> str:
    """The `COLUMNS` metadata: [name, type OID, type modifier, key, attnum] per column."""
    return json.dumps([[c.name, c.type_oid, c.type_modifier, c.key, c.attnum] for c in columns])


def recorded(last: dict[str, Any]) -> tuple[ColumnInfo, ...] | None:
    """The relation's columns recorded with the last batch (None: not recorded). Older
    tables recorded fewer fields (names only, then no key flag, then no attnum)."""
    found = json.loads(last.get(COLUMNS) or "null")
    if found is None:
        return None
    columns = []
    for entry in found:
        fields: list[Any] = [entry] if isinstance(entry, str) else list(entry)
        name, type_oid, modifier, key, attnum = [*fields, 0, -1, None, 0][:5]
        columns.append(ColumnInfo(str(name), int(type_oid), int(modifier), bool(key), int(attnum)))
    return tuple(columns)


def recorded_keys(columns: tuple[ColumnInfo, ...] | None) -> tuple[str, ...] | None:
    """The key columns recorded with the last batch (None: not recorded)."""
    if columns is None or not columns or any(c.type_oid == 0 for c in columns):
        return None
    return tuple(c.name for c in columns if c.key)


def batch_commit(app_id: str, high: int, shape: Shape) -> CommitProperties:
    """A batch's last commit: the watermark, and the columns of the relation as of the
    batch's last change, with their types and attnums."""
    return CommitProperties(
        app_transactions=[Transaction(app_id, high)],
        custom_metadata={COLUMNS: recorded_columns(shape.columns)},
    )


def partial_commit(app_id: str, seq: Seq) -> CommitProperties:
    """A batch's commit that is not its last: the last change it holds."""
    marker = json.dumps({"app_id": app_id, "commit_lsn": seq[0], "ordinal": seq[1]})
    return CommitProperties(custom_metadata={PARTIAL: marker})


def last_commit(table: DeltaTable | None, location: str | None = None) -> dict[str, Any]:
    """The information (custom metadata included) of the latest commit that applied changes:
    maintenance commits in between are passed over. Given the table's `location` on a local
    filesystem, the latest commit's file is read first (the usual case: it is the one; the
    history lists the whole log)."""
    if table is None:
        return {}
    log_dir = None if location is None else local_log_dir(location)
    if log_dir is not None:
        info = _commit_info(log_dir, table.version())
        if info is not None and (PARTIAL in info or COLUMNS in info):
            return info
    for commit in table.history(MAINTENANCE_COMMITS + 1):
        if PARTIAL in commit or COLUMNS in commit:
            return commit
    return {}


def latest_columns(table: DeltaTable) -> str | None:
    """The `COLUMNS` of the newest commit that recorded them (None: none did), however far
    back: what a commit that holds no change (an initial copy's mark, after its reset and
    its chunks) records again, so that the next run knows the columns as of its watermark."""
    for commit in table.history():
        if COLUMNS in commit:
            return str(commit[COLUMNS])
    return None


def _commit_info(log_dir: str, version: int) -> dict[str, Any] | None:
    """The commit's information: its actions are read up to it (a writer puts it first; a
    batch's commit holds an action per file it touched, each with the file's statistics)."""
    try:
        with open(commit_path(log_dir, version), encoding="utf-8") as f:
            for line in f:
                if line.strip() and "commitInfo" in (action := json.loads(line)):
                    return {**action["commitInfo"], "version": version}
    except FileNotFoundError:
        return None
    return None


def partial_seq(last: dict[str, Any], app_id: str, watermark: int | None) -> Seq | None:
    """The last change in the table, when its latest commit is one of a batch that did not
    finish (a crash came before the batch's last commit)."""
    marker = last.get(PARTIAL)
    if marker is None:
        return None
    data = json.loads(marker)
    seq = (int(data["commit_lsn"]), int(data["ordinal"]))
    if data.get("app_id") != app_id or (watermark is not None and seq[0] <= watermark):
        return None
    return seq


def unapplied(rows: pa.Table, watermark: int | None, partial: Seq | None) -> pa.Table:
    """The envelope rows past the watermark and past the last change of a batch that did
    not finish (`partial_seq`): those a replay must still apply."""
    lsns = rows.column("commit_lsn")
    if rows.num_rows and watermark is not None and pc.min(lsns).as_py() <= watermark:
        rows = rows.filter(pc.greater(lsns, pa.scalar(watermark)))  # (a filter copies all)
    if partial is not None and rows.num_rows:
        lsn, ordinal = partial
        lsns, ordinals = rows.column("commit_lsn"), rows.column("ordinal")
        done = pc.or_(
            pc.less(lsns, lsn), pc.and_(pc.equal(lsns, lsn), pc.less_equal(ordinals, ordinal))
        )
        rows = rows.filter(pc.invert(done))
    return rows
