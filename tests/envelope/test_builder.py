"""`EnvelopeBuilder` builds each column with numpy and Arrow; these check it against the one
rule of `pgcdc.envelope.images`, row by row, on generated changes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.envelope import (
    ENVELOPE_ARROW_SCHEMA,
    ChangeBatch,
    EnvelopeBuilder,
    Shape,
    key_pairs,
    row_pairs,
)
from pgcdc.errors import ValueDecodeError
from pgcdc.protocol import Column, Delete, Insert, Relation, TupleData, Update

KINDS = b"tnu"


def relation(relid: int, ncols: int, keys: set[int], identity: str) -> Relation:
    columns = tuple(
        Column(1 if i in keys or identity == "f" else 0, f"c{i}", 25, -1) for i in range(ncols)
    )
    return Relation(relid, "public", f"t{relid}", identity, columns)


@st.composite
def relations(draw: Any) -> Relation:
    ncols = draw(st.integers(1, 6))
    identity = draw(st.sampled_from("dfn"))
    keys = set() if identity == "n" else draw(st.sets(st.integers(0, ncols - 1), max_size=ncols))
    return relation(draw(st.integers(1, 4)), ncols, keys, identity)


@st.composite
def tuples(draw: Any, rel: Relation, kinds: bytes = KINDS) -> TupleData:
    out_kinds = bytearray()
    values: list[bytes | None] = []
    for _ in rel.columns:
        kind = draw(st.sampled_from(kinds))
        out_kinds.append(kind)
        values.append(draw(st.text(max_size=5)).encode() if kind == ord("t") else None)
    return TupleData(bytes(out_kinds), tuple(values))


@st.composite
def changes(draw: Any) -> list[tuple[Any, ...]]:
    rels = draw(st.lists(relations(), min_size=1, max_size=3))
    out = []
    for ordinal in range(1, draw(st.integers(1, 12)) + 1):
        rel = draw(st.sampled_from(rels))
        op = draw(st.sampled_from(["insert", "update", "delete", "truncate", "message"]))
        if op == "insert":
            out.append((op, ordinal, rel, draw(tuples(rel, b"tn")), None, None))
        elif op == "update":
            old_kind = draw(st.sampled_from([None, "K", "O"]))
            old = None if old_kind is None else draw(tuples(rel, b"tn"))
            out.append((op, ordinal, rel, draw(tuples(rel)), old, old_kind))
        elif op == "delete":
            old_kind = draw(st.sampled_from(["K", "O"]))
            out.append((op, ordinal, rel, None, draw(tuples(rel, b"tn")), old_kind))
        else:
            out.append((op, ordinal, rel, None, None, None))
    return out


def pairs(value: Any) -> Any:
    return None if value is None else sorted(value)


@settings(max_examples=300, deadline=None)
@given(changes(), st.integers(0, 3))
def test_every_column_follows_the_image_rule(rows: list[tuple[Any, ...]], flush_at: int) -> None:
    builder = EnvelopeBuilder()
    builder.begin(0x1000, 77, 1_000_000, "origin")
    batches = []
    for i, (op, ordinal, rel, new, old, old_kind) in enumerate(rows):
        if op == "truncate":
            builder.truncate(ordinal, rel, True, False, 0x900 + i)
        elif op == "message":
            builder.message(ordinal, "p", b"x", True, 0x900 + i)
        elif op == "insert":
            builder.change(ordinal, Insert(rel.relid, new, xid=7), rel, 0x900 + i)
        elif op == "update":
            builder.change(ordinal, Update(rel.relid, old_kind, old, new), rel, 0x900 + i)
        else:
            builder.change(ordinal, Delete(rel.relid, old_kind, old), rel, 0x900 + i)
        if i == flush_at:  # a flush in the middle of a transaction
            batches.append(builder.flush())
    batches.append(builder.flush())
    table = pa.Table.from_batches(batches, schema=ENVELOPE_ARROW_SCHEMA)
    assert table.num_rows == len(rows)
    got = table.to_pylist()
    for (op, ordinal, rel, new, old, old_kind), row in zip(rows, got, strict=True):
        assert (row["op"], row["ordinal"], row["commit_lsn"], row["xid"]) == (
            op,
            ordinal,
            0x1000,
            77,
        )
        assert row["sequence"] == {"commit_lsn": 0x1000, "ordinal": ordinal}
        assert row["commit_ts"].isoformat() == "2000-01-01T00:00:01+00:00"
        if op == "message":
            assert row["table"] is None and row["message_prefix"] == "p"
            assert row["key"] is row["after"] is row["before"] is None
            continue
        assert (row["schema"], row["table"], row["relation_oid"]) == (
            "public",
            rel.relname,
            rel.relid,
        )
        assert [c["name"] for c in row["columns"]] == [c.name for c in rel.columns]
        if op == "truncate":
            assert row["truncate_cascade"] is True and row["key"] is None
            continue
        assert pairs(row["key"]) == pairs(key_pairs(rel, new, old))
        assert pairs(row["before"]) == pairs(row_pairs(rel, old, key_only=old_kind == "K"))
        assert pairs(row["after"]) == pairs(row_pairs(rel, new))
        unchanged = (
            None
            if new is None
            else [c.name for c, k in zip(rel.columns, new.kinds, strict=True) if k == ord("u")]
        )
        assert row["unchanged_toast"] == unchanged


def _build(rows: list[tuple[Any, ...]], flush_at: int) -> ChangeBatch:
    builder = EnvelopeBuilder()
    builder.begin(0x1000, 77, 1_000_000, None)
    parts = []
    for i, (op, ordinal, rel, new, old, old_kind) in enumerate(rows):
        if i == 3:
            builder.begin(0x2000, 78, 2_000_000, None)
        if op == "truncate":
            builder.truncate(ordinal, rel, True, False, 0x900 + i)
        elif op == "message":
            builder.message(ordinal, "p", b"x", True, 0x900 + i)
        elif op == "insert":
            builder.change(ordinal, Insert(rel.relid, new), rel, 0x900 + i)
        elif op == "update":
            builder.change(ordinal, Update(rel.relid, old_kind, old, new), rel, 0x900 + i)
        else:
            builder.change(ordinal, Delete(rel.relid, old_kind, old), rel, 0x900 + i)
        if i == flush_at:
            parts.append(builder.flush_rows())
    parts.append(builder.flush_rows())
    return ChangeBatch(parts)


@settings(max_examples=300, deadline=None)
@given(changes(), st.integers(0, 3))
def test_a_change_batch_holds_the_rows_per_shape(
    rows: list[tuple[Any, ...]], flush_at: int
) -> None:
    """The spool's view of a batch: per relation shape its rows, cell by cell as the server
    sent them (across flushes, and a transaction that goes on after one); None when a
    truncate or a message is among them. Its envelope is the builder's, in order."""
    batch = _build(rows, flush_at)
    assert batch.num_rows == len(rows)
    assert (batch.first_commit_lsn, batch.last_commit_lsn) == (
        0x1000,
        0x2000 if len(rows) > 3 else 0x1000,
    )
    assert batch.last_commit_time is not None and batch.last_commit_time.isoformat() == (
        "2000-01-01T00:00:02+00:00" if len(rows) > 3 else "2000-01-01T00:00:01+00:00"
    )
    assert batch.envelope().column("ordinal").to_pylist() == [r[1] for r in rows]
    shapes = batch.shape_rows()
    if any(r[0] in ("truncate", "message") for r in rows):
        assert shapes is None
        return
    assert shapes is not None
    expected: dict[Shape, list[tuple[Any, ...]]] = {}
    for i, row in enumerate(rows):
        expected.setdefault(Shape.of(row[2]), []).append((i, *row))
    assert [s.shape for s in shapes] == list(expected)
    codes = {"insert": 0, "update": 1, "delete": 2}
    for one in shapes:
        ncols = len(one.shape.columns)
        got_values = one.new_values.to_pylist()
        old_values = one.old_values.to_pylist()
        assert len(one) == len(expected[one.shape])
        places = {int(o): at for at, o in enumerate(one.ordinal)}  # (any order)
        for i, op, ordinal, _, new, old, old_kind in expected[one.shape]:
            at = places[ordinal]
            assert one.op[at] == codes[op] and one.ordinal[at] == ordinal
            assert one.lsn[at] == 0x900 + i
            assert one.commit_lsn[at] == (0x1000 if i < 3 else 0x2000)
            assert one.old_kind[at] == (0 if old_kind is None else ord(old_kind))
            for kinds, values, image in (
                (one.new_kinds, got_values, new),
                (one.old_kinds, old_values, old),
            ):
                cells = values[at * ncols : (at + 1) * ncols]
                if image is None:
                    assert list(kinds[at]) == [0] * ncols and cells == [None] * ncols
                    continue
                assert bytes(kinds[at]) == image.kinds
                assert cells == [None if v is None else v.decode() for v in image.values]


