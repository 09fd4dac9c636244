"""The batch log: what is appended is read back exactly, `since` filters, the log is bounded
(segments written whole, the oldest removed), a writer that starts again goes on with the
newest segment, a line cut short is not read, a damaged one is named."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from pgcdc.errors import MonitoringError
from pgcdc.monitoring import BatchLog, BatchRecord

from .helpers import START, batch_records


def test_round_trip_and_since(tmp_path: Path) -> None:
    log = BatchLog.at(tmp_path / "batches")
    assert log.read() == []
    records = batch_records(10)
    records.append(BatchRecord(time=START, batch=11, changes=0, bytes=0))  # all optional unset
    for record in records:
        log.append(record)
    assert log.read() == records
    (segment,) = (tmp_path / "batches").iterdir()
    lines = segment.read_text().splitlines()
    assert segment.name == "0000000001.jsonl"
    assert len(lines) == 11 and all(line.startswith('{"time":"2026-11-25T12:') for line in lines)
    assert log.read(since=records[6].time) == [records[6], *records[7:10]]


def _line_size(record: BatchRecord) -> int:
    return len(json.dumps(record.to_json(), separators=(",", ":"))) + 1


def test_bounded_by_segments(tmp_path: Path) -> None:
    records = batch_records(200)
    line = _line_size(records[-1])
    limits = {"max_bytes": 40 * line, "segment_bytes": 10 * line}
    log = BatchLog.at(tmp_path / "batches", **limits)
    for record in records[:120]:
        log.append(record)
    # A writer that starts again (a new run) goes on with the newest segment.
    log = BatchLog.at(tmp_path / "batches", **limits)
    for record in records[120:]:
        log.append(record)
    segments = sorted((tmp_path / "batches").iterdir())
    assert 2 <= len(segments) <= 4, segments  # the oldest were removed
    assert all(p.stat().st_size <= limits["segment_bytes"] for p in segments)
    assert sum(p.stat().st_size for p in segments) <= limits["max_bytes"]
    numbers = [int(p.stem) for p in segments]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    kept = log.read()
    assert 20 <= len(kept) < 200
    assert kept == records[-len(kept) :], "the newest records, in order, none twice"


def test_cut_short_line_is_not_read_and_damage_is_named(tmp_path: Path) -> None:
    log = BatchLog.at(tmp_path / "batches")
    first, second = batch_records(2)
    log.append(first)
    segment = tmp_path / "batches" / "0000000001.jsonl"
    with open(segment, "ab") as file:
        file.write(b'{"time":"2026-11-25T12:00:0')  # a writer of another kind died mid-line
    assert log.read() == [first]
    # A new writer does not glue its lines to the cut one: it starts a segment.
    again = BatchLog.at(tmp_path / "batches")
    again.append(second)
    assert again.read() == [first, second]
    assert sorted(p.name for p in (tmp_path / "batches").iterdir()) == [
        "0000000001.jsonl",
        "0000000002.jsonl",
    ]

    segment.write_text(segment.read_text().splitlines()[0] + '\n{"batch": 2}\n')
    with pytest.raises(MonitoringError, match=r"0000000001.jsonl: line 2 is not a batch record"):
        log.read()


def test_a_log_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "batches").write_text("a file, not a directory")
    log = BatchLog.at(tmp_path / "batches")
    with pytest.raises(MonitoringError, match=r"cannot write the batch log: .*/batches: "):
        log.append(batch_records(1)[0])


def test_record_times_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        BatchRecord(time=START.replace(tzinfo=None), batch=1, changes=0, bytes=0)
    with pytest.raises(ValueError, match="last_commit_time"):
        BatchRecord(
            time=START,
            batch=1,
            changes=0,
            bytes=0,
            last_commit_time=(START - timedelta(seconds=1)).replace(tzinfo=None),
        )
