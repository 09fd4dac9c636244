"""`--until-idle` while a large transaction is still open (issue 22, item 4).

With streaming on, the server sends the chunks of an in-progress transaction larger than
``logical_decoding_work_mem`` as it decodes them, and then nothing more until that transaction
ends. A consumer that stops once idle must not wait for it: it stops, says in one line which
transaction it left open, and confirms nothing of it, so that a later run receives the whole
transaction once it has committed.
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from pgcdc.capture import CaptureReader
from pgcdc.decoding import PluginRunner
from pgcdc.embedded import Database
from pgcdc.protocol import Decoder, StreamingMode, StreamStart, XLogData, parse_frame
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions

from .helpers import Collector, confirmed_flush, run_cli, unique

PUB = "big_pub"
ROWS = 2000  # about 200 kB of changes: well over logical_decoding_work_mem = 64kB


def setup(db: Database) -> str:
    db.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v text);
            CREATE PUBLICATION {PUB} FOR TABLE t;
            ALTER DATABASE {db.dbname} SET logical_decoding_work_mem = '64kB'"""
    )
    slot = unique("open")
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    return slot


@contextmanager
def open_transaction(db: Database) -> Iterator[tuple[psycopg.Connection, int]]:
    """A transaction that inserted ROWS rows and is still open, its WAL flushed (by a small
    transaction committed after it); (its connection, its xid). Commit it with `conn.commit()`."""
    conn = db.server.connect(db.dbname, autocommit=False)
    try:
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', 80) FROM generate_series(1, %s) g", (ROWS,)
        )
        xid = int(conn.execute("SELECT txid_current()").fetchone()[0])  # type: ignore[index]
        db.execute("INSERT INTO t VALUES (-1, 'committed after it')")
        yield conn, xid
    finally:
        conn.close()


def streaming(db: Database) -> str:
    return "parallel" if db.version >= 16 else "on"


def left_open_lines(stderr: str, xid: int) -> list[str]:
    return [
        line for line in stderr.splitlines() if f"streamed transaction {xid} still open" in line
    ]


def capture_transactions(path: Path) -> tuple[Collector, set[int]]:
    """The committed transactions of a capture, and the xids of its Stream Start messages."""
    collector = Collector()
    started: set[int] = set()
    with open(path, "rb") as file:
        reader = CaptureReader(io.BytesIO(file.read()))
    decoder = Decoder(reader.header.proto_version, reader.header.streaming)
    for record in reader:
        frame = parse_frame(record.frame)
        if isinstance(frame, XLogData):
            message = decoder.decode(frame.payload, frame.data_start)
            if message is not None:
                collector.feed(message)
                if isinstance(message, StreamStart):
                    started.add(message.xid)
    return collector, started


def big_rows(collector: Collector) -> list[int]:
    return sorted(
        int(change[2][0])
        for txn in collector.transactions
        for change in txn
        if change[0] == "I" and int(change[2][0]) > 0
    )


@pytest.mark.parametrize("command", ["record", "tail"])
def test_cli_until_idle_leaves_an_open_transaction(
    pg: Database, command: str, tmp_path: Path
) -> None:
    slot = setup(pg)
    out = tmp_path / "first"
    args = ["-d", pg.dsn, "-S", slot, "--publication", PUB, "--until-idle"]
    args += ["--streaming", streaming(pg)]
    with open_transaction(pg) as (conn, xid):
        first = run_cli(command, *args, "-f", str(out), timeout=90)
        assert first.returncode == 0, first.stderr
        lines = left_open_lines(first.stderr, xid)
        assert len(lines) == 1, first.stderr
        assert "not confirmed; the slot sends it again, whole, once it commits" in lines[0]
        if command == "record":
            collector, started = capture_transactions(out)
            assert xid in started, "the open transaction was not streamed: the test shows nothing"
            assert collector.transactions == [(("I", "t", ("-1", "committed after it")),)]
        else:
            text = out.read_text()
            assert f"StreamStart xid={xid}" in text, "the open transaction was not streamed"
            assert "StreamCommit" not in text and "id='-1'" in text
        held = confirmed_flush(pg, slot)
        conn.commit()
    second_out = tmp_path / "second"
    second = run_cli(command, *args, "-f", str(second_out), timeout=90)
    assert second.returncode == 0, second.stderr
    assert "still open" not in second.stderr
    assert confirmed_flush(pg, slot) > held
    if command == "record":
        collector, _ = capture_transactions(second_out)
        assert big_rows(collector) == list(range(1, ROWS + 1)), "not the whole transaction"
    else:
        # Streamed again, or (the slot having been confirmed past where it began) decoded
        # whole at its commit: the server's choice. Either way every row, once.
        text = second_out.read_text()
        inserted = re.findall(r" Insert (?:\(xid \d+\) )?public\.t: id='(\d+)'", text)
        assert sorted(map(int, inserted)) == list(range(1, ROWS + 1)), "not the whole transaction"


def test_api_until_idle_leaves_an_open_transaction(
    pg: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The same through the Python API: a PluginRunner (streaming on for a plugin without
    streaming callbacks: the assembler buffers the transaction) and a bare ReplicationClient."""
    slot = setup(pg)

    def run_plugin() -> list[int]:
        ids: list[int] = []
        runner = PluginRunner(
            pg.dsn,
            slot,
            "json",
            StreamOptions((PUB,)),
            sink=lambda write: ids.append(int(json.loads(write.data)["after"]["id"])),
            streaming="on",
            until_idle=True,
            reconnect=False,
        )
        within(60, runner.run, runner.stop)
        return ids

    def read_client() -> list[str]:
        kinds: list[str] = []
        client = ReplicationClient(
            pg.dsn,
            slot,
            StreamOptions((PUB,), streaming=StreamingMode(streaming(pg))),
            until_idle=True,
            reconnect=False,
            acknowledge=False,  # the slot stays before the transaction: it is streamed again
        )

        def read() -> None:
            with client:
                kinds.extend(type(message).__name__ for _, message in client)

        within(60, read, client.stop)
        return kinds

    with open_transaction(pg) as (conn, xid), caplog.at_level(logging.WARNING, "pgcdc"):
        kinds = read_client()
        assert "StreamStart" in kinds and "StreamCommit" not in kinds, kinds[:5]
        assert len(left_open_lines(caplog.text, xid)) == 1, caplog.text
        caplog.clear()
        assert run_plugin() == [-1]
        assert len(left_open_lines(caplog.text, xid)) == 1, caplog.text
        conn.commit()
    caplog.clear()
    with caplog.at_level(logging.WARNING, "pgcdc"):
        assert sorted(run_plugin()) == list(range(1, ROWS + 1)), "not the whole transaction"
    assert "still open" not in caplog.text


def within(seconds: float, run: Callable[[], object], stop: Callable[[], None]) -> None:
    """`run()` in a thread; fail (after `stop()`) if it has not returned after `seconds`."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        stop()
        thread.join(10)
        raise AssertionError(f"did not return within {seconds:.0f} s")
    if errors:
        raise errors[0]
