"""Change frames decoded a column at a time (`pgcdc.protocol.columns`): the C type and the
Python reference give the same buffers, equal to the values `Decoder` gives row by row, and
both stop at the first frame they cannot take."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.protocol import Column, Decoder, Delete, Insert, Relation, TupleData, Update, encode
from pgcdc.protocol import columns as columns_module
from pgcdc.protocol.columns import PyRowColumns, change_frame, finish
from pgcdc.protocol.speedups import SPEEDUPS

RELID = 4242


def implementations() -> list[Any]:
    found: list[Any] = [PyRowColumns]
    if SPEEDUPS is not None:
        found.append(SPEEDUPS.RowColumns)
    return found


@st.composite
def tuples(draw: Any, ncols: int, kinds: bytes = b"tnub") -> TupleData:
    out, values = bytearray(), []
    for _ in range(ncols):
        kind = draw(st.sampled_from(kinds))
        out.append(kind)
        values.append(draw(st.binary(max_size=20)) if kind in b"tb" else None)
    return TupleData(bytes(out), tuple(values))


@st.composite
def messages(draw: Any, ncols: int) -> Any:
    kind = draw(st.sampled_from("IUD"))
    if kind == "I":
        return Insert(RELID, draw(tuples(ncols)))
    old_kind = draw(st.sampled_from(["K", "O", None] if kind == "U" else ["K", "O"]))
    old = None if old_kind is None else draw(tuples(ncols, b"tnb"))
    if kind == "U":
        return Update(RELID, old_kind=old_kind, old=old, new=draw(tuples(ncols)))
    return Delete(RELID, old_kind=old_kind, old=old)


def expected_cells(rows: list[TupleData | None], ncols: int) -> tuple[bytes, list[bytes | None]]:
    kinds = b"".join(bytes(ncols) if t is None else t.kinds for t in rows)
    values = [v for t in rows for v in (t.values if t is not None else [None] * ncols)]
    return kinds, values


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 5).flatmap(lambda n: st.tuples(st.just(n), st.lists(messages(n), max_size=8)))
)
def test_the_buffers_hold_every_value(case: tuple[int, list[Any]]) -> None:
    ncols, rows = case
    data = b"".join(change_frame(i + 1, 1000 + i, encode(m)) for i, m in enumerate(rows))
    data = b"xx" + data + b"yy"  # the range, not the whole buffer
    for implementation in implementations():
        collector = implementation(RELID, ncols)
        assert collector.add(data, 2, len(data) - 2) == len(data) - 2
        got = finish(collector)
        assert got.rows == len(rows)
        assert np.frombuffer(got.ordinal, "<i8").tolist() == list(range(1, len(rows) + 1))
        assert np.frombuffer(got.lsn, "<i8").tolist() == [1000 + i for i in range(len(rows))]
        ops = [{"Insert": 0, "Update": 1, "Delete": 2}[type(m).__name__] for m in rows]
        assert list(got.op) == ops
        assert list(got.old_kind) == [ord(getattr(m, "old_kind", None) or "\0") for m in rows]
        for side, kinds, offsets, values in (
            ("new", got.new_kinds, got.new_offsets, got.new_values),
            ("old", got.old_kinds, got.old_offsets, got.old_values),
        ):
            want_kinds, want_values = expected_cells([getattr(m, side, None) for m in rows], ncols)
            assert kinds == want_kinds
            ends = np.frombuffer(offsets, "<i4").tolist()
            cells = [values[a:b] for a, b in itertools.pairwise(ends)]
            assert cells == [v or b"" for v in want_values]
        assert finish(collector).rows == 0  # it starts over


@pytest.mark.parametrize("implementation", implementations())
def test_a_frame_it_cannot_take_stops_it_there(implementation: Any) -> None:
    rel = Relation(RELID, "public", "t", "d", (Column(1, "id", 23, -1),))
    good = change_frame(1, 10, encode(Insert(RELID, TupleData(b"t", (b"1",)))))
    other = change_frame(2, 11, encode(Insert(RELID + 1, TupleData(b"t", (b"2",)))))
    broken = change_frame(3, 12, encode(Insert(RELID, TupleData(b"t", (b"3",))))[:-1])
    for bad in (other, broken, change_frame(4, 13, b"T" + bytes(9))):
        data = good + bad + good
        collector = implementation(RELID, 1)
        assert collector.add(data, 0, len(data)) == len(good)
        assert finish(collector).rows == 1
    # the caller decodes the frame there and gets the precise error
    decoder = Decoder(1)
    decoder.relations[RELID] = rel
    with pytest.raises(Exception, match="Insert"):
        decoder.decode(broken[16:], 12)
    cut = good[:-3]
    collector = implementation(RELID, 1)
    assert collector.add(cut, 0, len(cut)) == 0  # a frame cut short is left alone


def test_the_c_type_is_used_when_built() -> None:
    made = columns_module.row_columns(RELID, 2)
    assert type(made).__name__ == ("RowColumns" if SPEEDUPS is not None else "PyRowColumns")
