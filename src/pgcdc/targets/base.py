"""What a target is: one source table kept in one table of some format, exactly once.

`Target` is the one interface the stream and the initial copy both write through: `apply` a
batch of change envelopes (`pgcdc.envelope`), `write_chunk` a chunk of an initial copy,
`mark` the copy's point, and `watermark`, the highest commit LSN the target holds (what lets
a replayed batch change nothing). `open_target` makes the target a configuration names;
Delta Lake (`pgcdc.targets.delta`) is the format there is today. Storage is the format's
business: a path or a URI (``s3://``, ``abfss://``, ``gs://``) with `storage_options`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import pyarrow as pa

from pgcdc.envelope import SEQUENCE_TYPE, ChangeBatch, ColumnInfo
from pgcdc.protocol import Relation
from pgcdc.types.registry import DEFAULT_REGISTRY, TypeRegistry

__all__ = [
    "END_AT",
    "MODES",
    "SEQUENCE_TYPE",
    "START_AT",
    "ApplyResult",
    "Mode",
    "Target",
    "TargetSpec",
    "TargetState",
    "copy_watermark",
    "history_columns",
    "open_target",
]

#: The bytes of target files' columns a process keeps decoded between batches, for the
#: rows batches read back (`pgcdc.targets.decoded_columns`; the pipeline's
#: ``target.read_cache``).
READ_CACHE_BYTES = 1 << 30

Mode = Literal["mirror", "history", "changelog"]
MODES: tuple[Mode, ...] = ("mirror", "history", "changelog")
#: A history's version columns (struct<commit_lsn, ordinal>; END_AT null: the current one).
START_AT = "__START_AT"
END_AT = "__END_AT"


@dataclass(slots=True)
class ApplyResult:
    """What one `Target.apply` did.

    `applied`: rows above the watermark (the ones used); `skipped`: rows at or below it.
    `upserts`: rows upserted (mirror), versions opened (history) or rows appended (changelog);
    `deletes`: keys deleted (mirror) or delete changes applied (history). `watermark`: the
    highest commit LSN applied, after this call. `version`: the table version of the last
    commit made, None when nothing was written. `fold_seconds`: reading the watermark,
    folding and typing; `write_seconds`: the commits."""

    applied: int
    skipped: int
    upserts: int
    deletes: int
    watermark: int | None
    version: int | None
    fold_seconds: float = 0.0
    write_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class TargetState:
    """What `pgcdc status` shows of a target."""

    exists: bool
    watermark: int | None = None
    rows: int | None = None
    version: int | None = None
    #: When the table's last commit was made.
    last_commit_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A target as a configuration names it (pickles: tasks open it themselves)."""

    path: str
    mode: Mode
    format: str = "delta"
    storage_options: Mapping[str, str] | None = None
    #: The table's properties over pgcdc's (`pgcdc.targets._table.TABLE_PROPERTIES`).
    properties: Mapping[str, str] | None = None