def test_a_value_that_is_not_utf8_names_its_table() -> None:
    rel = relation(7, 2, {0}, "d")
    builder = EnvelopeBuilder()
    builder.begin(0x1000, 1, None, None)
    builder.change(1, Insert(7, TupleData(b"tt", (b"1", b"\xff"))), rel, 0x900)
    batch = ChangeBatch([builder.flush_rows()])
    with pytest.raises(ValueDecodeError, match=r"public\.t7: a value is not UTF-8"):
        batch.shape_rows()


def test_a_change_batch_spans_its_transactions_in_any_order() -> None:
    """A partitioned table's batch reads its leaves' ranges one after the other, so its
    transactions do not come in commit order: the batch still spans the lowest to the
    highest commit (what a target's watermark becomes)."""
    leaf = relation(8, 2, {0}, "d")
    builder = EnvelopeBuilder()
    for lsn, ts in ((0x3000, 3_000_000), (0x1000, 5_000_000), (0x2000, 1_000_000)):
        builder.begin(lsn, 1, ts, None)
        builder.change(1, Insert(8, TupleData(b"tt", (str(lsn).encode(), b"x"))), leaf, lsn)
    batch = ChangeBatch([builder.flush_rows()])
    assert (batch.first_commit_lsn, batch.last_commit_lsn) == (0x1000, 0x3000)
    assert batch.last_commit_time is not None
    assert batch.last_commit_time.isoformat() == "2000-01-01T00:00:05+00:00"
