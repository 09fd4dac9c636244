"""The Arrow folds (`pgcdc.targets.bulk`) against the general fold: same tables; and the same
folds read from the envelope and from the spool's column buffers (`ChangeBatch`): the same
plans."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.targets import DeltaTarget, delta
from pgcdc.targets.bulk import BulkHistory, BulkMirror, bulk_history, bulk_mirror

from .envelopes import (
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    UNCHANGED,
    changes,
    delete,
    envelope,
    insert,
    numeric,
    relation,
    rows,
    truncate,
    txn,
    update,
)

REL = relation(("id", INT4, True), ("name", TEXT), ("amount", NUMERIC, False, numeric(12, 2)))
#: The same with a text key: folded by a hash aggregation, not by sorting numbers.
TEXT_KEYED = relation(
    ("id", TEXT, True), ("name", TEXT), ("amount", NUMERIC, False, numeric(12, 2))
)
#: And with a bigint key of values a double cannot tell apart (sorted as int64 numbers).
BIG_KEYED = relation(("id", INT8, True), ("name", TEXT), ("amount", NUMERIC, False, numeric(12, 2)))


def _key(rel: Any, number: int) -> Any:
    if rel is TEXT_KEYED:
        return f"k{number}"
    if rel is BIG_KEYED:  # +-(2**62 + n): neighbours, negative ones too
        return (-1) ** number * (2**62 + number)
    return number


#: Every test both ways a batch is written (deletion vectors, copy-on-write MERGE).
pytestmark = pytest.mark.usefixtures("write_path")

APP = "pgcdc:test"

change = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 6), st.text(max_size=5), st.integers(-999, 999)),
    st.tuples(
        st.just("update"),
        st.integers(0, 6),
        st.one_of(st.text(max_size=5), st.just(UNCHANGED)),  # an unchanged TOAST value
        st.integers(-999, 999),
    ),
    st.tuples(st.just("delete"), st.integers(0, 6)),
)
batches = st.lists(st.lists(st.lists(change, min_size=1, max_size=4), max_size=5), max_size=4)


def _same_plan(a: BulkMirror | BulkHistory | None, b: BulkMirror | BulkHistory | None) -> None:
    """The two folds made the same plan (but the LSN each names for an error)."""
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "first_lsn":
            continue
        if isinstance(x, dict):
            assert x.keys() == y.keys(), f.name
            for k in x:
                same = np.array_equal(x[k], y[k]) if isinstance(x[k], np.ndarray) else None
                assert same if same is not None else pa.array(x[k]).equals(pa.array(y[k])), (
                    f.name,
                    k,
                )
        elif isinstance(x, pa.Array | pa.ChunkedArray):
            assert pa.array(x).equals(pa.array(y)), f.name
        else:
            assert x == y, f.name


def _fold_both_ways(txns: list[Any], mode: str) -> None:
    fold = bulk_mirror if mode == "mirror" else bulk_history
    _same_plan(fold(changes(*txns)), fold(envelope(*txns)))


def _txns(spec: list[list[tuple[Any, ...]]], start: int, rel: Any = REL) -> list[Any]:
    out = []
    for i, entries in enumerate(spec):
        made = []
        for op, number, *rest in entries:
            key = _key(rel, number)
            if op == "delete":
                made.append(delete(rel, id=key))
            else:
                values = {"id": key, "name": rest[0], "amount": f"{rest[1] / 100:.2f}"}
                made.append(insert(rel, **values) if op == "insert" else update(rel, values))
        out.append(txn(start + 100 * i, *made))
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spec=batches,
    mode=st.sampled_from(["mirror", "history"]),
    rel=st.sampled_from([REL, TEXT_KEYED, BIG_KEYED]),
)
def test_bulk_fold_equals_the_general_fold(
    tmp_path_factory: pytest.TempPathFactory,
    spec: list[Any],
    mode: str,
    rel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random batches of inserts, updates (some with an unchanged TOAST value) and deletes
    (of keys present or not, several times a key) through the Arrow fold and through the
    general one: the same tables, the same watermarks; with integer keys (an int4, and an
    int8 beyond a double's precision) and a text one (which the mirror's fold groups
    differently)."""
    base = tmp_path_factory.mktemp("bulk")
    fast = DeltaTarget(str(base / "fast"), mode, app_id=APP)  # type: ignore[arg-type]
    slow = DeltaTarget(str(base / "slow"), mode, app_id=APP)  # type: ignore[arg-type]
    spooled = DeltaTarget(str(base / "spooled"), mode, app_id=APP)  # type: ignore[arg-type]
    start = 1000
    for batch in spec:
        txns = _txns(batch, start, rel)
        start += 100 * len(batch) + 100
        if not txns:
            continue
        data = envelope(*txns, reverse=True)
        assert (bulk_mirror if mode == "mirror" else bulk_history)(data) is not None
        _fold_both_ways(txns, mode)
        fast.apply(data)
        spooled.apply(changes(*txns))
        with monkeypatch.context() as m:
            m.setattr(delta, "bulk_mirror", lambda rows: None)
            m.setattr(delta, "bulk_history", lambda rows: None)
            slow.apply(data)
    if not fast.exists:
        assert not slow.exists and not spooled.exists
        return
    assert rows(fast.to_arrow()) == rows(slow.to_arrow()) == rows(spooled.to_arrow())
    assert fast.watermark == slow.watermark == spooled.watermark


