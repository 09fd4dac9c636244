"""A connected, idle tailing client must not hold up a fast shutdown of the server, and must
report the lost connection clearly (and reconnect, when it is allowed to) instead of crashing.

On a clean shutdown the walsender waits until the client's reported flush position equals what
it has sent (reference §8.5); a client that answers the server's reply-requested keepalives with
the idle keepalive position lets it go at once. Each test runs on its own server, which it stops.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.errors import ConnectionLost
from pgcdc.protocol import Lsn
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions
from pgcdc.replication.acknowledgement import end_lsn_of

from .helpers import PGCDC, Proc, wait_active, wait_for

PUB = "shut_pub"
SHUTDOWN_LIMIT = 5.0  # seconds; wal_sender_timeout (60 s) is what a stuck walsender would take


@pytest.fixture
def server(pg_server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """A private server of the same version (the test stops or restarts it)."""
    own = EmbeddedServer(pg_server.version).start()
    try:
        yield own
    finally:
        own.stop("immediate")


def setup(server: EmbeddedServer) -> tuple[Database, str]:
    db = server.create_database()
    db.execute(
        f"""CREATE TABLE a (id int PRIMARY KEY);
            CREATE TABLE unpublished (id int);
            CREATE PUBLICATION {PUB} FOR TABLE a"""
    )
    slot = f"{db.dbname}_shut"
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    return db, slot


def start_tail(db: Database, slot: str) -> Proc:
    """`pgcdc tail` with its default 10 s status interval, after it delivered one row."""
    tail = Proc([PGCDC, "tail", "-d", db.dsn, "-S", slot, "--publication", PUB])
    try:
        wait_active(db, slot)
        db.execute("INSERT INTO a VALUES (1)")
        wait_for(lambda: "Insert" in tail.stdout, timeout=15, what="the insert in tail's output")
        wait_active(db, slot)  # still connected, now idle
    except BaseException:
        tail.close()
        raise
    write_unpublished(db)
    return tail


def write_unpublished(db: Database) -> None:
    """WAL past the last published transaction: the walsender's sent position moves beyond
    anything the client confirmed, and only the idle keepalive acknowledgement (§8) can let
    a shutting-down walsender go before wal_sender_timeout."""
    db.execute("INSERT INTO unpublished SELECT generate_series(1, 100)")
    db.close()  # our own session must not be what the shutdown waits for


def timed_stop(server: EmbeddedServer, restart: bool = False) -> float:
    started = time.monotonic()
    if restart:
        server.restart("fast")
    else:
        server.stop("fast")
    return time.monotonic() - started


def test_idle_cli_tail_does_not_hold_up_fast_shutdown(server: EmbeddedServer) -> None:
    db, slot = setup(server)
    tail = start_tail(db, slot)
    try:
        elapsed = timed_stop(server)
        assert elapsed < SHUTDOWN_LIMIT, f"fast shutdown took {elapsed:.1f}s with a client tailing"
        wait_for(
            lambda: tail.stderr or not tail.running(),
            timeout=15,
            what="the client to notice the shutdown",
        )
        time.sleep(0.5)  # let it finish writing what it reports
        assert "Traceback" not in tail.stderr, tail.stderr
    finally:
        tail.close()


def test_idle_api_client_does_not_hold_up_fast_shutdown(server: EmbeddedServer) -> None:
    db, slot = setup(server)
    failures: list[BaseException] = []
    confirmed: list[Lsn] = []
    client = ReplicationClient(
        db.dsn, slot, StreamOptions((PUB,)), status_interval=10.0, reconnect=False
    )

    def run() -> None:
        try:
            with client:
                for _frame, message in client:
                    end = end_lsn_of(message)
                    if end is not None:
                        client.confirm(end)
                        confirmed.append(end)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_active(db, slot)
        db.execute("INSERT INTO a VALUES (1)")
        wait_for(lambda: confirmed, timeout=15, what="the insert to be confirmed")
        write_unpublished(db)
        elapsed = timed_stop(server)
        assert elapsed < SHUTDOWN_LIMIT, f"fast shutdown took {elapsed:.1f}s with a client tailing"
        thread.join(15)
        assert not thread.is_alive()
        assert len(failures) == 1 and isinstance(failures[0], ConnectionLost), failures
    finally:
        thread.join(1)


def test_api_client_without_reconnect_raises_connection_lost(server: EmbeddedServer) -> None:
    db, slot = setup(server)
    client = ReplicationClient(db.dsn, slot, StreamOptions((PUB,)), reconnect=False)
    threading.Timer(1.0, server.stop, ("fast",)).start()
    with pytest.raises(ConnectionLost) as raised, client:
        for _ in client:
            pass
    message = str(raised.value)
    assert "\n" not in message, f"multi-line error: {message!r}"


def test_cli_tail_reports_lost_connection_and_retries(server: EmbeddedServer) -> None:
    db, slot = setup(server)
    tail = start_tail(db, slot)
    try:
        timed_stop(server)
        wait_for(
            lambda: "connection lost" in tail.stderr or not tail.running(),
            timeout=15,
            what="the client to report the lost connection",
        )
        wait_for(
            lambda: "reconnecting" in tail.stderr or not tail.running(), timeout=10, what="a retry"
        )
        assert tail.running(), f"tail gave up (exit {tail.popen.returncode}):\n{tail.stderr}"
        assert "Traceback" not in tail.stderr
        tail.signal(signal.SIGINT)
        assert tail.wait(15) == 130
        assert tail.stderr.splitlines()[-1] == "pgcdc: interrupted"
        assert "Traceback" not in tail.stderr
    finally:
        tail.close()


def test_cli_tail_resumes_after_fast_restart(server: EmbeddedServer) -> None:
    db, slot = setup(server)
    tail = start_tail(db, slot)
    try:
        elapsed = timed_stop(server, restart=True)
        assert elapsed < SHUTDOWN_LIMIT, f"fast restart took {elapsed:.1f}s"
        db.execute("INSERT INTO a VALUES (2)")
        wait_for(
            lambda: tail.stdout.count("Insert") >= 2 or not tail.running(),
            timeout=30,
            what="the row inserted after the restart",
        )
        assert tail.running(), f"tail gave up (exit {tail.popen.returncode}):\n{tail.stderr}"
        assert tail.stdout.count("Insert") == 2, tail.stdout  # and the first row not again
        assert "connection lost" in tail.stderr
        assert "Traceback" not in tail.stderr
    finally:
        tail.close()
