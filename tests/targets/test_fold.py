"""The CDC semantics without I/O (`pgcdc.targets.fold`): what a batch nets out to per key."""

from __future__ import annotations

import pytest

from pgcdc.errors import TargetError
from pgcdc.targets.fold import changes_from_envelope, fold_history, fold_mirror, segments

from .envelopes import (
    INT4,
    TEXT,
    UNCHANGED,
    delete,
    envelope,
    insert,
    relation,
    truncate,
    txn,
    update,
)

REL = relation(("id", INT4, True), ("name", TEXT), ("doc", TEXT))


def changes(*txns):  # type: ignore[no-untyped-def]
    return changes_from_envelope(envelope(*txns, reverse=True))


def test_changes_are_ordered_by_commit_then_ordinal() -> None:
    got = changes(
        txn(0x300, insert(REL, id=3)),
        txn(0x100, insert(REL, id=1), insert(REL, id=2)),
    )
    assert [c.seq for c in got] == [(0x100, 1), (0x100, 2), (0x300, 1)]
    assert got[0].shape.key_names == ("id",)
    assert got[0].after == {"id": "1", "name": None, "doc": None}


def test_mirror_nets_out_each_key() -> None:
    plan = fold_mirror(
        changes(
            txn(0x100, insert(REL, id=1, name="a"), insert(REL, id=2, name="b")),
            txn(0x200, update(REL, {"id": 1, "name": "a2"}), delete(REL, id=2)),
            txn(0x300, insert(REL, id=3, name="c"), delete(REL, id=3), delete(REL, id=4)),
        )
    )
    assert {k: i.values for k, i in plan.upserts.items()} == {
        ("1",): {"id": "1", "name": "a2", "doc": None}
    }
    assert set(plan.deletes) == {("2",), ("3",), ("4",)}
    assert plan.deletes[("4",)].values == {"id": "4"}
    assert not plan.truncated and not plan.lookups


def test_mirror_key_change_deletes_the_old_key() -> None:
    plan = fold_mirror(changes(txn(0x100, update(REL, {"id": 2, "name": "x"}, old={"id": 1}))))
    assert list(plan.upserts) == [("2",)] and list(plan.deletes) == [("1",)]


def test_unchanged_toast_from_the_batch_or_the_target() -> None:
    plan = fold_mirror(
        changes(
            txn(0x100, insert(REL, id=1, name="a", doc="big")),
            txn(0x200, update(REL, {"id": 1, "name": "b", "doc": UNCHANGED})),
            txn(0x300, update(REL, {"id": 7, "name": "c", "doc": UNCHANGED}, old={"id": 5})),
        )
    )
    assert plan.upserts[("1",)].values["doc"] == "big"
    moved = plan.upserts[("7",)]
    assert "doc" not in moved.values and moved.missing == {"doc": ("5",)}
    assert plan.lookups[("5",)].values == {"id": "5"}


def test_truncate_forgets_what_came_before() -> None:
    plan = fold_mirror(
        changes(
            txn(0x100, insert(REL, id=1), delete(REL, id=2)),
            txn(0x200, truncate(REL)),
            txn(0x300, insert(REL, id=3), update(REL, {"id": 4, "doc": UNCHANGED})),
        )
    )
    assert plan.truncated
    assert set(plan.upserts) == {("3",), ("4",)} and not plan.deletes
    assert not plan.upserts[("4",)].missing  # nothing to keep in an emptied table


def test_history_versions_and_closes() -> None:
    plan = fold_history(
        changes(
            txn(0x100, insert(REL, id=1, name="a"), update(REL, {"id": 1, "name": "b"})),
            txn(0x200, update(REL, {"id": 2, "name": "c"}, old={"id": 1}), delete(REL, id=9)),
            txn(0x300, truncate(REL), insert(REL, id=3)),
        )
    )
    assert [(v.key, v.start, v.end) for v in plan.versions] == [
        (("1",), (0x100, 1), (0x100, 2)),
        (("1",), (0x100, 2), (0x200, 1)),
        (("2",), (0x200, 1), (0x300, 1)),
        (("3",), (0x300, 2), None),
    ]
    # the target's current versions of keys 1 (first touched by the insert) and 9 end
    assert {k: seq for k, (seq, _) in plan.closes.items()} == {
        ("1",): (0x100, 1),
        ("2",): (0x200, 1),
        ("9",): (0x200, 2),
    }
    assert plan.truncated_at == (0x300, 1) and plan.deletes == 1


def test_segments_split_where_the_identity_changes() -> None:
    full = relation(("id", INT4), ("name", TEXT), identity="f")
    got = list(segments(changes(txn(0x100, insert(REL, id=1), truncate(REL), insert(full, id=2)))))
    assert [[c.op for c in run] for run in got] == [["insert", "truncate"], ["insert"]]


def test_update_without_identity_is_refused() -> None:
    keyless = relation(("id", INT4), ("name", TEXT), identity="n")
    plan = fold_mirror(changes(txn(0x100, insert(keyless, id=1), insert(keyless, id=1))))
    assert len(plan.upserts) == 2  # no identity: every insert is its own row
    with pytest.raises(TargetError, match="no replica identity key"):
        fold_mirror(changes(txn(0x100, update(keyless, {"id": 1}))))


FULL = relation(("tag", TEXT), ("n", INT4), ("note", TEXT), identity="f")


@pytest.mark.parametrize("fold", [fold_mirror, fold_history])
def test_identity_full_key_includes_unchanged_toast(fold) -> None:  # type: ignore[no-untyped-def]
    """Under REPLICA IDENTITY FULL an unchanged TOAST column is part of the key: the new
    row's key comes from the image with it filled from the old row, so a second update in the
    batch finds the first one's row (issue 12, case 1)."""
    old1 = {"tag": "a", "n": 1, "note": "big"}
    old2 = {"tag": "a", "n": 2, "note": "big"}
    got = changes(
        txn(0x100, update(FULL, {"tag": "a", "n": 2, "note": UNCHANGED}, old=old1)),
        txn(0x200, update(FULL, {"tag": "a", "n": 3, "note": UNCHANGED}, old=old2)),
    )
    plan = fold(got)
    if fold is fold_mirror:
        assert list(plan.upserts) == [("a", "3", "big")]
        assert plan.upserts[("a", "3", "big")].values["note"] == "big"
        assert set(plan.deletes) == {("a", "1", "big"), ("a", "2", "big")}
    else:
        current = [v for v in plan.versions if v.end is None]
        assert [v.key for v in current] == [("a", "3", "big")]
        assert ("a", "1", "big") in plan.closes  # the target's version of the old row ends
        assert [v.key for v in plan.versions] == [("a", "2", "big"), ("a", "3", "big")]
        assert plan.versions[0].end == (0x200, 1) and not plan.lookups