def test_batches_that_need_the_general_fold(tmp_path: Path) -> None:
    toast = relation(("id", INT4, True), ("doc", TEXT))

    full_toast = relation(("id", INT4), ("doc", TEXT), identity="f")
    moved = update(toast, {"id": 2, "doc": "x"}, old={"id": 1})
    full = relation(("id", INT4), ("doc", TEXT), identity="f")
    two_shapes = relation(("id", INT4, True), ("doc", TEXT), ("more", TEXT))
    keyless = relation(("tid", INT4), ("note", TEXT))
    for read in (envelope, changes):
        assert bulk_mirror(read(txn(10, update(full_toast, {"id": 1, "doc": UNCHANGED})))) is None
        assert bulk_mirror(read(txn(10, truncate(toast)))) is None
        assert bulk_mirror(read(txn(10, moved))) is None
        assert bulk_mirror(read(txn(10, insert(full, id=1, doc="x")))) is None
        assert bulk_history(read(txn(10, moved))) is None
        assert bulk_mirror(read(txn(10, update(toast, {"id": 1, "doc": "y"})))) is not None
        unchanged_key = update(toast, {"id": UNCHANGED, "doc": "y"})
        assert bulk_mirror(read(txn(10, unchanged_key))) is None
        assert bulk_mirror(read(txn(10, insert(toast, id=1), insert(two_shapes, id=2)))) is None
        assert bulk_history(read(txn(10, insert(keyless, tid=1), delete(keyless, tid=1)))) is None
    # The ones it takes: the last change per key wins, typed.
    target = DeltaTarget(str(tmp_path / "t"), "mirror", app_id=APP)
    target.apply(
        envelope(
            txn(10, insert(REL, id=1, name="a", amount="1.50"), insert(REL, id=2, name="b")),
            txn(20, update(REL, {"id": 1, "name": "a2", "amount": "2.25"}), delete(REL, id=2)),
        )
    )
    assert rows(target.to_arrow()) == [(1, "a2", Decimal("2.25"))]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_unchanged_toast_values_in_the_arrow_fold(tmp_path: Path, mode: str) -> None:
    """A batch with unchanged TOAST values stays in Arrow: each takes the key's latest value
    in the batch, else the target's; the same rows as the general fold."""
    toast = relation(("id", INT4, True), ("name", TEXT), ("doc", TEXT))
    first = envelope(txn(10, *(insert(toast, id=i, name="n", doc=f"d{i}") for i in (1, 2, 3))))
    between = envelope(txn(15, update(toast, {"id": 1, "name": "m", "doc": "d1b"})))  # a DV
    txns = [
        txn(20, update(toast, {"id": 1, "name": "a", "doc": UNCHANGED})),  # the target's
        txn(25, update(toast, {"id": 1, "name": "a2", "doc": UNCHANGED})),  # the target's
        txn(30, update(toast, {"id": 2, "name": "b", "doc": "new"})),
        txn(40, update(toast, {"id": 2, "name": "c", "doc": UNCHANGED})),  # the batch's
        txn(50, update(toast, {"id": 4, "name": "x", "doc": UNCHANGED})),  # nobody's
        txn(60, delete(toast, id=3), insert(toast, id=3, name="z", doc="again")),
        txn(70, update(toast, {"id": 3, "name": "y", "doc": UNCHANGED})),  # after an insert
    ]
    second = envelope(*txns, reverse=True)
    folded = bulk_mirror(second) if mode == "mirror" else bulk_history(second)
    assert folded is not None and set(folded.missing) == {"doc"}
    _fold_both_ways(txns, mode)
    tables = []
    for name, general in (("fast", False), ("slow", True), ("spooled", False)):
        target = DeltaTarget(str(tmp_path / name), mode, app_id=APP)  # type: ignore[arg-type]
        target.apply(first)
        target.apply(between)
        with pytest.MonkeyPatch.context() as m:
            if general:
                m.setattr(delta, "bulk_mirror", lambda rows: None)
                m.setattr(delta, "bulk_history", lambda rows: None)
            target.apply(changes(*txns) if name == "spooled" else second)
        tables.append(rows(target.to_arrow()))
    assert tables[0] == tables[1] == tables[2]
    current = [(1, "a2", "d1b"), (2, "c", "new"), (3, "y", "again"), (4, "x", None)]
    if mode == "mirror":
        assert tables[0] == current
    else:
        assert {r[:3] for r in tables[0] if r[4] is None} == set(current)
        assert (1, "a", "d1b") in {r[:3] for r in tables[0]}  # the version in between


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_inserts_into_a_table_without_a_key_stay_in_arrow(tmp_path: Path, mode: str) -> None:
    """A table without identity (pgbench_history: no primary key) only ever takes inserts:
    each row is a row of its own, duplicates included, appended in sequence order; the same
    rows as the general fold, batch after batch."""
    keyless = relation(("tid", INT4), ("delta", INT4), ("note", TEXT))
    batches = [
        envelope(
            txn(10, insert(keyless, tid=1, delta=5, note="a"), insert(keyless, tid=1, delta=5)),
            txn(20, insert(keyless, tid=2, delta=-3, note="b")),
            reverse=True,
        ),
        envelope(txn(30, insert(keyless, tid=1, delta=5, note="a")), txn(40)),
    ]
    for data in batches:
        folded = bulk_mirror(data) if mode == "mirror" else bulk_history(data)
        assert folded is not None
    assert bulk_mirror(envelope(txn(50, delete(keyless, tid=1)))) is None  # the general fold
    _fold_both_ways([txn(10, insert(keyless, tid=1, delta=5), insert(keyless, tid=1))], mode)
    tables, watermarks = [], []
    for name, general in (("fast", False), ("slow", True)):
        target = DeltaTarget(str(tmp_path / name), mode, app_id=APP)  # type: ignore[arg-type]
        for data in batches:
            with pytest.MonkeyPatch.context() as m:
                if general:
                    m.setattr(delta, "bulk_mirror", lambda rows: None)
                    m.setattr(delta, "bulk_history", lambda rows: None)
                target.apply(data)
        tables.append(sorted(rows(target.to_arrow()), key=repr))
        watermarks.append(target.watermark)
    assert tables[0] == tables[1] and watermarks[0] == watermarks[1]
    assert [r[:3] for r in tables[0]] == sorted(
        [(1, 5, "a"), (1, 5, None), (2, -3, "b"), (1, 5, "a")], key=repr
    )
    if mode == "history":  # versions that never end, each from its own change
        assert all(r[4] is None for r in tables[0])
        assert len({r[3]["ordinal"] + r[3]["commit_lsn"] * 10 for r in tables[0]}) == 4
