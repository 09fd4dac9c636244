"""The DeltaTable a target keeps open reads pgcdc's own merge-on-read commits only when
something asks for what they change (`pgcdc.targets._mor.kept`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from pgcdc.targets import DeltaTarget
from pgcdc.targets._mor.kept import KeptTable, wrote

from .envelopes import INT4, TEXT, envelope, insert, relation, rows, txn, update

REL = relation(("id", INT4, True), ("name", TEXT))
APP = "pgcdc:test"


def deferred(tmp_path: Path) -> tuple[DeltaTarget, KeptTable]:
    """A mirror whose last batch (an update: a deletion vector and an appended file) is a
    commit its kept table has not read."""
    t = DeltaTarget(str(tmp_path / "m"), "mirror", app_id=APP)
    t.apply(envelope(txn(0x100, *(insert(REL, id=i, name="a") for i in range(3)))))
    t.apply(envelope(txn(0x200, update(REL, {"id": 1, "name": "b"}))))
    kept = t.io.cached
    assert isinstance(kept, KeptTable)
    assert kept._raw.version() == kept.version() - 1  # the commit is not read yet
    return t, kept


def live_ids(table: DeltaTable) -> list[Any]:
    return sorted(
        pa.table(QueryBuilder().register("t", table).execute("SELECT id FROM t"))[0].to_pylist()
    )


#: What asks the table for more than its version, schema, metadata and protocol: each must
#: see the deferred commit.
READS: dict[str, Callable[[KeptTable], Any]] = {
    "transaction_version": lambda k: k.transaction_version(APP),
    "deletion_vectors": lambda k: pa.table(k.deletion_vectors()).num_rows,
    "history": lambda k: k.history(1)[0]["operation"],
    "add_actions": lambda k: pa.table(k.get_add_actions(flatten=True)).num_rows,
    "query": live_ids,
}


@pytest.mark.parametrize("read", sorted(READS))
def test_what_reads_the_table_reads_the_deferred_commit_first(tmp_path: Path, read: str) -> None:
    t, kept = deferred(tmp_path)
    got = READS[read](kept)
    assert kept._raw.version() == kept.version()
    assert got == READS[read](DeltaTable(t.path))  # a table read anew


def test_what_a_merge_on_read_commit_leaves_alone_is_answered_as_read(tmp_path: Path) -> None:
    t, kept = deferred(tmp_path)
    fresh = DeltaTable(t.path)
    assert kept.version() == fresh.version()
    assert kept.schema() == fresh.schema()
    assert kept.metadata().configuration == fresh.metadata().configuration
    assert kept.protocol() == fresh.protocol()
    assert kept.table_uri == fresh.table_uri
    assert kept._raw.version() == kept.version() - 1  # none of these read the log


def test_a_target_goes_on_from_deferred_commits_and_from_other_writers(tmp_path: Path) -> None:
    """The next batch's watermark, the rows, another writer's commit after the deferred one
    (an append through the kept table itself, and one through a table of its own)."""
    t, kept = deferred(tmp_path)
    assert t.watermark == 0x200
    schema = kept.schema().to_arrow()
    write_deltalake(
        kept, pa.table({"id": [10], "name": ["w"]}, schema=pa.schema(schema)), mode="append"
    )
    write_deltalake(
        t.path, pa.table({"id": [11], "name": ["x"]}, schema=pa.schema(schema)), mode="append"
    )
    t.apply(envelope(txn(0x300, update(REL, {"id": 2, "name": "c"}))))
    assert t.watermark == 0x300
    assert t.io.cached is kept and kept.version() == DeltaTable(t.path).version()
    expected = [(0, "a"), (1, "b"), (2, "c"), (10, "w"), (11, "x")]
    assert rows(t.to_arrow(), "id", "name") == expected
    assert live_ids(DeltaTable(t.path)) == [i for i, _ in expected]


def test_only_the_next_version_can_be_deferred(tmp_path: Path) -> None:
    t, kept = deferred(tmp_path)
    with pytest.raises(ValueError, match="version 9 after"):
        kept.wrote(9)
    plain = DeltaTable(t.path, version=kept.version() - 1)
    wrote(plain, kept.version())  # any other DeltaTable reads it at once
    assert plain.version() == kept.version()