class Target(ABC):
    """One source table kept in one target table (see the module docstring)."""

    path: str
    mode: Mode
    app_id: str
    #: How values are typed (the built-in types and the descriptions of the others).
    registry: TypeRegistry

    @property
    @abstractmethod
    def spec(self) -> TargetSpec:
        """How to open this target again (in a Spark task)."""

    @property
    @abstractmethod
    def exists(self) -> bool:
        """Whether the table was created."""

    @property
    @abstractmethod
    def watermark(self) -> int | None:
        """The highest commit LSN applied (None: nothing applied yet)."""

    @abstractmethod
    def apply(self, rows: pa.Table | ChangeBatch) -> ApplyResult:
        """Apply a batch of the source table (envelope rows, or a `ChangeBatch`: whole
        transactions, any order); rows at or below the watermark are skipped. A batch that
        raises writes nothing that a replay would not write again."""

    @abstractmethod
    def write_chunk(self, rows: pa.Table, chunk: str, point: int, position: int) -> None:
        """Append one chunk of an initial copy taken at `point` (typed rows of the table;
        `position`: the chunk's place in its table's plan), in one commit that names the
        chunk."""

    @abstractmethod
    def recorded_columns(self) -> tuple[ColumnInfo, ...] | None:
        """The source relation's columns as of the last change applied (or the copy), with
        what each is (its attnum); None when not known."""

    @abstractmethod
    def copied_chunks(self, point: int) -> dict[str, int]:
        """Chunk id -> rows, of the copy at `point`, that the table holds."""

    @abstractmethod
    def reconcile(
        self,
        rows: pa.Table,
        point: int,
        keys: Sequence[str],
        *,
        keep_missing: bool = False,
        columns: Sequence[ColumnInfo] = (),
    ) -> None:
        """Make the table equal `rows` (the source table at `point`, after the slot was
        lost, or rows moved without changes), changing only what differs; the watermark
        becomes `copy_watermark(point)`. `keys`: the table's key (none: rows are compared
        whole, as a multiset). `keep_missing`: rows the source does not have stay. `columns`:
        the source's columns as of the copy (with their attnums), which the target's follow."""

    @abstractmethod
    def mark(self, watermark: int) -> None:
        """Record `watermark` without data (an initial copy's point)."""

    @abstractmethod
    def reset(
        self,
        relation: Relation,
        registry: TypeRegistry | None = None,
        attnums: Sequence[int] = (),
    ) -> None:
        """Empty the table and give it `relation`'s columns, what they are by `attnums` (a
        copy that starts over)."""

    @abstractmethod
    def to_arrow(self) -> pa.Table:
        """The table's current contents (row order unspecified)."""

    @abstractmethod
    def state(self) -> TargetState:
        """The target's watermark, rows and last commit, read from its metadata."""

    @abstractmethod
    def maintain(self) -> bool:
        """Keep the table cheap to read as it grows (called after a batch's commit, or
        between batches); whether a pass ran."""

    def warm(self) -> None:  # noqa: B027 (a target with nothing to read ahead has nothing)
        """Read ahead what the first batch would read of the table (a target kept open
        between batches, before the first one)."""


def open_target(
    spec: TargetSpec,
    *,
    app_id: str,
    registry: TypeRegistry | None = None,
    source: str | None = None,
    **options: Any,
) -> Target:
    """The target `spec` names (the factory of every format)."""
    if spec.format != "delta":
        raise ValueError(f"unknown target format {spec.format!r} (known: delta)")
    from pgcdc.targets.delta import DeltaTarget

    return DeltaTarget(
        spec.path,
        spec.mode,
        app_id=app_id,
        storage_options=dict(spec.storage_options) if spec.storage_options else None,
        properties=dict(spec.properties) if spec.properties else None,
        source=source,
        registry=registry or DEFAULT_REGISTRY,
        **options,
    )


def copy_watermark(point: int) -> int:
    """The watermark of a copy taken under the exported snapshot of a slot whose consistent
    point is `point`: it holds exactly the transactions whose commit LSN is below the point.

    The server's snapshot builder turns consistent on reading a running-transactions record
    and sets the slot's start (``confirmed_flush``, the consistent point) to that record's
    end; the exported snapshot counts as committed only the transactions whose commit record
    it read before. Decoding then skips a transaction whose commit record starts before the
    start point and sends every other one. A commit record that starts exactly at the point
    (the next WAL record) is therefore not in the snapshot and is streamed, its Begin carrying
    final_lsn = point: the copy holds "commit LSN < point", so the targets record point - 1
    and apply every change at or after the point."""
    return int(point) - 1


def history_columns(rows: pa.Table, point: int, position: int) -> pa.Table:
    """Copied rows as history versions: each starts at the copy's point with its own
    (negative) ordinal, so that identical rows (a table without a key) are distinct
    versions, before any change there; none has ended."""
    import numpy as np

    first = -(position << 32) - 1
    ordinals = pa.array(np.arange(first, first - rows.num_rows, -1), pa.int64())
    points = pa.array(np.full(rows.num_rows, point, np.int64))
    start = pa.StructArray.from_arrays([points, ordinals], fields=list(SEQUENCE_TYPE))
    rows = rows.append_column(START_AT, start)
    return rows.append_column(END_AT, pa.nulls(rows.num_rows, SEQUENCE_TYPE))
