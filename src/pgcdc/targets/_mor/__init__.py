"""Merge-on-read for pgcdc's Delta targets: deletion vectors written by pgcdc.

delta-rs reads deletion vectors (DVs) but cannot write them (every MERGE, DELETE and UPDATE
of delta-rs 1.6 rewrites the files it touches), so a batch of random updates rewrites the
table. This package writes the commits delta-rs cannot: the rows a batch replaces or deletes
are marked in DV files, its new rows are appended, and the watermark goes in the same
commit. delta-rs then reads, merges, compacts, checkpoints and vacuums the table as usual.

* `enable_deletion_vectors(table)`: the table feature and property.
* `MergeOnReadTable(table)`: the DeltaTable kept open, with its live files and their DVs.
* `RowLocator(mor, keys, condition)`: the live rows of given keys (file, row index), and
  their values.
* `commit_delete_and_append(mor, removed, appended, app_transaction, custom_metadata)`.
* `maintain_deletion_vectors(mor, policy)`: purge, compaction, collection of unreferenced DV
  and data files, lite vacuum, checkpoints. Never `vacuum(full=True)` on a DV table: delta-rs
  deletes the DV files live files use.
* `logical_row_count(table)`: the rows a reader sees (delta-rs's `count()` ignores DVs).

Local file systems only (DeletionVectorsUnsupported otherwise): the caller merges
copy-on-write there.

A mirror's batch, with the table kept open (`TableIO`) and one `MergeOnReadTable` and
`RowLocator(mor, key_names)` per target kept with it::

    matches = locator.locate(batch_keys)          # every key the batch changes or deletes
    commit_delete_and_append(mor, matches.by_file(), new_row_versions,
                             (app_id, high_lsn), {COLUMNS: recorded_columns(...)})

On CommitConflict: `mor.refresh()`, locate again, commit again. A history locates with
``RowCondition(null=(END_AT,))`` and ``columns=None``, and appends the ended copies
(`Matches.values` with the end set) with the new versions in the same commit.
"""

from pgcdc.targets._mor.commit import CommitConflict, CommitResult, commit_delete_and_append
from pgcdc.targets._mor.locate import Matches, RowCondition, RowLocator
from pgcdc.targets._mor.maintain import (
    MaintenancePolicy,
    MaintenanceReport,
    maintain_deletion_vectors,
)
from pgcdc.targets._mor.table import (
    DeletionVectorsUnsupported,
    MergeOnReadTable,
    enable_deletion_vectors,
    logical_row_count,
)

__all__ = [
    "CommitConflict",
    "CommitResult",
    "DeletionVectorsUnsupported",
    "MaintenancePolicy",
    "MaintenanceReport",
    "Matches",
    "MergeOnReadTable",
    "RowCondition",
    "RowLocator",
    "commit_delete_and_append",
    "enable_deletion_vectors",
    "logical_row_count",
    "maintain_deletion_vectors",
]
