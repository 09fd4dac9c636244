"""The spool: batch planning by whole transactions, per-relation ranges read back as the
envelope, an interrupted transaction cut off, release, damage."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pgcdc.errors import SpoolError
from pgcdc.protocol import (
    Column,
    Insert,
    Lsn,
    Message,
    Relation,
    Truncate,
    TupleData,
    UndecodedChanges,
    XLogData,
    encode,
    encode_frame,
)
from pgcdc.records import encode_record, read_range
from pgcdc.spool import MESSAGES, Spool, SpoolRange, _spool, read_envelope

REL = Relation(16384, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "v", 25, -1)))
OTHER = Relation(16385, "public", "u", "d", (Column(1, "id", 23, -1),))


def insert(rel: Relation, i: int) -> bytes:
    values = (str(i).encode(), b"x" * 50)[: len(rel.columns)]
    return encode(Insert(rel.relid, TupleData(b"t" * len(values), values)))


def commit(spool: Spool, end: int, rows: int, rel: Relation = REL) -> None:
    spool.begin()
    for i in range(rows):
        spool.change(rel, end - 10, insert(rel, i))
    spool.commit(Lsn(end - 5), Lsn(end), 700 + end, 1_000_000, None)


def filled(tmp_path: Path, sizes: list[int], **kwargs: int) -> Spool:
    spool = Spool(tmp_path / "spool", **kwargs)
    for i, rows in enumerate(sizes, 1):
        commit(spool, 1000 * i, rows)
    return spool


def envelope(ranges: list[SpoolRange]) -> pa.Table:
    return pa.Table.from_batches(list(read_envelope(ranges)))


def test_plan_takes_whole_transactions_within_limits(tmp_path: Path) -> None:
    spool = filled(tmp_path, [3, 3, 5, 1])
    assert spool.plan(Lsn(0)) == (Lsn(4000), 12)
    assert spool.plan(Lsn(0), max_changes=6) == (Lsn(2000), 6)
    assert spool.plan(Lsn(0), max_changes=5) == (Lsn(1000), 3)
    # A transaction larger than the limit still makes a batch of its own.
    assert spool.plan(Lsn(2000), max_changes=2) == (Lsn(3000), 5)
    assert spool.plan(Lsn(4000)) == (Lsn(4000), 0)
    assert spool.plan(Lsn(0), upto=Lsn(2500)) == (Lsn(2000), 6)
    first = spool.batch(Lsn(0), Lsn(1000))
    assert spool.plan(Lsn(0), max_bytes=first.bytes * 2) == (Lsn(2000), 6)
    info = spool.batch(Lsn(1000), Lsn(3000))
    assert (info.transactions, info.changes) == (2, 8)
    assert (info.first_commit_lsn, info.last_commit_lsn) == (Lsn(1995), Lsn(2995))
    assert info.last_commit_time is not None and info.last_commit_time.year == 2000


def test_the_index_leaves_the_collector_one_object_per_transaction(tmp_path: Path) -> None:
    # What the index holds until Spark is through with it lives long enough to reach the
    # collector's oldest generation: under a steady load of small transactions, objects it
    # tracks there made a full pass start every two seconds (`_spool._Unit`).
    spool = Spool(tmp_path / "spool")
    for end in (1000, 2000, 3000):
        spool.begin()
        spool.change(REL, end - 10, insert(REL, 1))
        spool.change(OTHER, end - 9, insert(OTHER, 2))
        spool.commit(Lsn(end - 5), Lsn(end), 700 + end, 1_000_000, None)
    gc.collect(0)  # a tuple of untracked values is untracked by the pass that finds it,
    gc.collect(1)  # and the tuple of those tuples by the next: before the oldest generation
    txns = spool._txns
    assert len(txns) == 3 and all(len(t.units) == 2 for t in txns)
    for txn in txns:
        held = [txn.units, *txn.units, txn.end_lsn, txn.commit_lsn, txn.commit_ts]
        assert not any(gc.is_tracked(x) for x in held), txn
    assert spool.last_lsn == Lsn(3000) and type(spool.last_lsn) is Lsn
    assert spool.plan(Lsn(0)) == (Lsn(3000), 6) and type(spool.plan(Lsn(0))[0]) is Lsn


def test_pending_counts_the_changes_waiting(tmp_path: Path) -> None:
    spool = filled(tmp_path, [3, 3, 5, 1])
    assert spool.pending(Lsn(0)) == 12
    assert spool.pending(Lsn(2000)) == 6
    assert spool.pending(Lsn(0), upto=Lsn(2500)) == 6
    assert spool.pending(Lsn(0), at_most=4) == 6  # counting stops once past 4
    assert spool.pending(Lsn(4000)) == 0


def test_ranges_per_relation_read_back_as_the_envelope(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=1500)
    commit(spool, 1000, 2)
    spool.begin()  # a transaction of two tables, a truncate and a message
    spool.change(REL, 1990, insert(REL, 7))
    spool.change(OTHER, 1991, insert(OTHER, 8))
    spool.truncate([REL, OTHER], Truncate(1, (REL.relid, OTHER.relid)), 1992)
    spool.message(Message(1, Lsn(1993), "p", b"hi"))
    spool.commit(Lsn(1995), Lsn(2000), 9, None, "o")
    for end in (3000, 4000, 5000):
        commit(spool, end, 2)
    ranges = spool.ranges(Lsn(1000), Lsn(4000))
    assert set(ranges) == {REL.relid, OTHER.relid, MESSAGES}
    assert sum(r.changes for r in ranges[REL.relid]) == 2 + 4
    assert len({r.path for r in ranges[REL.relid]}) == len(ranges[REL.relid])  # one a segment
    rows = envelope([r for found in ranges.values() for r in found]).to_pylist()
    second = sorted(
        (r["ordinal"], r["op"], r["table"], r["origin"]) for r in rows if r["commit_lsn"] == 1995
    )
    assert second == [
        (1, "insert", "t", "o"),
        (2, "insert", "u", "o"),
        (3, "truncate", "t", "o"),
        (4, "truncate", "u", "o"),
        (5, "message", None, "o"),
    ]
    assert sorted(r["commit_lsn"] for r in rows if r["table"] == "t" and r["op"] == "insert") == [
        1995,
        2995,
        2995,
        3995,
        3995,
    ]
    assert next(r["after"] for r in rows if r["commit_lsn"] == 2995) == [
        ("id", "0"),
        ("v", "x" * 50),
    ]


def test_row_changes_written_as_runs_are_the_same_spool(tmp_path: Path) -> None:
    """`changes` (an `UndecodedChanges`) writes the same units, ordinals and
    frames as `change` one by one; also across record boundaries and with a truncate and a
    Relation message sent again (DDL) in between."""
    relations = {REL.relid: REL, OTHER.relid: OTHER}
    altered = Relation(REL.relid, "public", "t", "d", REL.columns[:1])

    def frame(rel: Relation, at: int, i: int) -> bytes:
        return encode_frame(XLogData(Lsn(at), Lsn(at), 0, insert(rel, i)))

    def script(spool: Spool, runs: bool) -> None:
        for end, rows in ((1000, 3), (2000, 40_000)):
            spool.begin(700, end - 5)
            items = [(REL if i % 3 else OTHER, end - 100 + i % 50, i) for i in range(rows)]
            frames = [frame(rel, at, i) for rel, at, i in items]
            if runs:
                for at in range(0, rows, 1000):
                    spool.changes(relations.__getitem__, UndecodedChanges(frames[at : at + 1000]))
            else:
                for rel, at, i in items:
                    spool.change(rel, at, insert(rel, i))
            spool.truncate([REL], Truncate(0, (REL.relid,)), end - 40)
            relations[REL.relid] = altered
            if runs:
                spool.changes(
                    relations.__getitem__, UndecodedChanges([frame(altered, end - 30, 1)])
                )
            else:
                spool.change(altered, end - 30, insert(altered, 1))
            relations[REL.relid] = REL
            spool.commit(Lsn(end - 5), Lsn(end), 700, 1_000_000, None)

    spools = {}
    for runs in (False, True):
        spools[runs] = spool = Spool(tmp_path / f"spool-{runs}")
        script(spool, runs)
    ranges = {runs: spool.ranges(Lsn(0), Lsn(2000)) for runs, spool in spools.items()}
    for relid in (REL.relid, OTHER.relid):  # (runs fill a record past its size: 1 MB + a run)
        assert [(r.changes, r.versions) for r in ranges[True][relid]] == [
            (r.changes, r.versions) for r in ranges[False][relid]
        ]
    rows = {
        runs: envelope([r for rs in found.values() for r in rs]) for runs, found in ranges.items()
    }
    assert rows[True].num_rows == 40_003 + 2 + 2  # and the truncates, the altered rows
    order = [("commit_lsn", "ascending"), ("ordinal", "ascending")]
    assert rows[True].sort_by(order).to_pylist() == rows[False].sort_by(order).to_pylist()


def test_an_interrupted_transaction_is_cut_off(tmp_path: Path) -> None:
    """After a lost connection the server sends a transaction again from its start."""
    spool = filled(tmp_path, [1])
    spool.begin()
    spool.change(REL, 1990, insert(REL, 1))
    spool.change(REL, 1991, insert(REL, 2))
    commit(spool, 2000, 1)  # begins again: the two changes above are gone
    rows = envelope(spool.ranges(Lsn(0), Lsn(2000))[REL.relid]).to_pylist()
    assert [(r["commit_lsn"], r["ordinal"]) for r in rows] == [(995, 1), (1995, 1)]


def test_release_deletes_finished_segments(tmp_path: Path) -> None:
    spool = filled(tmp_path, [2] * 6, segment_bytes=500)
    segments = sorted((tmp_path / "spool").iterdir())
    assert len(segments) >= 3
    spool.release(Lsn(4000))
    assert spool.plan(Lsn(0)) == (Lsn(6000), 4)
    remaining = sorted((tmp_path / "spool").iterdir())
    assert segments[0] not in remaining and remaining[-1] == segments[-1]
    assert spool.bytes_held == spool.batch(Lsn(0), Lsn(6000)).bytes
    spool.close()
    assert not (tmp_path / "spool").exists()


def test_held_commits_are_published_together(tmp_path: Path) -> None:
    """While commits are held, a committed transaction is neither planned nor on disk until
    it is published: when the oldest was held long enough, at the next commit or wait."""
    spool = Spool(tmp_path / "spool", segment_bytes=600)
    spool.hold_seconds = 3600.0
    assert spool.publish_due() is None  # nothing held
    for i in range(1, 5):
        commit(spool, 1000 * i, 2)
    assert spool.holding and spool.last_lsn is None
    assert spool.plan(Lsn(0)) == (Lsn(0), 0)
    assert all(f.stat().st_size == 0 for f in (tmp_path / "spool").iterdir())
    due = spool.publish_due()
    assert due is not None and 3590 < due <= 3600
    with pytest.raises(SpoolError, match="ending at 0/BB8 arrived after one ending at 0/FA0"):
        commit(spool, 3000, 1)  # checked against the held ones too
    spool.begin()  # that transaction is cut off (as after a lost connection)
    spool.hold_seconds = 0.001
    time.sleep(0.002)
    assert spool.publish_due() is None
    assert not spool.holding and spool.last_lsn == Lsn(4000)
    assert spool.plan(Lsn(0)) == (Lsn(4000), 8)
    assert len(list((tmp_path / "spool").iterdir())) >= 2  # rolled when published
    rows = envelope(spool.ranges(Lsn(0), Lsn(4000))[REL.relid]).to_pylist()
    assert [r["commit_lsn"] for r in rows] == [995] * 2 + [1995] * 2 + [2995] * 2 + [3995] * 2
    commit(spool, 5000, 1)
    assert spool.holding
    time.sleep(0.002)
    commit(spool, 6000, 1)  # the oldest held long enough: both published now
    assert not spool.holding and spool.last_lsn == Lsn(6000)


def test_held_commits_published_while_a_transaction_is_written(tmp_path: Path) -> None:
    """The session waits for the server in the middle of a transaction too: publishing then
    leaves the file it is being written to as it is (no new segment under it)."""
    spool = Spool(tmp_path / "spool", segment_bytes=300)
    spool.hold_seconds = 0.001
    commit(spool, 1000, 4)  # held; its file is past the segment size
    spool.begin()
    spool.change(REL, 1990, insert(REL, 7))
    time.sleep(0.002)
    assert spool.publish_due() is None and spool.last_lsn == Lsn(1000)
    spool.change(REL, 1991, insert(REL, 8))
    spool.commit(Lsn(1995), Lsn(2000), 9, None, None)
    spool.publish()
    rows = envelope(spool.ranges(Lsn(0), Lsn(2000))[REL.relid]).to_pylist()
    assert [(r["commit_lsn"], r["ordinal"]) for r in rows] == [(995, i) for i in range(1, 5)] + [
        (1995, 1),
        (1995, 2),
    ]
    commit(spool, 3000, 1)  # between transactions: a new segment now
    spool.publish()
    assert len(list((tmp_path / "spool").iterdir())) == 2


def test_an_interrupted_transaction_is_cut_off_while_commits_are_held(tmp_path: Path) -> None:
    """A lost connection mid-transaction while earlier commits wait to be published: the
    interrupted transaction is cut off, the held ones are published whole."""
    spool = Spool(tmp_path / "spool")
    spool.hold_seconds = 3600.0
    commit(spool, 1000, 2)
    spool.begin()
    spool.change(REL, 1990, insert(REL, 5))
    commit(spool, 2000, 1)  # sent again whole after the reconnect
    assert spool.holding and spool.last_lsn is None
    spool.publish()
    rows = envelope(spool.ranges(Lsn(0), Lsn(2000))[REL.relid]).to_pylist()
    assert [(r["commit_lsn"], r["ordinal"]) for r in rows] == [(995, 1), (995, 2), (1995, 1)]


def test_positions_must_increase(tmp_path: Path) -> None:
    spool = filled(tmp_path, [1, 1])
    with pytest.raises(SpoolError, match="ending at 0/3E8 arrived after one ending at 0/7D0"):
        commit(spool, 1000, 1)


def test_damaged_record_is_reported_with_its_position(tmp_path: Path) -> None:
    spool = filled(tmp_path, [1, 1])
    (whole,) = spool.ranges(Lsn(0), Lsn(2000))[REL.relid]
    data = bytearray(Path(whole.path).read_bytes())
    data[-3] ^= 0xFF
    Path(whole.path).write_bytes(bytes(data))
    with pytest.raises(SpoolError, match=r"spool file .*: record at byte \d+: checksum mismatch"):
        envelope([whole])
    for payload, what in ((b"C\x00", "a b'C' record of 2 bytes"), (b"F\x00\x07", "version 7")):
        short = tmp_path / "short.spool"
        short.write_bytes(encode_record(payload))
        bad = SpoolRange(REL.relid, str(short), 0, short.stat().st_size, 1, whole.versions)
        with pytest.raises(SpoolError, match=rf"spool file .*short.spool: .*{what}"):
            envelope([bad])
    missing = SpoolRange(REL.relid, str(tmp_path / "nowhere"), 0, 10, 1, ())
    with pytest.raises(SpoolError, match=r"cannot read spool file .*nowhere: .*No such file"):
        envelope([missing])


def test_a_change_that_does_not_decode_is_named_by_its_lsn_and_commit(tmp_path: Path) -> None:
    """A frame whose message does not fit its relation (a damaged spool the checksum missed,
    a bug): one line with the change's LSN and its transaction's commit position."""
    spool = filled(tmp_path, [1])
    spool.begin()
    spool.change(REL, 0x2F00, insert(REL, 1)[:-20])  # its last column cut short
    spool.commit(Lsn(0x2FF0), Lsn(0x3000), 9, None, None)
    ranges = spool.ranges(Lsn(0), Lsn(0x3000))[REL.relid]
    with pytest.raises(SpoolError, match=r"the change at LSN 0/2F00 \(commit 0/2FF0\): "):
        envelope(ranges)


def test_a_unit_in_several_records_reads_back_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most units are one record; one whose frames outgrow a record, or whose relation
    changes inside the transaction (DDL), is several: each record says which Relation its
    frames were sent under."""
    monkeypatch.setattr(_spool, "_CHUNK_BYTES", 300)
    wider = Relation(REL.relid, "public", "t", "d", (*REL.columns, Column(0, "w", 25, -1)))
    spool = Spool(tmp_path / "spool")
    commit(spool, 1000, 1)  # a unit of one record
    spool.begin()
    for i in range(7):  # about 100 bytes a frame: some records of frames, then the commit
        spool.change(REL, 1900 + i, insert(REL, i))
    spool.change(wider, 1950, encode(Insert(REL.relid, TupleData(b"ttt", (b"9", b"x", b"w")))))
    spool.change(wider, 1951, encode(Insert(REL.relid, TupleData(b"ttt", (b"10", b"y", b"z")))))
    spool.commit(Lsn(1995), Lsn(2000), 9, None, None)
    (whole,) = spool.ranges(Lsn(0), Lsn(2000))[REL.relid]
    tags = [r.payload[:1] for r in read_range(whole.path, whole.offset, whole.length)]
    assert tags[0] == b"C" and tags[-1] == b"C" and tags.count(b"F") >= 2
    rows = envelope([whole]).to_pylist()
    assert [(r["commit_lsn"], r["ordinal"]) for r in rows] == [(995, 1)] + [
        (1995, i) for i in range(1, 10)
    ]
    assert [len(r["after"]) for r in rows] == [2] * 8 + [3, 3]
    assert rows[-1]["after"] == [("id", "10"), ("v", "y"), ("w", "z")]
