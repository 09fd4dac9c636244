"""WAL with nothing published in it must not pile up behind a tailing client's slot.

PG15+ skips empty transactions, so a client whose publication sees no changes receives only
keepalives. It may acknowledge their walEnd while no transaction is open (reference §8); if it
did not, the slot's confirmed_flush_lsn (and restart_lsn, hence the retained WAL) would stay put.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ReplicationError
from pgcdc.protocol import Commit, Decoder, Insert, Lsn, XLogData, parse_frame
from pgcdc.replication import LogicalStream, ReplicationConnection, StreamOptions

from .helpers import (
    PGCDC,
    TailThread,
    confirmed_flush,
    current_wal_lsn,
    slot_row,
    spawn,
    wait_active,
    wait_for,
)

SENTINEL = -1


def setup_db(db: Database) -> str:
    db.execute(
        """CREATE TABLE a (id int PRIMARY KEY);
           CREATE TABLE b (id serial PRIMARY KEY, v text);
           CREATE PUBLICATION pub_a FOR TABLE a;"""
    )
    slot = f"{db.dbname}_idle"
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    return slot


@contextmanager
def tailing(db: Database, slot: str) -> Iterator[TailThread]:
    """A client (status every 0.5 s) that confirms every end LSN it is handed; on exit it is
    stopped by a sentinel row and must have received nothing else."""
    tail = TailThread(db.dsn, slot, "pub_a", status_interval=0.5)
    tail.start()
    try:
        wait_active(db, slot)
        yield tail
    finally:
        tail.finish(lambda: db.execute("INSERT INTO a VALUES (%s)", (SENTINEL,)))
    assert tail.collector.transactions == [(("I", "a", (str(SENTINEL),)),)]


def test_unpublished_workload_does_not_pile_up(pg: Database) -> None:
    slot = setup_db(pg)
    stop = threading.Event()
    committed = [0]

    def workload() -> None:
        with pg.connect() as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO b (v) VALUES (repeat('w', 200))")
                committed[0] += 1
                time.sleep(0.005)

    with tailing(pg, slot):
        writer = threading.Thread(target=workload, name="workload", daemon=True)
        writer.start()
        try:
            samples: list[tuple[Lsn, Lsn]] = []
            for _ in range(5):
                time.sleep(1.0)
                samples.append((confirmed_flush(pg, slot), current_wal_lsn(pg)))
        finally:
            stop.set()
            writer.join(10)
        assert committed[0] > 100, "the workload hardly ran"
        confirmed = [c for c, _ in samples]
        assert all(b > a for a, b in itertools.pairwise(confirmed)), (
            f"confirmed_flush_lsn did not advance at every sample: {[str(c) for c in confirmed]}"
        )
        for flushed, current in samples:
            assert flushed <= current, "confirmed past the server's WAL position"
            assert current - flushed < 4 * 1024 * 1024, f"{current - flushed} bytes behind"

        # Once the workload stops, the slot catches up with the WAL completely ...
        target = current_wal_lsn(pg)
        wait_for(
            lambda: confirmed_flush(pg, slot) >= target,
            timeout=15,
            what=f"confirmed_flush_lsn to reach {target}",
        )
        # ... and its restart_lsn, which decides what WAL is kept, moves too (a checkpoint
        # logs the running-xacts record the decoder needs for a new restart point).
        before = slot_row(pg, slot)
        assert before is not None

        def restart_moved() -> bool:
            pg.execute("CHECKPOINT")
            row = slot_row(pg, slot)
            return bool(row and row["restart_lsn"] > before["restart_lsn"])

        wait_for(restart_moved, timeout=20, interval=0.5, what="restart_lsn to advance")


@pytest.mark.parametrize("via", ["api", "cli"])
def test_idle_client_confirms_up_to_current_wal(pg: Database, via: str) -> None:
    slot = setup_db(pg)
    # WAL the publication does not cover, written after the slot was created.
    pg.execute("INSERT INTO b (v) SELECT repeat('x', 100) FROM generate_series(1, 500)")
    pg.execute("CREATE TABLE c (id int)")

    def reaches_current() -> None:
        target = current_wal_lsn(pg)
        start = confirmed_flush(pg, slot)
        assert start < target, "precondition: the slot starts behind the WAL"
        wait_for(
            lambda: confirmed_flush(pg, slot) >= target,
            timeout=15,
            what=f"confirmed_flush_lsn to reach pg_current_wal_lsn() {target} (from {start})",
        )

    if via == "api":
        with tailing(pg, slot):
            reaches_current()
        return
    args = [PGCDC, "tail", "-d", pg.dsn, "-S", slot, "--publication", "pub_a", "-s", "0.5"]
    with spawn(args) as tail:
        wait_active(pg, slot)
        reaches_current()
        assert tail.running(), tail.stderr
        pg.execute("INSERT INTO a VALUES (42)")
        wait_for(lambda: "id='42'" in tail.stdout, timeout=15, what="the insert in tail's output")
        assert "Traceback" not in tail.stderr


def test_stop_ends_an_idle_client(pg: Database) -> None:
    slot = setup_db(pg)
    tail = TailThread(pg.dsn, slot, "pub_a", status_interval=0.5)
    tail.start()
    try:
        wait_active(pg, slot)
        tail.client.stop()  # e.g. from a signal handler or a supervising thread
        tail.join(5)
        assert not tail.is_alive(), "stop() did not end an idle client within 5 s"
    finally:
        tail.finish(lambda: pg.execute("INSERT INTO a VALUES (%s)", (SENTINEL,)))


def test_a_stream_calls_on_wait_before_each_wait(pg_one: Database) -> None:
    """`LogicalStream.on_wait` runs whenever nothing is buffered and the socket must be
    waited for, again within the seconds it returns, without ending a read before its
    timeout; what arrives meanwhile comes through whole."""
    slot = setup_db(pg_one)
    calls: list[float] = []

    def on_wait() -> float:
        calls.append(time.monotonic())
        return 0.01

    with ReplicationConnection.connect(pg_one.dsn) as conn:
        conn.start_replication(
            slot, Lsn(0), StreamOptions(("pub_a",)).negotiate(conn.server_version)
        )
        started = time.monotonic()
        while conn.read_copy_data(0.3, on_wait) is not None:  # keepalives, if any
            started = time.monotonic()
        assert time.monotonic() - started >= 0.3  # the read's own timeout, not on_wait's
        assert len(calls) >= 10
    calls.clear()
    with ReplicationConnection.connect(pg_one.dsn) as conn:
        stream = LogicalStream(conn, slot, StreamOptions(("pub_a",)), status_interval=0.5)
        stream.on_wait = on_wait
        stream.start()
        pg_one.execute("INSERT INTO a SELECT generate_series(1, 3)")
        inserted = []
        for _, message in stream:
            if isinstance(message, Insert):
                inserted.append(message.new.values[0])
            elif isinstance(message, Commit):
                break
        stream.stop()
    assert inserted == [b"1", b"2", b"3"]
    assert calls  # it waited for the insert's transaction


def test_a_trickle_gathers_and_is_read_with_one_wait(pg_one: Database) -> None:
    """With `gather_seconds`, a reader that caught up and waited for the socket pauses before
    reading, and what follows arrives meanwhile: transactions committed one by one, 10 ms
    apart, are read after one wait (without it, about a wait each), none lost or reordered."""
    slot = setup_db(pg_one)

    def trickle(gather: float) -> tuple[list[bytes], int]:
        first = next(values)
        with ReplicationConnection.connect(pg_one.dsn) as conn:
            conn.start_replication(
                slot, Lsn(0), StreamOptions(("pub_a",)).negotiate(conn.server_version)
            )
            conn.gather_seconds = gather
            decoder = Decoder(1)

            def inserted(data: bytes) -> bytes | None:
                frame = parse_frame(data)
                if isinstance(frame, XLogData):
                    message = decoder.decode(frame.payload, frame.data_start)
                    if isinstance(message, Insert):
                        return message.new.values[0]
                return None

            while (data := conn.read_copy_data(0.3)) is not None:  # earlier rows, keepalives
                inserted(data)
            waits = 0
            wait = conn._wait_readable

            def counted(*args: Any) -> bool | None:
                nonlocal waits
                waited = wait(*args)
                waits += bool(waited)  # the socket was waited for, not found readable
                return waited

            conn._wait_readable = counted  # type: ignore[method-assign]

            def insert() -> None:
                with pg_one.connect() as writer:
                    for i in range(5):
                        writer.execute("INSERT INTO a VALUES (%s)", (first * 10 + i,))
                        time.sleep(0.01)

            writer = threading.Thread(target=insert)
            writer.start()
            rows: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(rows) < 5:
                assert time.monotonic() < deadline, "the trickle did not arrive"
                if (data := conn.read_copy_data(1.0)) is None:  # (or a message in part)
                    continue
                if (value := inserted(data)) is not None:
                    rows.append(value)
            writer.join()
            return rows, waits

    values = itertools.count(1)
    rows, waits = trickle(1.0)
    assert rows == [str(10 + i).encode() for i in range(5)]
    assert waits == 1
    rows, waits = trickle(0.0)
    assert rows == [str(20 + i).encode() for i in range(5)]
    assert waits >= 3


def test_a_backlog_is_read_without_gathering(pg_one: Database) -> None:
    """The pause is for a trickle only: a reader that finds the socket readable (it is behind)
    or read much since its last wait does not sleep, so a backlog (here 4 MB) is not slowed
    down whatever `gather_seconds` says."""
    pg_one.execute(
        """CREATE TABLE wide (id int PRIMARY KEY, v text);
           CREATE PUBLICATION pub_wide FOR TABLE wide;"""
    )
    slot = f"{pg_one.dbname}_backlog"
    with ReplicationConnection.connect(pg_one.dsn) as conn:
        conn.create_slot(slot)
    for t in range(20):
        pg_one.execute(
            "INSERT INTO wide SELECT i, repeat(md5(i::text), 64) "
            "FROM generate_series(%s::int, %s::int) i",
            (t * 100, t * 100 + 99),
        )
    sleeps: list[float] = []
    with ReplicationConnection.connect(pg_one.dsn) as conn:
        conn.start_replication(
            slot, Lsn(0), StreamOptions(("pub_wide",)).negotiate(conn.server_version)
        )
        conn.gather_seconds = 0.2
        real_sleep = time.sleep
        commits = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(time, "sleep", lambda s: (sleeps.append(s), real_sleep(s)))
            decoder = Decoder(1)
            deadline = time.monotonic() + 30
            while commits < 20:
                assert time.monotonic() < deadline, "the backlog did not arrive"
                if (data := conn.read_copy_data(1.0)) is None:  # (or a message in part)
                    continue
                frame = parse_frame(data)
                if isinstance(frame, XLogData):
                    commits += isinstance(decoder.decode(frame.payload, frame.data_start), Commit)
    # the first wait (nothing read before it) may pause; a pause per catching up would be many
    assert len(sleeps) <= 2, sleeps


def test_a_walsender_ended_while_a_trickle_gathers(pg_one: Database) -> None:
    """The class beside the pause: the server ends the session during it. What arrived
    before the end is read, then one precise error (no hang, no traceback of libpq's)."""
    slot = setup_db(pg_one)
    with ReplicationConnection.connect(pg_one.dsn) as conn:
        conn.start_replication(
            slot, Lsn(0), StreamOptions(("pub_a",)).negotiate(conn.server_version)
        )
        conn.gather_seconds = 1.0
        while conn.read_copy_data(0.3) is not None:  # keepalives
            pass

        def insert_then_end() -> None:
            pg_one.execute("INSERT INTO a VALUES (77)")
            time.sleep(0.3)  # inside the reader's pause
            pg_one.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (slot,),
            )

        ender = threading.Thread(target=insert_then_end)
        ender.start()
        decoder = Decoder(1)
        inserted: list[bytes | None] = []
        deadline = time.monotonic() + 30
        with pytest.raises(ReplicationError) as ended:
            while time.monotonic() < deadline:
                if (data := conn.read_copy_data(1.0)) is None:
                    continue
                frame = parse_frame(data)
                if isinstance(frame, XLogData):
                    message = decoder.decode(frame.payload, frame.data_start)
                    if isinstance(message, Insert):
                        inserted.append(message.new.values[0])
        ender.join()
    assert inserted == [b"77"]
    assert "\n" not in str(ended.value) and str(ended.value)
