"""Outputs that cannot be made durable, and outputs that fill up (issue 22, item 3).

A character device or a FIFO is a valid output of `pgcdc tail -f` and `pgcdc record -f`: it is
written, one warning line says that it cannot be made durable, and the slot is confirmed as
output is written. A write that fails (``/dev/full``: ENOSPC; a regular file past the process's
file size limit: EFBIG) is one error line, and the slot is never confirmed past what was made
durable: every transaction is either whole in the file or sent again by the slot.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import subprocess
import threading
from pathlib import Path

import pytest

from pgcdc.capture import CaptureReader
from pgcdc.embedded import Database
from pgcdc.errors import CaptureError
from pgcdc.protocol import Commit, Decoder, Insert, XLogData, parse_frame
from pgcdc.replication import ReplicationConnection

from .helpers import (
    PGCDC,
    assert_one_error_line,
    confirmed_flush,
    current_wal_lsn,
    run_cli,
    unique,
    wait_for,
)

PUB = "out_pub"
NOT_DURABLE = "cannot be made durable, so nothing waits for it"


def setup(db: Database, rows: int = 3) -> str:
    db.execute(f"CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION {PUB} FOR TABLE t")
    slot = unique("out")
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    if rows:
        db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, %s) g", (rows,))
    return slot


def stream_args(db: Database, slot: str) -> list[str]:
    return ["-d", db.dsn, "-S", slot, "--publication", PUB, "--until-idle"]


COMMANDS = {
    "tail": ["tail"],
    "tail -P": ["tail", "-P", "json"],
    "record": ["record"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_character_device_is_written_and_confirmed(pg: Database, command: str) -> None:
    slot = setup(pg)
    before = confirmed_flush(pg, slot)
    result = run_cli(*COMMANDS[command], *stream_args(pg, slot), "-f", "/dev/null")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if NOT_DURABLE in line]
    assert warnings == [
        "pgcdc: warning: /dev/null is a character device: what is written to it cannot be made "
        "durable, so nothing waits for it (the slot is confirmed as output is written)"
    ], result.stderr
    assert "Traceback" not in result.stderr and "error" not in result.stderr
    assert confirmed_flush(pg, slot) > before, "the slot did not move"
    again = run_cli("tail", *stream_args(pg, slot), "--no-confirm")
    assert "Insert" not in again.stdout, "the changes were not confirmed"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_fifo_is_written_and_confirmed(pg: Database, command: str, tmp_path: Path) -> None:
    slot = setup(pg)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = bytearray()

    def read() -> None:
        with open(fifo, "rb") as reader:
            received.extend(reader.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result = run_cli(*COMMANDS[command], *stream_args(pg, slot), "-f", str(fifo))
    reader.join(30)
    assert result.returncode == 0, result.stderr
    assert f"pgcdc: warning: {fifo} is a FIFO: what is written" in result.stderr
    assert sum(NOT_DURABLE in line for line in result.stderr.splitlines()) == 1
    if command == "record":
        assert sorted(committed_ids_in_capture(bytes(received))) == [1, 2, 3]
    else:
        assert sorted(committed_ids_in_text(bytes(received).decode())) == [1, 2, 3]
    again = run_cli("tail", *stream_args(pg, slot), "--no-confirm")
    assert "Insert" not in again.stdout, "the changes were not confirmed"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_full_device_is_one_line_and_moves_nothing(pg: Database, command: str) -> None:
    slot = setup(pg, rows=2000)  # more than a write buffer
    before = confirmed_flush(pg, slot)
    result = run_cli(*COMMANDS[command], *stream_args(pg, slot), "-f", "/dev/full")
    # A device: the warning that it cannot be made durable may come first (at the first
    # status update, before anything was written).
    lines = [line for line in result.stderr.splitlines() if NOT_DURABLE not in line]
    result.stderr = "".join(f"{line}\n" for line in lines)
    assert_one_error_line(result, "cannot write /dev/full: No space left on device")
    assert confirmed_flush(pg, slot) == before, "confirmed past what was written"


def test_a_regular_file_gets_no_warning(pg: Database, tmp_path: Path) -> None:
    slot = setup(pg)
    result = run_cli("record", *stream_args(pg, slot), "-f", str(tmp_path / "c.pgcap"))
    assert result.returncode == 0 and NOT_DURABLE not in result.stderr, result.stderr


def limit_file_size(limit: int) -> None:
    """In the child: writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_that_fills_up_loses_nothing(pg: Database, command: str, tmp_path: Path) -> None:
    """The file takes the first transactions (synced, and the slot confirmed past them), then
    a write fails: one line, and every transaction is whole in the file or sent again."""
    slot = setup(pg, rows=0)
    path = tmp_path / "out"
    args = [PGCDC, *COMMANDS[command], *stream_args(pg, slot)[:-1], "-s", "0.2", "-f", str(path)]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: limit_file_size(32 * 1024),
    )
    try:
        pg.execute("INSERT INTO t VALUES (1, 'v')")
        first = current_wal_lsn(pg)
        rows = [1]

        def confirmed() -> bool:
            # `record` syncs (and confirms) at a transaction's end a second after the last
            # sync: a few more small transactions bring one.
            rows.append(rows[-1] + 1)
            pg.execute("INSERT INTO t VALUES (%s, 'v')", (rows[-1],))
            return confirmed_flush(pg, slot) >= first or proc.poll() is not None

        wait_for(confirmed, timeout=30, interval=0.3, what="the first transaction's confirm")
        assert proc.poll() is None, proc.communicate()[1]
        pg.execute(  # one transaction per row, far more than the file can take
            f"DO $$ BEGIN FOR i IN {rows[-1] + 1}..1000 LOOP "
            "INSERT INTO t VALUES (i, repeat('w', 50)); COMMIT; END LOOP; END $$"
        )
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = subprocess.CompletedProcess(args, proc.returncode, "", stderr)
    assert_one_error_line(result, f"cannot write {path}: File too large")
    data = path.read_bytes()
    written = (
        committed_ids_in_capture(data)
        if command == "record"
        else committed_ids_in_text(data.decode(errors="replace"))
    )
    assert 1 in written and len(written) < 1000, "the file did not fill up midway"
    resent = committed_ids_in_text(run_cli("tail", *stream_args(pg, slot), "--no-confirm").stdout)
    assert set(written) | set(resent) == set(range(1, 1001)), "a transaction was lost"


