"""The batch log: what is appended is read back exactly, `since` filters, the file is bounded
(one rotation, both halves read), a line still being written is not read, a damaged one is
named."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from pgcdc.errors import MonitoringError
from pgcdc.monitoring import BatchLog, BatchRecord

from .helpers import START, batch_records


def test_round_trip_and_since(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "batches.jsonl")
    assert log.read() == []
    records = batch_records(10)
    records.append(BatchRecord(time=START, batch=11, changes=0, bytes=0))  # all optional unset
    for record in records:
        log.append(record)
    assert log.read() == records
    lines = (tmp_path / "batches.jsonl").read_text().splitlines()
    assert len(lines) == 11 and all(line.startswith('{"time":"2026-11-25T12:') for line in lines)
    assert log.read(since=records[6].time) == [records[6], *records[7:10]]


def test_bounded_by_one_rotation(tmp_path: Path) -> None:
    path = tmp_path / "batches.jsonl"
    records = batch_records(200)
    line_size = len(json.dumps(records[-1].to_json(), separators=(",", ":"))) + 1
    log = BatchLog(path, max_bytes=20 * line_size)
    for record in records:
        log.append(record)
    rotated = tmp_path / "batches.jsonl.1"
    assert rotated.exists()
    assert path.stat().st_size <= log.max_bytes and rotated.stat().st_size <= log.max_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batches.jsonl", "batches.jsonl.1"]
    kept = log.read()
    assert 20 <= len(kept) < 200
    assert kept == records[-len(kept) :], "the newest records, in order, none twice"


def test_partial_last_line_waits_and_damage_is_named(tmp_path: Path) -> None:
    path = tmp_path / "batches.jsonl"
    log = BatchLog(path)
    (first,) = batch_records(1)
    log.append(first)
    with open(path, "ab") as file:
        file.write(b'{"time":"2026-11-25T12:00:0')  # the writer is in the middle of a line
    assert log.read() == [first]

    path.write_text(path.read_text().splitlines()[0] + '\n{"batch": 2}\n')
    with pytest.raises(MonitoringError, match=r"batches.jsonl: line 2 is not a batch record"):
        log.read()


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
