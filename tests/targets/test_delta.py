"""`DeltaTarget` on real Delta tables (delta-rs, in tmp_path): mirror, history and change log,
exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc.errors import TargetError, ValueOutOfRange
from pgcdc.targets import TABLE_PROPERTIES, DeltaTarget, _table, delta
from pgcdc.targets._merge import Writer
from pgcdc.targets._meta import COLUMNS, PARTIAL, last_commit

from .envelopes import (
    INT4,
    TEXT,
    UNCHANGED,
    delete,
    envelope,
    insert,
    relation,
    rows,
    truncate,
    txn,
    update,
)

REL = relation(("id", INT4, True), ("name", TEXT), ("doc", TEXT))
#: Every test both ways a batch is written (deletion vectors, copy-on-write MERGE).
pytestmark = pytest.mark.usefixtures("write_path")

APP = "pgcdc:test"


def target(tmp_path: Path, mode: str, **kwargs: Any) -> DeltaTarget:
    return DeltaTarget(str(tmp_path / mode), mode, app_id=APP, **kwargs)  # type: ignore[arg-type]


def versions(t: DeltaTarget) -> list[tuple[Any, ...]]:
    """History rows as (id, name, doc, start, end), sequences as (commit_lsn, ordinal)."""

    def seq(s: Any) -> Any:
        return None if s is None else (s["commit_lsn"], s["ordinal"])

    data = t.to_arrow().to_pylist()
    got = [(r["id"], r["name"], r["doc"], seq(r["__START_AT"]), seq(r["__END_AT"])) for r in data]
    return sorted(got, key=lambda r: (r[0], r[3]))


# --- mirror -------------------------------------------------------------------------------


def test_mirror_folds_a_batch_into_one_commit(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    batch = envelope(
        txn(0x100, insert(REL, id=1, name="a", doc="d1"), insert(REL, id=2, name="b")),
        txn(0x200, update(REL, {"id": 1, "name": "a2", "doc": "d2"}), delete(REL, id=2)),
        txn(0x300, insert(REL, id=3, name="c"), update(REL, {"id": 3, "name": "c2"})),
        reverse=True,
    )
    result = t.apply(batch)
    assert rows(t.to_arrow()) == [(1, "a2", "d2"), (3, "c2", None)]
    assert (result.applied, result.skipped, result.upserts, result.deletes) == (6, 0, 2, 1)
    assert result.watermark == 0x300 == t.watermark
    assert result.version == 1  # the table's creation, then the batch's one MERGE
    dt = DeltaTable(t.path)
    assert dt.metadata().configuration == {
        **TABLE_PROPERTIES,
        **_table.LOCAL_PROPERTIES,
        "pgcdc.mode": "mirror",
        "pgcdc.source": "public.items",
    }


def test_mirror_key_change_upserting_inserts_and_missing_deletes(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="a"), insert(REL, id=2, name="b"))))
    t.apply(
        envelope(
            txn(0x200, update(REL, {"id": 10, "name": "a"}, old={"id": 1})),  # key change
            txn(0x300, insert(REL, id=2, name="b2")),  # an existing key: an upsert
            txn(0x400, delete(REL, id=99)),  # a missing key: nothing
        )
    )
    assert rows(t.to_arrow()) == [(2, "b2", None), (10, "a", None)]
    t.apply(envelope(txn(0x500, delete(REL, id=10))))  # key-only old tuple
    assert rows(t.to_arrow()) == [(2, "b2", None)]


def test_unchanged_toast_kept_from_the_batch_and_from_the_target(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="a", doc="one"), insert(REL, id=2))))
    t.apply(
        envelope(
            txn(0x200, insert(REL, id=3, name="c", doc="three")),
            txn(0x300, update(REL, {"id": 3, "name": "c2", "doc": UNCHANGED})),  # in-batch
            txn(0x400, update(REL, {"id": 1, "name": "a2", "doc": UNCHANGED})),  # the target's
            txn(0x500, update(REL, {"id": 20, "name": "b2", "doc": UNCHANGED}, old={"id": 2})),
            txn(0x600, update(REL, {"id": 21, "name": "a3", "doc": UNCHANGED}, old={"id": 1})),
        )
    )
    assert rows(t.to_arrow()) == [(3, "c2", "three"), (20, "b2", None), (21, "a3", "one")]


def test_truncate_mid_batch_then_inserts(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1), insert(REL, id=2))))
    other = relation(("x", INT4, True), table="other", relid=16385)
    result = t.apply(
        envelope(
            txn(0x200, insert(REL, id=3), delete(REL, id=1)),
            txn(0x300, truncate(REL)),  # a cascade's other tables never reach this target
            txn(0x400, insert(REL, id=4, name="new"), update(REL, {"id": 4, "name": "newer"})),
        )
    )
    assert rows(t.to_arrow()) == [(4, "newer", None)]
    assert result.watermark == 0x400 and result.upserts == 1
    t.apply(envelope(txn(0x500, insert(REL, id=5))))
    assert rows(t.to_arrow(), "id") == [(4,), (5,)]
    assert other.relname == "other"


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_replayed_batch_changes_nothing(tmp_path: Path, mode: str) -> None:
    t = target(tmp_path, mode)
    batch = envelope(
        txn(0x100, insert(REL, id=1, name="a"), insert(REL, id=2, name="b")),
        txn(0x200, update(REL, {"id": 1, "name": "a2"}), truncate(REL), insert(REL, id=3)),
        txn(0x300, update(REL, {"id": 30, "name": "c", "doc": UNCHANGED}, old={"id": 3})),
    )
    first = t.apply(batch)
    before = sorted(map(repr, t.to_arrow().to_pylist()))
    again = t.apply(batch)
    assert (again.applied, again.skipped, again.version) == (0, 5 + 1, None)
    assert again.watermark == first.watermark == 0x300
    assert sorted(map(repr, t.to_arrow().to_pylist())) == before
    assert DeltaTable(t.path).version() == first.version


def test_a_batch_partially_below_the_watermark(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="a")), txn(0x200, insert(REL, id=2))))
    result = t.apply(
        envelope(
            txn(0x100, insert(REL, id=1, name="a")),
            txn(0x200, insert(REL, id=2)),
            txn(0x300, update(REL, {"id": 1, "name": "a2"})),
        )
    )
    assert (result.applied, result.skipped, result.watermark) == (1, 2, 0x300)
    assert rows(t.to_arrow(), "id", "name") == [(1, "a2"), (2, None)]


def test_a_merge_that_changes_nothing_still_records_the_watermark(tmp_path: Path) -> None:
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1))))
    result = t.apply(envelope(txn(0x200, delete(REL, id=42))))
    assert result.watermark == 0x200 == t.watermark and result.version == 2


def test_the_watermark_follows_the_table_whoever_wrote_it(tmp_path: Path) -> None:
    """A target reads its watermark once per version of the table: its own commit sets it,
    another writer's commit (a second process on the same table) is read; replayed rows
    below it change nothing."""
    first, second = target(tmp_path, "mirror"), target(tmp_path, "mirror")
    assert first.apply(envelope(txn(0x100, insert(REL, id=1)))).watermark == 0x100
    assert first.watermark == 0x100 == second.watermark
    second.apply(envelope(txn(0x200, insert(REL, id=2))))
    assert first.watermark == 0x200
    replay = first.apply(envelope(txn(0x200, insert(REL, id=2, name="again"))))
    assert (replay.applied, replay.skipped) == (0, 1)
    first.apply(envelope(txn(0x300, update(REL, {"id": 2, "name": "b"}))))
    assert second.watermark == 0x300 == first.watermark
    assert rows(second.to_arrow(), "id", "name") == [(1, None), (2, "b")]


def test_a_table_kept_open_is_read_anew_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DeltaTable a target keeps between batches is read anew from its latest
    checkpoint every `RENEW_EVERY` versions (reading on costs more the longer it was kept),
    as the same object: the batches after it see every row, and the watermark."""
    monkeypatch.setattr(_table, "RENEW_EVERY", 3)
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, *(insert(REL, id=i, name="a") for i in range(5)))))
    kept = t.io.cached
    assert kept is not None
    raw = kept._table
    for i in range(1, 8):
        t.apply(envelope(txn(0x100 + i * 0x10, update(REL, {"id": i % 5, "name": f"n{i}"}))))
    assert t.io.cached is kept and kept._table is not raw
    assert t.io._loaded_at >= kept.version() - 3
    assert t.watermark == 0x170
    assert rows(t.to_arrow(), "id", "name") == [
        (0, "n5"),
        (1, "n6"),
        (2, "n7"),
        (3, "n3"),
        (4, "n4"),
    ]