_INSERT = re.compile(r" Insert public\.t: id='(\d+)'")


def committed_ids_in_text(text: str) -> list[int]:
    """The ids inserted by transactions whose Commit line (or, with -P json, whose lines) is
    complete in `text`."""
    ids: list[int] = []
    pending: list[int] = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        if (found := _INSERT.search(line)) is not None:
            pending.append(int(found.group(1)))
        elif line.startswith("{"):  # the json plugin: a line per change, written at commit
            ids.append(int(json.loads(line)["after"]["id"]))
        elif " Commit " in line:
            ids.extend(pending)
            pending = []
    return ids


def committed_ids_in_capture(data: bytes) -> list[int]:
    """The ids inserted by transactions whose Commit is among the capture's intact records."""
    reader = CaptureReader(io.BytesIO(data))
    decoder = Decoder(reader.header.proto_version, reader.header.streaming)
    ids: list[int] = []
    pending: list[int] = []
    try:
        for record in reader:
            frame = parse_frame(record.frame)
            if not isinstance(frame, XLogData):
                continue
            message = decoder.decode(frame.payload, frame.data_start)
            if isinstance(message, Insert):
                value = message.new.values[0]
                assert value is not None
                pending.append(int(bytes(value)))
            elif isinstance(message, Commit):
                ids.extend(pending)
                pending = []
    except CaptureError:
        pass  # cut off where the write failed
    return ids
