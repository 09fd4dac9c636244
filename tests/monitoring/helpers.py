"""Batch records as a pipeline writes them (for the batch log, plot and metrics tests), and
slots with WAL behind them."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgcdc.embedded import Database
from pgcdc.monitoring import BatchRecord
from pgcdc.protocol import Lsn
from replication.helpers import TailThread, unique, wait_active

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


def create_slot(db: Database) -> str:
    slot = unique("status")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return slot


def make_wal(db: Database, segments: int) -> None:
    """Write into `segments` WAL segments, one after the other (table t)."""
    for _ in range(segments):
        db.execute("INSERT INTO t VALUES (1)")
        db.execute("SELECT pg_switch_wal()")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@contextlib.contextmanager
def streamed_slot(db: Database) -> Iterator[tuple[str, TailThread, int]]:
    """A table t published as `pub`, and a slot that a `TailThread` streams while in the
    block: (slot, the thread, its walsender's pid)."""
    db.execute("CREATE TABLE t (id int); CREATE PUBLICATION pub FOR TABLE t")
    slot = create_slot(db)
    tail = TailThread(db.dsn, slot, "pub", status_interval=0.2)
    tail.start()
    try:
        yield slot, tail, wait_active(db, slot)
    finally:
        tail.finish(lambda: db.execute("INSERT INTO t VALUES (0)"))