def test_a_chunk_that_loses_to_a_change_of_metadata_is_appended_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks of a copy are appended side by side, each by a target of its own; another
    chunk's first open may set pgcdc's table properties (a table made with other values)
    between this one's read of the table and its commit: the append is made again."""
    t = target(tmp_path, "mirror")
    t.reset(REL)
    other = DeltaTable(t.path)
    real = delta.write_deltalake
    calls = []

    def racing(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:  # another writer changes the metadata first
            other.alter.set_table_properties({"delta.logRetentionDuration": "interval 1 days"})
        real(*args, **kwargs)

    monkeypatch.setattr(delta, "write_deltalake", racing)
    chunk = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "doc": [None, "d"]})
    t.write_chunk(chunk, "public.items:0", 0x100, 0)
    assert len(calls) == 2
    assert t.copied_chunks(0x100) == {"public.items:0": 2}
    assert rows(t.to_arrow(), "id", "name") == [(1, "a"), (2, "b")]


def test_a_copys_mark_records_the_columns_of_its_reset(tmp_path: Path) -> None:
    """A copy resets the target (the columns, what each is), appends its chunks (no
    columns), then marks its point: the mark records the reset's columns, however many
    chunks came between, so a restart after the copy knows them as of the watermark (it
    went by name, fault injection `failover-17-56`: a swap after the copy had its values
    moved between the swapped names)."""
    t = target(tmp_path, "mirror")
    t.reset(REL, attnums=[1, 4, 6])
    chunk = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "doc": [None, "d"]})
    for i in range(8):
        t.write_chunk(chunk.slice(i % 2, 1), f"public.items:{i}", 0x100, 0)
    t.mark(0xFF)
    got = t.recorded_columns()
    assert got is not None
    assert [(c.name, c.attnum) for c in got] == [("id", 1), ("name", 4), ("doc", 6)]
    assert t.watermark == 0xFF


