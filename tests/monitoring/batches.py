"""Batch records as a pipeline writes them, for the batch log, plot and metrics tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgcdc.monitoring import BatchRecord
from pgcdc.protocol import Lsn

START = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
TARGETS = ("public.orders mirror", "public.orders history")


def batch_records(count: int, *, start: datetime = START, every: float = 2.0) -> list[BatchRecord]:
    """`count` batches `every` seconds apart: batch i has 100·(i+1) changes, lag growing then
    shrinking, both targets applied (the history target only in even batches)."""
    records = []
    lsn = Lsn.parse("0/3000000")
    for i in range(count):
        changes = 100 * (i + 1)
        first = lsn
        lsn = lsn + changes * 120
        targets = {TARGETS[0]: {"rows": changes, "seconds": 0.1 + 0.01 * i}}
        if i % 2 == 0:
            targets[TARGETS[1]] = {"rows": 2 * changes, "seconds": 0.2 + 0.01 * i}
        time = start + timedelta(seconds=every * (i + 1))
        records.append(
            BatchRecord(
                time=time,
                batch=i + 1,
                changes=changes,
                bytes=changes * 120,
                first_commit_lsn=str(first),
                last_commit_lsn=str(lsn),
                last_commit_time=time - timedelta(seconds=0.5 + (i % 5)),
                server_lsn=str(lsn + 4096 * (i % 5)),
                lag_bytes=4096 * (i % 5),
                lag_seconds=0.5 + (i % 5),
                seconds=0.3 + 0.02 * i,
                targets=targets,
            )
        )
    return records
