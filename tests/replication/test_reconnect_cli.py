"""`pgcdc tail` when the network between it and a real server breaks (through `TcpProxy`):
Ctrl-C stops it while it reconnects, even to a server that never answers; a server that
stays down is said once, then given up on after `--reconnect-timeout`; a transaction cut off
by a lost connection is written once, whole (issue 14).
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.embedded import Database

from .helpers import PGCDC, Proc, TcpProxy, run_cli, unique, wait_active, wait_for

PUB = "net_pub"


@pytest.fixture
def proxy(pg: Database) -> Iterator[TcpProxy]:
    proxy = TcpProxy("127.0.0.1", pg.server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def setup(db: Database, proxy: TcpProxy) -> tuple[str, str]:
    """A published table `a` and a slot; the connection string through the proxy."""
    db.execute(
        f"CREATE TABLE a (id int PRIMARY KEY, pad text); CREATE PUBLICATION {PUB} FOR TABLE a"
    )
    slot = unique("net")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return db.server.dsn_for(db.dbname, port=proxy.port), slot


def start_tail(db: Database, dsn: str, slot: str, *extra: str) -> Proc:
    """`pgcdc tail` through the proxy, after it delivered one row."""
    tail = Proc([PGCDC, "tail", "-d", dsn, "-S", slot, "--publication", PUB, *extra])
    try:
        wait_active(db, slot)
        db.execute("INSERT INTO a VALUES (1)")
        wait_for(lambda: "Insert" in tail.stdout, timeout=15, what="the insert in tail's output")
    except BaseException:
        tail.close()
        raise
    return tail


def test_ctrl_c_while_reconnecting_to_a_server_that_never_answers(
    pg: Database, proxy: TcpProxy
) -> None:
    """Before, the connection attempt blocked in libpq without a timeout, deaf to SIGINT."""
    dsn, slot = setup(pg, proxy)
    tail = start_tail(pg, dsn, slot)
    try:
        proxy.blackhole()
        wait_for(lambda: "connection lost" in tail.stderr, timeout=15, what="the lost connection")
        time.sleep(1.0)  # now inside the next connection attempt, which gets no answer
        assert tail.running(), tail.stderr
        tail.signal(signal.SIGINT)
        assert tail.wait(10) == 130, tail.stderr
        assert tail.stderr.splitlines()[-1] == "pgcdc: interrupted"
        assert "Traceback" not in tail.stderr
    finally:
        tail.close()


@pytest.mark.parametrize("failure", ["refuse", "blackhole"])
def test_a_server_that_stays_down_is_said_once_then_given_up(
    failure: str, pg: Database, proxy: TcpProxy
) -> None:
    """Down (connections refused, many fast attempts) or hanging (each attempt waits): one line
    when the connection is lost, nothing per attempt, and after --reconnect-timeout one error
    line and exit status 1; the time is bounded even when the server never answers."""
    dsn, slot = setup(pg, proxy)
    tail = start_tail(pg, dsn, slot, "--reconnect-timeout", "4")
    try:
        getattr(proxy, failure)()
        started = time.monotonic()
        assert tail.wait(20) == 1, tail.stderr
        elapsed = time.monotonic() - started
        assert 3.5 < elapsed < 10, f"gave up after {elapsed:.1f} s"
        lost, error = tail.stderr.splitlines()
        assert lost.startswith("pgcdc: replication connection lost at "), lost
        assert "reconnecting (giving up after 4 s)" in lost
        assert error.startswith("pgcdc: error: gave up reconnecting after 4 s ("), error
        assert "the limit is 4 s" in error
        if failure == "refuse":
            assert "attempts" in error and "refused" in error, error
        else:
            assert "timeout" in error, error
    finally:
        tail.close()


def test_the_retry_state_is_shown_in_place_on_a_terminal(pg: Database, proxy: TcpProxy) -> None:
    dsn, slot = setup(pg, proxy)
    controller, terminal = pty.openpty()
    args = [PGCDC, "tail", "-d", dsn, "-S", slot, "--publication", PUB, "-f", os.devnull]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_active(pg, slot)
        proxy.refuse()
        wait_for(lambda: seen.count(b"attempt 3") > 0, timeout=20, what="three attempts shown")
        proxy.restore()
        wait_for(lambda: b"reconnected after" in seen, timeout=30, what="the reconnect")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
        reader.join(5)
        os.close(controller)
    text = seen.decode(errors="replace")
    whole_lines = [line for line in text.replace("\r\n", "\n").split("\n") if "\r" not in line]
    assert sum("connection lost" in line for line in text.split("\n")) == 1, text
    assert "\rpgcdc: reconnecting: down for " in text, text
    assert text.count("\rpgcdc: reconnecting: ") >= 3, text
    assert not any("reconnecting: down for" in line for line in whole_lines), text


@pytest.mark.parametrize(
    "extra",
    [(), ("--memory-limit", "100kB"), ("-P", "test_decoding")],
    ids=["messages", "messages-spilled", "plugin"],
)
def test_a_transaction_cut_off_by_a_lost_connection_is_written_once(
    extra: tuple[str, ...], pg: Database, proxy: TcpProxy, tmp_path: Path
) -> None:
    """The connection breaks in the middle of a 20,000-row transaction; the next session sends
    it again from its start. Before, the part already written stayed in the file and the whole
    transaction followed: duplicate rows, and a BEGIN without COMMIT."""
    dsn, slot = setup(pg, proxy)
    pg.execute("INSERT INTO a SELECT g, repeat('x', 50) FROM generate_series(1, 20000) g")
    out = tmp_path / "out.txt"
    proxy.cut_after(300_000)  # of about 2 MB
    args = ["tail", "-d", dsn, "-S", slot, "--publication", PUB, "--until-idle", "-f", str(out)]
    result = run_cli(*args, *extra, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "connection lost" in result.stderr, "the connection was not cut"
    lines = out.read_text().splitlines()
    if extra[:1] == ("-P",):
        begins = [line for line in lines if line.startswith("BEGIN")]
        commits = [line for line in lines if line.startswith("COMMIT")]
        rows = [line for line in lines if "INSERT" in line]
    else:
        begins = [line for line in lines if line.split()[1] == "Begin"]
        commits = [line for line in lines if line.split()[1] == "Commit"]
        rows = [line for line in lines if line.split()[1] == "Insert"]
    assert (len(begins), len(commits)) == (1, 1), f"{len(begins)} begins, {len(commits)} commits"
    assert len(rows) == len(set(rows)) == 20000
    assert lines[0] in begins and lines[-1] in commits