def test_replica_identity_full_without_key(tmp_path: Path) -> None:
    full = relation(("id", INT4), ("name", TEXT), ("doc", TEXT), identity="f")
    t = target(tmp_path, "mirror")
    t.apply(
        envelope(
            txn(0x100, insert(full, id=1, name="a"), insert(full, id=2), insert(full, name="z"))
        )
    )
    t.apply(
        envelope(
            txn(
                0x200,
                update(full, {"id": 1, "name": "a2", "doc": "d"}, old={"id": 1, "name": "a"}),
                delete(full, id=2),  # NULLs match NULLs
                update(full, {"id": 9, "name": "z"}, old={"name": "z"}),
            )
        )
    )
    assert rows(t.to_arrow()) == [(1, "a2", "d"), (9, "z", None)]


FULL = relation(("id", INT4), ("name", TEXT), ("doc", TEXT), identity="f")


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_identity_full_rows_are_a_multiset(tmp_path: Path, mode: str) -> None:
    """Identical rows are copies: two inserts give two rows; deleting or updating one copy
    (in the batch that inserted it, or later from the target's) touches only one; a
    truncation removes them all (case 7 of the exactly-once issue)."""
    t = target(tmp_path, mode)

    def current() -> list[tuple[Any, ...]]:
        data = t.to_arrow()
        if mode == "history":
            data = data.filter(data.column("__END_AT").is_null())
        return rows(data, "id", "name", "doc")

    a, b = {"id": 1, "name": "a"}, {"id": 2, "name": None}
    t.apply(envelope(txn(0x100, *(insert(FULL, **a) for _ in range(3)), insert(FULL, **b))))
    assert current() == [(1, "a", None)] * 3 + [(2, None, None)]
    t.apply(envelope(txn(0x200, insert(FULL, **b), delete(FULL, **b))))  # the batch's own copy
    assert current() == [(1, "a", None)] * 3 + [(2, None, None)]
    t.apply(
        envelope(
            txn(0x300, delete(FULL, **a)),
            txn(0x400, update(FULL, {"id": 1, "name": "a2", "doc": UNCHANGED}, old=a)),
            txn(0x500, insert(FULL, **b)),
        )
    )
    assert current() == [(1, "a", None), (1, "a2", None), (2, None, None), (2, None, None)]
    t.apply(envelope(txn(0x600, delete(FULL, **b), delete(FULL, **b), insert(FULL, **a))))
    assert current() == [(1, "a", None), (1, "a", None), (1, "a2", None)]
    with pytest.raises(TargetError, match=r"remove a row the target holds 0 time\(s\)"):
        t.apply(envelope(txn(0x700, delete(FULL, **b))))
    t.apply(envelope(txn(0x800, delete(FULL, **a), truncate(FULL), insert(FULL, **a))))
    assert current() == [(1, "a", None)]
    if mode == "history":  # every version is there once, ended where its copy went
        ends = sorted(
            (v["name"], v["__START_AT"]["commit_lsn"], (v["__END_AT"] or {}).get("commit_lsn"))
            for v in t.to_arrow().to_pylist()
            if v["id"] == 1
        )
        assert ends == [
            ("a", 0x100, 0x300),
            ("a", 0x100, 0x400),
            ("a", 0x100, 0x800),
            ("a", 0x600, 0x800),
            ("a", 0x800, None),
            ("a2", 0x400, 0x800),
        ]


