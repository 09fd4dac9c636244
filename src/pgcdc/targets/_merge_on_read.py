"""A batch written with deletion vectors (merge-on-read, `pgcdc.targets._mor`): the target's
rows of the batch's keys are marked deleted and their new versions appended, with the
watermark, in one commit. What a copy-on-write MERGE does, at the cost of the rows changed
instead of the files holding them.

Used for a mirror's and a history's batches when the table has deletion vectors enabled
(``delta.enableDeletionVectors``, pgcdc's default for local tables) and pgcdc can write its
commits (a local file system, no feature a hand-written commit would break), and the batch
brings no column the table lacks; otherwise `pgcdc.targets._merge.Writer` merges
copy-on-write. The table (`TableIO`) stays open between batches, and so does the
`MergeOnReadTable` over it with its key indexes.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from pgcdc.envelope import Shape
from pgcdc.targets._arrow import ACTION, conform, with_column
from pgcdc.targets._mor import (
    CommitConflict,
    DeletionVectorsUnsupported,
    MaintenancePolicy,
    Matches,
    MergeOnReadTable,
    RowCondition,
    RowLocator,
    commit_delete_and_append,
    maintain_deletion_vectors,
)
from pgcdc.targets._mor.format import Rows
from pgcdc.targets._table import TableIO
from pgcdc.targets.base import END_AT, START_AT, Mode

__all__ = ["MergeOnRead"]

log = logging.getLogger("pgcdc.targets.delta")

#: How often a commit another writer made first is retried (located anew each time).
RETRIES = 3


class MergeOnRead:
    """Deletion-vector writes to the table `io` holds, for a target of `mode`."""

    def __init__(self, io: TableIO, mode: Mode, policy: MaintenancePolicy | None = None) -> None:
        self.io = io
        self.mode = mode
        target = int(io.properties["delta.targetFileSize"])
        self.policy = policy or MaintenancePolicy(
            small_file_bytes=target // 4, target_file_bytes=target
        )
        self._table: MergeOnReadTable | None = None
        self._locators: dict[tuple[str, ...], RowLocator] = {}
        #: Why the table cannot be written so (said once), or None.
        self.refused: str | None = None

    def active(self, table: DeltaTable) -> bool:
        """Whether the table has deletion vectors enabled and pgcdc can write its commits."""
        enabled = self.io.properties.get("delta.enableDeletionVectors") == "true"
        return enabled and self.table(table) is not None

    def usable(self, table: DeltaTable, schema: pa.Schema) -> bool:
        """Whether a batch of `schema` can be written with deletion vectors: `active`, and
        the batch adds no column to the table."""
        return set(schema.names) <= set(self.io.schema(table).names) and self.active(table)

    def table(self, table: DeltaTable) -> MergeOnReadTable | None:
        current = self._table
        if current is not None and current.table is table:
            return current
        self._locators.clear()
        self._table = None
        if self.refused is not None:
            return None
        try:
            self._table = MergeOnReadTable(table)
        except DeletionVectorsUnsupported as exc:
            self.refused = str(exc)
            log.info("%s: merged copy-on-write (%s)", self.io.path, exc)
        return self._table

    def _locator(self, table: MergeOnReadTable, keys: tuple[str, ...]) -> RowLocator:
        locator = self._locators.get(keys)
        if locator is None or locator.table is not table or locator.schema != table.arrow_schema():
            condition = RowCondition(null=(END_AT,)) if self.mode == "history" else None
            locator = self._locators[keys] = RowLocator(table, keys, condition)
        return locator

    def current(
        self, table: DeltaTable, key_names: tuple[str, ...], keys: pa.Table, columns: list[str]
    ) -> Matches | None:
        """The target's live rows (a history's current versions) of the keys of `keys`
        (typed, a row per key asked), with `columns` as their values: found through the key
        indexes kept between batches instead of a query that reads the files anew. None when
        the table is not written with deletion vectors."""
        if not self.active(table):
            return None
        mor = self.table(table)
        assert mor is not None
        return self._locator(mor, key_names).locate(keys, columns)

    def warm(self, table: DeltaTable, key_names: tuple[str, ...]) -> None:
        """Every live file's key index built, and a history's current versions decoded: a
        batch of random changes to a large table otherwise does it first (2 M rows:
        seconds, under load), holding back its commit."""
        mor = self.table(table) if self.mode != "changelog" and self.active(table) else None
        if mor is not None:
            self._locator(mor, key_names).warm(values=self.mode == "history")

    def mirror(
        self,
        table: DeltaTable,
        shape: Shape,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> None:
        """`data` ("upsert" rows: new rows; "delete" rows: keys) applied: every target row
        of the keys deleted, the upserts appended."""
        keys = data.select(list(shape.key_names))
        upserts = data.filter(pc.equal(data.column(ACTION), "upsert")).drop_columns([ACTION])
        appended = conform(upserts, schema) if upserts.num_rows else None
        for attempt in range(RETRIES + 1):
            mor = self.table(table)
            assert mor is not None
            matches = self._locator(mor, shape.key_names).locate(keys)
            try:
                self._commit(mor, matches.by_file(), appended, commit)
                return
            except CommitConflict:
                if attempt == RETRIES:
                    raise
                mor.refresh()

    def history(
        self,
        table: DeltaTable,
        shape: Shape,
        data: pa.Table,
        schema: pa.Schema,
        commit: CommitProperties | None,
    ) -> None:
        """`data` ("close" rows: a key and the sequence its current version ends at;
        "insert" rows: versions) applied: each closed version deleted and appended again
        with its end, the new versions appended."""
        closes = data.filter(pc.equal(data.column(ACTION), "close"))
        versions = data.filter(pc.equal(data.column(ACTION), "insert")).drop_columns([ACTION])
        names = list(shape.key_names)
        for attempt in range(RETRIES + 1):
            mor = self.table(table)
            assert mor is not None
            matches = self._locator(mor, shape.key_names).locate(closes.select(names), None)
            assert matches.values is not None
            ends = closes.column(END_AT).take(pa.array(matches.key_row))
            ended = with_column(matches.values, END_AT, ends)
            # only a version that started before the change closing it ends (as the MERGE's
            # condition says); one that starts at or after it stays
            keep = _before(ended.column(START_AT), ends)
            kept = Matches(
                matches.paths, matches.key_row[keep], matches.file[keep], matches.row[keep]
            )
            appended = pa.concat_tables(
                [conform(ended.filter(pa.array(keep)), schema), conform(versions, schema)]
            )
            removed = kept.by_file()
            try:
                self._commit(mor, removed, appended if appended.num_rows else None, commit)
                return
            except CommitConflict:
                if attempt == RETRIES:
                    raise
                mor.refresh()

    def _commit(
        self,
        mor: MergeOnReadTable,
        removed: dict[str, Rows],
        appended: pa.Table | None,
        commit: CommitProperties | None,
    ) -> None:
        txn = None
        metadata: dict[str, str] = {}
        if commit is not None:
            if commit.app_transactions:
                first = commit.app_transactions[0]
                txn = (first.app_id, first.version)
            metadata = dict(commit.custom_metadata or {})
        commit_delete_and_append(mor, removed, appended, txn, metadata)

    def maintain(self, table: DeltaTable, *, sweep: bool = True) -> None:
        """Purge, compaction, a checkpoint, and with `sweep` vacuum and collection, as the
        policy says."""
        mor = self.table(table)
        if mor is None:
            return
        try:
            maintain_deletion_vectors(mor, self.policy, sweep=sweep)
        except CommitConflict:  # another writer committed meanwhile: next time
            mor.refresh()


def _before(starts: pa.ChunkedArray | pa.Array, ends: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row: whether sequence `starts` orders before `ends` (both sequence structs)."""
    lsn_a, lsn_b = pc.struct_field(starts, "commit_lsn"), pc.struct_field(ends, "commit_lsn")
    earlier = pc.or_(
        pc.less(lsn_a, lsn_b),
        pc.and_(
            pc.equal(lsn_a, lsn_b),
            pc.less(pc.struct_field(starts, "ordinal"), pc.struct_field(ends, "ordinal")),
        ),
    )
    return np.asarray(earlier.to_numpy(zero_copy_only=False), dtype=bool)
