"""The spool: batch planning by whole transactions, ranges for executors, release, damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.decoding.model import Change, ChangeAction
from pgcdc.errors import SpoolError
from pgcdc.protocol import Column, Lsn, Relation, TupleData
from pgcdc.spark.envelope import SpooledTransaction
from pgcdc.spark.spool import Spool, SpoolRange, read_range

REL = Relation(16384, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "v", 25, -1)))


def txn(end: int, rows: int) -> SpooledTransaction:
    changes = [
        Change(
            ChangeAction.INSERT,
            REL,
            TupleData(b"tt", (str(i).encode(), b"x" * 50)),
            lsn=Lsn(end - 10),
        )
        for i in range(rows)
    ]
    return SpooledTransaction(Lsn(end - 5), Lsn(end), 700 + end, 0, None, list(changes))


def filled(tmp_path: Path, sizes: list[int], **kwargs: int) -> Spool:
    spool = Spool(tmp_path / "spool", **kwargs)
    for i, rows in enumerate(sizes, 1):
        spool.append(txn(1000 * i, rows))
    return spool


def test_plan_takes_whole_transactions_within_limits(tmp_path: Path) -> None:
    spool = filled(tmp_path, [3, 3, 5, 1])
    assert spool.plan(Lsn(0)) == (Lsn(4000), 12)
    assert spool.plan(Lsn(0), max_changes=6) == (Lsn(2000), 6)
    assert spool.plan(Lsn(0), max_changes=5) == (Lsn(1000), 3)
    # A transaction larger than the limit still makes a batch of its own.
    assert spool.plan(Lsn(2000), max_changes=2) == (Lsn(3000), 5)
    assert spool.plan(Lsn(4000)) == (Lsn(4000), 0)
    assert spool.plan(Lsn(0), upto=Lsn(2500)) == (Lsn(2000), 6)
    one_record = spool.ranges(Lsn(0), Lsn(1000), target_bytes=1)[0].length
    assert spool.plan(Lsn(0), max_bytes=one_record * 2) == (Lsn(2000), 6)


def test_ranges_cover_the_batch_and_read_back(tmp_path: Path) -> None:
    spool = filled(tmp_path, [2, 2, 2, 2, 2], segment_bytes=1500)
    ranges = spool.ranges(Lsn(1000), Lsn(4000), target_bytes=1)
    assert [r.changes for r in ranges] == [2, 2, 2]
    read = [t.end_lsn for r in ranges for t in read_range(r)]
    assert read == [2000, 3000, 4000]
    whole = spool.ranges(Lsn(0), Lsn(5000), target_bytes=1 << 20)
    assert sum(r.changes for r in whole) == 10
    assert len({r.path for r in whole}) == len(whole)  # one range per segment at most
    first = next(read_range(whole[0]))
    assert first.entries[1].new.values == (b"1", b"x" * 50)


def test_release_deletes_finished_segments(tmp_path: Path) -> None:
    spool = filled(tmp_path, [2] * 6, segment_bytes=1500)
    segments = sorted((tmp_path / "spool").iterdir())
    assert len(segments) >= 3
    spool.release(Lsn(4000))
    assert spool.plan(Lsn(0)) == (Lsn(6000), 4)
    remaining = sorted((tmp_path / "spool").iterdir())
    assert segments[0] not in remaining and remaining[-1] == segments[-1]
    assert (
        spool.bytes_held
        < sum(r.length for r in spool.ranges(Lsn(0), Lsn(6000), target_bytes=1)) + 1
    )
    spool.close()
    assert not (tmp_path / "spool").exists()


def test_positions_must_increase(tmp_path: Path) -> None:
    spool = filled(tmp_path, [1, 1])
    with pytest.raises(SpoolError, match="ending at 0/3E8 arrived after one ending at 0/7D0"):
        spool.append(txn(1000, 1))


def test_damaged_record_is_reported_with_its_position(tmp_path: Path) -> None:
    spool = filled(tmp_path, [1, 1])
    (whole,) = spool.ranges(Lsn(0), Lsn(2000), target_bytes=1 << 20)
    data = bytearray(Path(whole.path).read_bytes())
    data[-3] ^= 0xFF
    Path(whole.path).write_bytes(bytes(data))
    records = read_range(whole)
    next(records)
    with pytest.raises(SpoolError, match=r"record at byte \d+ is damaged"):
        next(records)
    missing = SpoolRange(str(tmp_path / "nowhere"), 0, 10, 1)
    with pytest.raises(SpoolError, match="shared storage"):
        list(read_range(missing))