def test_replica_identity_nothing_appends_inserts(tmp_path: Path) -> None:
    keyless = relation(("id", INT4), ("name", TEXT), identity="n")
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(keyless, id=1), insert(keyless, id=1))))
    t.apply(envelope(txn(0x200, insert(keyless, id=1))))
    assert rows(t.to_arrow()) == [(1, None)] * 3


# --- history ------------------------------------------------------------------------------


def test_history_versions_chain(tmp_path: Path) -> None:
    t = target(tmp_path, "history")
    t.apply(
        envelope(
            txn(0x100, insert(REL, id=1, name="a", doc="big"), insert(REL, id=2, name="b")),
            txn(0x200, update(REL, {"id": 1, "name": "a2", "doc": UNCHANGED})),
        )
    )
    result = t.apply(
        envelope(
            txn(0x300, update(REL, {"id": 1, "name": "a3", "doc": UNCHANGED})),  # from target
            txn(0x400, update(REL, {"id": 20, "name": "b2"}, old={"id": 2})),  # key change
            txn(0x500, delete(REL, id=1)),
            txn(0x600, insert(REL, id=1, name="again")),
        ),
    )
    assert versions(t) == [
        (1, "a", "big", (0x100, 1), (0x200, 1)),
        (1, "a2", "big", (0x200, 1), (0x300, 1)),
        (1, "a3", "big", (0x300, 1), (0x500, 1)),
        (1, "again", None, (0x600, 1), None),
        (2, "b", None, (0x100, 2), (0x400, 1)),
        (20, "b2", None, (0x400, 1), None),
    ]
    assert (result.upserts, result.deletes, result.version) == (3, 1, 2)


def test_history_truncate_ends_every_current_version(tmp_path: Path) -> None:
    t = target(tmp_path, "history")
    t.apply(envelope(txn(0x100, insert(REL, id=1), insert(REL, id=2), insert(REL, id=3))))
    t.apply(
        envelope(
            txn(0x200, update(REL, {"id": 1, "name": "x"})),
            txn(0x300, truncate(REL)),
            txn(0x400, insert(REL, id=2, name="back")),
        )
    )
    assert [(v[0], v[1], v[3], v[4]) for v in versions(t)] == [
        (1, None, (0x100, 1), (0x200, 1)),
        (1, "x", (0x200, 1), (0x300, 1)),
        (2, None, (0x100, 2), (0x300, 1)),
        (2, "back", (0x400, 1), None),
        (3, None, (0x100, 3), (0x300, 1)),
    ]


def test_history_batch_of_only_a_truncate(tmp_path: Path) -> None:
    t = target(tmp_path, "history")
    t.apply(envelope(txn(0x100, insert(REL, id=1), insert(REL, id=2))))
    assert t.apply(envelope(txn(0x200, truncate(REL)))).watermark == 0x200
    assert [(v[0], v[4]) for v in versions(t)] == [(1, (0x200, 1)), (2, (0x200, 1))]


def test_history_without_identity(tmp_path: Path) -> None:
    keyless = relation(("id", INT4), ("name", TEXT), identity="n")
    t = target(tmp_path, "history")
    t.apply(envelope(txn(0x100, insert(keyless, id=1), insert(keyless, id=1))))
    t.apply(envelope(txn(0x200, insert(keyless, id=2))))
    t.apply(envelope(txn(0x300, insert(keyless, id=3), truncate(keyless), insert(keyless, id=4))))
    got = [(r["id"], r["__START_AT"], r["__END_AT"]) for r in t.to_arrow().to_pylist()]
    end = {"commit_lsn": 0x300, "ordinal": 2}
    assert sorted(((i, s["ordinal"], s["commit_lsn"], e) for i, s, e in got), key=repr) == sorted(
        [
            (1, 1, 0x100, end),
            (1, 2, 0x100, end),
            (2, 1, 0x200, end),
            (3, 1, 0x300, end),
            (4, 3, 0x300, None),
        ],
        key=repr,
    )


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_crash_between_the_commits_of_a_batch_is_replayed_exactly(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch in which the replica identity changes is written in several commits; after a
    crash between them, applying it again writes only what is missing (the first commit
    names its last change), the same as an uninterrupted run."""
    full = relation(("id", INT4), ("name", TEXT), ("doc", TEXT), identity="f")
    batch = envelope(
        txn(0x200, update(REL, {"id": 1, "name": "b"}), insert(REL, id=2, name="x")),
        txn(0x300, update(full, {"id": 1, "name": "c"}, old={"id": 1, "name": "b"})),
    )
    clean, crashed = target(tmp_path / "clean", mode), target(tmp_path / "crashed", mode)
    for t in (clean, crashed):
        t.apply(envelope(txn(0x100, insert(REL, id=1, name="a"))))
    clean.apply(batch)

    def crash(*args: Any) -> bool:
        raise RuntimeError("killed between the commits")

    monkeypatch.setattr(Writer, "write_multiset", crash)
    with pytest.raises(RuntimeError):
        crashed.apply(batch)
    assert crashed.watermark == 0x100
    assert PARTIAL in last_commit_agreed(crashed)
    monkeypatch.undo()
    result = crashed.apply(batch)
    assert (result.applied, result.skipped, result.watermark) == (1, 2, 0x300)
    if mode == "history":
        assert (
            versions(crashed)
            == versions(clean)
            == [
                (1, "a", None, (0x100, 1), (0x200, 1)),
                (1, "b", None, (0x200, 1), (0x300, 1)),
                (1, "c", None, (0x300, 1), None),
                (2, "x", None, (0x200, 2), None),
            ]
        )
    else:
        assert (
            rows(crashed.to_arrow()) == rows(clean.to_arrow()) == [(1, "c", None), (2, "x", None)]
        )
    assert crashed.apply(batch).applied == 0


# --- change log ---------------------------------------------------------------------------


def test_changelog_appends_the_envelope_once(tmp_path: Path) -> None:
    t = target(tmp_path, "changelog")
    batch = envelope(
        txn(0x100, insert(REL, id=1, name="a")),
        txn(0x200, update(REL, {"id": 1, "doc": UNCHANGED}), delete(REL, id=1)),
    )
    result = t.apply(batch)
    assert (result.applied, result.upserts, result.watermark) == (3, 3, 0x200)
    assert t.apply(batch).skipped == 3
    got = t.to_arrow()
    assert got.schema.names == batch.schema.names
    assert rows(got, "commit_lsn", "ordinal", "op") == [
        (0x100, 1, "insert"),
        (0x200, 1, "update"),
        (0x200, 2, "delete"),
    ]
    update_row = next(r for r in got.to_pylist() if r["op"] == "update")
    assert update_row["unchanged_toast"] == ["doc"]
    assert dict(update_row["after"]) == {"id": "1", "name": None}


def test_a_changelog_records_the_columns_as_of_its_last_change(tmp_path: Path) -> None:
    """As a mirror's batch does (a table's pending change log is one of the consumers a
    restart seeds the columns from): the relation as of the batch's last change, whatever
    the rows' order, with the columns' identities."""
    t = target(tmp_path, "changelog")
    assert t.recorded_columns() is None
    renamed = relation(("id", INT4, True), ("title", TEXT), ("doc", TEXT))
    batch = envelope(
        txn(0x100, insert(REL, id=1, name="a")),
        txn(0x200, update(renamed, {"id": 1, "title": "b", "doc": "d"})),
        reverse=True,
    )
    names = ["id", "title", "doc"]
    attnums = pa.array(
        [
            [{**c, "attnum": i + 1} for i, c in enumerate(cs)]
            for cs in batch.column("columns").to_pylist()
        ]
    )
    batch = batch.set_column(
        batch.schema.get_field_index("columns"),
        "columns",
        attnums.cast(batch.schema.field("columns").type),
    )
    t.apply(batch)
    got = t.recorded_columns()
    assert got is not None
    assert [(c.name, c.attnum, c.key) for c in got] == [
        (n, i + 1, n == "id") for i, n in enumerate(names)
    ]


def test_a_refused_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    """A value the out-of-range policy refuses fails the batch before any write, and none of
    its rows leak into the next batch."""
    rel = relation(("id", INT4, True), ("at", 1184))
    t = target(tmp_path, "mirror")
    bad = envelope(
        txn(0x100, insert(rel, id=1, at="2024-01-01 00:00:00+00"), insert(rel, id=2, at="infinity"))
    )
    with pytest.raises(ValueOutOfRange, match=r"public\.items\.at: value 'infinity'"):
        t.apply(bad)
    assert t.watermark is None
    t.apply(envelope(txn(0x100, insert(rel, id=3))))
    assert rows(t.to_arrow()) == [(3, None)]


@pytest.mark.parametrize("deletion_vectors", [False, True])
def test_a_maintenance_pass_not_asked_for_at_its_version_comes_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deletion_vectors: bool
) -> None:
    """The driver maintains between batches, whenever it waits: a pass due at a version
    the table has passed by then still runs (once), and the next one comes as many
    versions later."""
    import pgcdc.targets.delta as delta

    monkeypatch.setattr(delta, "COMPACT_EVERY", 10)
    monkeypatch.setattr(delta, "MERGE_ON_READ_EVERY", 10)
    properties = {"delta.enableDeletionVectors": str(deletion_vectors).lower()}
    t = target(tmp_path, "mirror", properties=properties)
    lsn = 0x100
    for i in range(3):  # versions 1..3: none due
        t.apply(envelope(txn(lsn := lsn + 0x100, insert(REL, id=i, name="n"))))
        assert not t.maintain()
    for i in range(3, 12):  # past version 10, nobody asking
        t.apply(envelope(txn(lsn := lsn + 0x100, insert(REL, id=i, name="n"))))
    assert t.maintain()  # the pass due at 10
    assert not t.maintain()
    for i in range(12, 20):
        t.apply(envelope(txn(lsn := lsn + 0x100, insert(REL, id=i, name="n"))))
        assert not t.maintain()  # the next one is due 10 versions after the last
    assert sorted(r[0] for r in rows(t.to_arrow())) == list(range(20))

    def unread() -> None:
        raise AssertionError("the log is read although no pass can be due")

    monkeypatch.setattr(t.io, "open", unread)  # asked often between batches: no I/O
    assert not t.maintain()


def test_a_merge_on_read_pass_sweeps_only_as_often_as_a_vacuum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_path: str
) -> None:
    """Vacuum and collection list every file of the table and go over every remove within
    the retention: a pass of the deletion-vector policy (every MERGE_ON_READ_EVERY
    versions) sweeps only once a vacuum is due (VACUUM_EVERY versions, or VACUUM_SECONDS)."""
    from pgcdc.targets import _merge_on_read

    if write_path == "copy-on-write":
        pytest.skip("the deletion-vector policy's")
    monkeypatch.setattr(delta, "MERGE_ON_READ_EVERY", 2)
    monkeypatch.setattr(delta, "VACUUM_EVERY", 6)
    sweeps: list[bool] = []
    real = _merge_on_read.maintain_deletion_vectors

    def recording(table: Any, policy: Any, *, sweep: bool) -> Any:
        sweeps.append(sweep)
        return real(table, policy, sweep=sweep)

    monkeypatch.setattr(_merge_on_read, "maintain_deletion_vectors", recording)
    t = target(tmp_path, "mirror")
    for i in range(12):
        t.apply(envelope(txn(0x100 * (i + 1), insert(REL, id=i, name="n"))))
        t.maintain()
    assert sweeps == [False, False, True, False, False, True]


@pytest.mark.parametrize("deletion_vectors", [False, True])
def test_maintenance_checkpoints_and_compacts_and_keeps_the_watermark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deletion_vectors: bool
) -> None:
    """Copy-on-write tables: small files compacted every COMPACT_EVERY versions, delta-rs
    checkpoints; tables with deletion vectors: their own policy every MERGE_ON_READ_EVERY."""
    import pgcdc.targets.delta as delta
    from pgcdc.targets._mor import MaintenancePolicy

    monkeypatch.setattr(delta, "COMPACT_EVERY", 10)
    monkeypatch.setattr(delta, "SMALL_FILES", 4)
    monkeypatch.setattr(delta, "MERGE_ON_READ_EVERY", 10)
    properties = {"delta.enableDeletionVectors": str(deletion_vectors).lower()}
    t = target(tmp_path, "history", properties={**properties, "delta.checkpointInterval": "5"})
    t.writer.mor.policy = MaintenancePolicy(compact_min_files=4, checkpoint_every=5)
    batches = [envelope(txn(0x100 * (i + 1), insert(REL, id=i, name="n"))) for i in range(12)]
    for batch in batches:
        t.apply(batch)
        t.maintain()
        assert COLUMNS in last_commit_agreed(t)  # past maintenance commits
    table = DeltaTable(t.path)
    assert len(table.file_uris()) < 5  # twelve appends' files, compacted
    configuration = table.metadata().configuration
    assert configuration["delta.targetFileSize"] == str(8 << 20)  # pgcdc's, and the target's:
    assert configuration["delta.checkpointInterval"] == "5"
    assert any(
        p.name.endswith(".checkpoint.parquet")
        for p in (tmp_path / "history" / "_delta_log").iterdir()
    )
    state = t.state()
    assert state.rows == 12 and state.watermark == 0x100 * 12
    assert t.apply(batches[3]).applied == 0  # replays still skip
    assert sorted(v[0] for v in versions(t)) == list(range(12))


def test_a_mirrors_batch_files_up_to_a_quarter_of_the_target_size_are_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_path: str
) -> None:
    """Deletion vectors, the default policy: a batch's file counts as small (compacted with
    others) below a quarter of the table's target file size. Wide rows write files of a
    megabyte or more a batch: with a fixed 1 MiB bound they were never compacted, and each
    batch of random updates touched every one of them."""
    import os

    if write_path == "copy-on-write":
        pytest.skip("the deletion-vector policy's")
    monkeypatch.setattr(delta, "MERGE_ON_READ_EVERY", 1)
    target_size = 6 << 20
    t = target(tmp_path, "mirror", properties={"delta.targetFileSize": str(target_size)})
    for batch in range(17):
        docs = [os.urandom(1000).hex() for _ in range(600)]  # about 1.2 MB a file
        inserts = [insert(REL, id=batch * 1000 + i, name="n", doc=d) for i, d in enumerate(docs)]
        t.apply(envelope(txn(0x100 * (batch + 1), *inserts)))
        t.maintain()
    sizes = [a["size"] for a in t.writer.mor.table(DeltaTable(t.path)).state.adds.values()]
    assert max(sizes) > target_size // 2 and len(sizes) < 10  # (17 files of 1.2 MB before)
    assert t.state().rows == 17 * 600


def last_commit_agreed(t: DeltaTarget) -> dict[str, Any]:
    """The latest commit that applied changes, read from its file: the same as the history
    says."""
    table = DeltaTable(t.path)
    found = last_commit(table, t.path)
    assert found == last_commit(table)
    return found


def _operations(t: DeltaTarget) -> list[str]:
    """The table's commits' operations, oldest first."""
    return [c["operation"] for c in reversed(DeltaTable(t.path).history())]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_batch_of_new_keys_is_appended(tmp_path: Path, mode: str) -> None:
    """Keys the batch inserts first (the source did not have them) are appended, not merged:
    including a key inserted, updated and deleted again within the batch (nothing of it
    stays), and a history's versions closed in the batch."""
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="a"))))
    t.apply(
        envelope(
            txn(0x200, insert(REL, id=2, name="b"), insert(REL, id=3, name="c")),
            txn(0x300, update(REL, {"id": 2, "name": "b2"}), delete(REL, id=3)),
        )
    )
    assert _operations(t)[-1] == "WRITE"
    if mode == "mirror":
        assert rows(t.to_arrow()) == [(1, "a", None), (2, "b2", None)]
    else:
        assert versions(t) == [
            (1, "a", None, (0x100, 1), None),
            (2, "b", None, (0x200, 1), (0x300, 1)),
            (2, "b2", None, (0x300, 1), None),
            (3, "c", None, (0x200, 2), (0x300, 2)),
        ]
    assert t.watermark == 0x300


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_an_insert_of_a_key_the_target_holds_is_merged(tmp_path: Path, mode: str) -> None:
    """A target holding a key the batch inserts (rows kept on purpose: a detached
    partition's, with on_detach "keep") is merged into, never given a second row."""
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="kept"))))
    t.apply(envelope(txn(0x200, insert(REL, id=1, name="new"), insert(REL, id=9, name="x"))))
    assert _operations(t)[-1] == "MERGE"
    if mode == "mirror":
        assert rows(t.to_arrow()) == [(1, "new", None), (9, "x", None)]
    else:
        assert [v for v in versions(t) if v[4] is None] == [
            (1, "new", None, (0x200, 1), None),
            (9, "x", None, (0x200, 2), None),
        ]


def test_key_filter_names_the_batch_keys_as_literals() -> None:
    """The target-only condition a MERGE gets, so that delta-rs prunes files by their
    statistics: the first key column's values, a range when they are many, NULL-safe."""

    from pgcdc.targets import _arrow
    from pgcdc.targets._merge import key_filter

    ints = pa.table({"id": [3, 1, 3, None], "b": ["x", "y", "z", "w"]})
    assert key_filter(["id", "b"], ints) == '(t."id" IN (3, 1) OR t."id" IS NULL)'
    texts = pa.table({"k": ["o'neil", "a"]})
    assert key_filter(["k"], texts) == "t.\"k\" IN ('o''neil', 'a')"
    many = pa.table({"id": list(range(_arrow.MAX_IN_LIST + 1))})
    assert key_filter(["id"], many) == f't."id" BETWEEN 0 AND {_arrow.MAX_IN_LIST}'
    assert key_filter(["at"], pa.table({"at": pa.array([1.5])})) is None  # no literals
    assert key_filter([], ints) is None


def test_table_properties_are_given_to_tables_made_before(tmp_path: Path) -> None:
    """A table made without pgcdc's properties (or with other values) gets them, and the
    target's own, when a target opens it."""
    from deltalake import write_deltalake

    path = tmp_path / "mirror"
    write_deltalake(str(path), pa.table({"id": pa.array([1], pa.int32())}))
    t = DeltaTarget(
        str(path),
        "mirror",
        app_id=APP,
        properties={"delta.logRetentionDuration": "interval 1 days"},
    )
    assert t.watermark is None
    configuration = DeltaTable(str(path)).metadata().configuration
    assert configuration["delta.targetFileSize"] == TABLE_PROPERTIES["delta.targetFileSize"]
    assert configuration["delta.logRetentionDuration"] == "interval 1 days"


def test_an_open_target_follows_what_others_commit(tmp_path: Path) -> None:
    """A target kept open reads its log on from where it was: it sees another writer's
    commit, and a table removed under it."""
    t = target(tmp_path, "mirror")
    t.apply(envelope(txn(0x100, insert(REL, id=1, name="a"))))
    opened = t.io.open()
    assert opened is not None
    before = opened.version()
    DeltaTable(t.path).alter.set_table_properties({"delta.checkpointInterval": "7"})
    again = t.io.open()
    assert again is not None and again.version() == before + 1
    assert again.metadata().configuration["delta.checkpointInterval"] == "7"
    t.apply(envelope(txn(0x200, insert(REL, id=2, name="b"))))
    assert rows(t.to_arrow()) == [(1, "a", None), (2, "b", None)]
    shutil.rmtree(t.path)
    assert t.io.open() is None
