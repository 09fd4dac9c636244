"""Shared helpers for the replication integration tests: polling, subprocesses, the CLI, and a
collector that turns a pgoutput message stream back into committed transactions."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from pgcdc.embedded import Database
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Lsn,
    Message,
    PgoutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Update,
)
from pgcdc.replication import ReplicationClient, StreamOptions
from pgcdc.replication.acknowledgement import end_lsn_of

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
PGCDC = str(Path(sys.executable).with_name("pgcdc"))
if not os.access(PGCDC, os.X_OK):  # not a venv layout: use whatever is on PATH
    PGCDC = shutil.which("pgcdc") or PGCDC

T = TypeVar("T")


def unique(prefix: str) -> str:
    """A slot/role/publication name no other test uses (slots and roles are cluster-wide)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def wait_for(
    predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- server state ------------------------------------------------------------------------------


def slot_row(db: Database, slot: str) -> dict[str, Any] | None:
    rows = db.execute(
        """SELECT active, active_pid, restart_lsn::text, confirmed_flush_lsn::text, two_phase
           FROM pg_replication_slots WHERE slot_name = %s""",
        (slot,),
    )
    if not rows:
        return None
    active, pid, restart, confirmed, two_phase = rows[0]
    return {
        "active": active,
        "active_pid": pid,
        "restart_lsn": Lsn.parse(restart) if restart else None,
        "confirmed_flush_lsn": Lsn.parse(confirmed) if confirmed else None,
        "two_phase": two_phase,
    }


def confirmed_flush(db: Database, slot: str) -> Lsn:
    row = slot_row(db, slot)
    assert row is not None, f"slot {slot} vanished"
    return row["confirmed_flush_lsn"]


def current_wal_lsn(db: Database) -> Lsn:
    return Lsn.parse(db.execute("SELECT pg_current_wal_lsn()::text")[0][0])


def server_version_num(db: Database) -> int:
    return int(db.execute("SHOW server_version_num")[0][0])


def wait_active(db: Database, slot: str, timeout: float = 20.0) -> int:
    """Wait until a walsender holds `slot`; its pid."""
    return wait_for(
        lambda: (row := slot_row(db, slot)) and row["active"] and row["active_pid"],
        timeout=timeout,
        what=f"slot {slot} to become active",
    )


# -- subprocesses ------------------------------------------------------------------------------


class Proc:
    """A child process whose output goes to files (no pipe can fill up and block it)."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pgcdc-test-proc-"))
        self.stdout_path = self.dir / "stdout"
        self.stderr_path = self.dir / "stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                list(args), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.popen.args[:3]} still running after {timeout:.0f}s\n"
                f"--- stderr ---\n{self.stderr[-3000:]}"
            ) from None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(30)

    def close(self) -> None:
        if self.popen.poll() is None:
            self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def spawn(args: Sequence[str], *, env: dict[str, str] | None = None) -> Iterator[Proc]:
    proc = Proc(args, env=env)
    try:
        yield proc
    finally:
        proc.close()


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `pgcdc args...` to completion."""
    try:
        return subprocess.run(
            [PGCDC, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"pgcdc {' '.join(args[:3])} did not finish in {timeout}s") from exc


def assert_one_error_line(
    result: subprocess.CompletedProcess[str], *needles: str, status: int = 1
) -> str:
    """Exit `status` (1: a failure, 2: a usage error) and exactly one stderr line
    `pgcdc: error: ...` containing `needles`."""
    report = f"exit {result.returncode}\n--- stderr ---\n{result.stderr}"
    assert "Traceback" not in result.stderr, report
    assert result.returncode == status, report
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line; {report}"
    (line,) = lines
    assert line.startswith("pgcdc: error: "), report
    for needle in needles:
        assert needle in line, f"{needle!r} not in the error line; {report}"
    return line


# -- turning a message stream back into transactions -------------------------------------------

Value = str | bytes | None
Row = tuple[Value, ...]


def row_values(data: TupleData) -> Row:
    """Text values as str, binary values as the raw bytes, NULL as None."""
    out: list[Value] = []
    for i in range(len(data)):
        kind = data.kind(i)
        value = data.values[i]
        if kind == "n":
            out.append(None)
        elif kind == "t":
            assert value is not None
            out.append(value.decode())
        elif kind == "b":
            assert value is not None
            out.append(bytes(value))
        else:
            raise AssertionError(f"unexpected TupleData kind {kind!r}")
    return tuple(out)


class Collector:
    """Feeds on (frame, message) pairs; keeps committed transactions in commit order.

    `items` holds ``("txn", changes)`` for every committed transaction (plain, streamed, or
    two-phase at COMMIT PREPARED) and ``("msg", change)`` for non-transactional messages. A
    change is ``("I", rel, new)``, ``("U", rel, old_kind, old, new)``, ``("D", rel, old_kind,
    old)``, ``("T", rels)`` or ``("M", transactional, prefix, content)``.
    """

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []
        self.relations: dict[int, Relation] = {}
        self.seen: Counter[str] = Counter()
        self.last_end: Lsn | None = None
        self._open: list[tuple[Any, ...]] | None = None
        self._stream_xid: int | None = None
        self._streams: dict[int, list[tuple[Any, ...]]] = {}
        self._prepared: dict[str, list[tuple[Any, ...]]] = {}

    @property
    def transactions(self) -> list[tuple[tuple[Any, ...], ...]]:
        return [item[1] for item in self.items if item[0] == "txn"]

    def _rel(self, relid: int) -> str:
        return self.relations[relid].relname

    def _add(self, change: tuple[Any, ...]) -> None:
        if self._stream_xid is not None:
            self._streams.setdefault(self._stream_xid, []).append(change)
        elif self._open is not None:
            self._open.append(change)
        else:
            raise AssertionError(f"change outside any transaction: {change}")

    def feed(self, message: PgoutputMessage) -> Lsn | None:
        """Take one message; the end LSN to confirm when it closed something, else None."""
        self.seen[type(message).__name__] += 1
        match message:
            case Relation():
                self.relations[message.relid] = message
            case Begin() | BeginPrepare():
                assert self._open is None, "Begin inside an open transaction"
                self._open = []
            case Commit():
                assert self._open is not None, "Commit without Begin"
                self.items.append(("txn", tuple(self._open)))
                self._open = None
            case Prepare():
                assert self._open is not None, "Prepare without Begin Prepare"
                self._prepared[message.gid] = self._open
                self._open = None
            case CommitPrepared():
                self.items.append(("txn", tuple(self._prepared.pop(message.gid))))
            case RollbackPrepared():
                self._prepared.pop(message.gid, None)
            case StreamStart():
                self._stream_xid = message.xid
            case StreamStop():
                self._stream_xid = None
            case StreamCommit():
                self.items.append(("txn", tuple(self._streams.pop(message.xid, []))))
            case StreamPrepare():
                self._prepared[message.gid] = self._streams.pop(message.xid, [])
            case StreamAbort():
                if message.subxid == message.xid:
                    self._streams.pop(message.xid, None)
            case Insert():
                self._add(("I", self._rel(message.relid), row_values(message.new)))
            case Update():
                old = None if message.old is None else row_values(message.old)
                new = row_values(message.new)
                self._add(("U", self._rel(message.relid), message.old_kind, old, new))
            case Delete():
                old = row_values(message.old)
                self._add(("D", self._rel(message.relid), message.old_kind, old))
            case Truncate():
                self._add(("T", tuple(self._rel(r) for r in message.relids)))
            case Message():
                change = ("M", message.transactional, message.prefix, bytes(message.content))
                if message.transactional:
                    self._add(change)
                else:
                    self.items.append(("msg", change))
        end = end_lsn_of(message)
        if end is not None:
            self.last_end = end
        return end


class TailThread(threading.Thread):
    """A ReplicationClient in a thread that collects everything and confirms every end LSN
    (it does not reconnect unless given `reconnect=True`).

    `finish(wake)` asks it to stop after the next transaction and runs `wake` (which must
    commit a published change), because an idle client only checks for `stop` when a message
    arrives.
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        publication: str,
        *,
        status_interval: float = 0.5,
        **client_options: Any,
    ) -> None:
        super().__init__(name=f"tail-{slot}", daemon=True)
        client_options.setdefault("reconnect", False)
        self.client = ReplicationClient(
            dsn,
            slot,
            StreamOptions((publication,)),
            status_interval=status_interval,
            **client_options,
        )
        self.collector = Collector()
        self.error: BaseException | None = None
        self._finishing = threading.Event()

    def run(self) -> None:
        try:
            with self.client:
                for _frame, message in self.client:
                    end = self.collector.feed(message)
                    if end is not None:
                        self.client.confirm(end)
                        if self._finishing.is_set():
                            return
        except BaseException as exc:
            self.error = exc

    @property
    def backend_pid(self) -> int | None:
        stream = self.client.stream
        return None if stream is None else stream.conn.pgconn.backend_pid

    def finish(self, wake: Callable[[], object], timeout: float = 15.0) -> None:
        self._finishing.set()
        if self.is_alive():
            wake()
        self.join(timeout)
        assert not self.is_alive(), "the tailing client did not stop"
        if self.error is not None:
            raise self.error


# -- a TCP proxy that can cut, hang up or refuse connections ------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:`port` to a server, so that a test can break the network in between:
    `cut_after(n)` closes the next connection once `n` bytes came from the server,
    `blackhole()` closes every connection and then accepts new ones but never answers (a
    server that hangs), `refuse()` stops listening (a server that is down), `restore()`
    forwards again."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = "forward"
        self.cut_at: int | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    @property
    def dsn_params(self) -> str:
        return f"host=127.0.0.1 port={self.port}"

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by refuse() or close()
            with self._lock:
                self._sockets.append(client)
                if self.mode == "blackhole":
                    continue  # accepted, never answered
                upstream = socket.create_connection(self.target)
                self._sockets.append(upstream)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        sent = 0
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                sent += len(data)
                if from_server and self.cut_at is not None and sent >= self.cut_at:
                    self.cut_at = None
                    break
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut_after(self, nbytes: int) -> None:
        self.cut_at = nbytes

    def _close_all(self) -> None:
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def blackhole(self) -> None:
        self.mode = "blackhole"
        self._close_all()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def refuse(self) -> None:
        self.mode = "refuse"
        self._stop_listening()
        self._close_all()

    def restore(self) -> None:
        self._close_all()
        self.mode = "forward"
        if self._listener is None:
            self._listen()

    def close(self) -> None:
        self._stop_listening()
        self._close_all()


@contextlib.contextmanager
def commits_held_back(db: Database, sql: str) -> Iterator[None]:
    """Run `sql` in a thread, its commit held back after its commit record is flushed (a
    synchronous standby that never comes: the walsender sends the transaction, other
    sessions do not see it yet) for as long as the block runs."""

    def commit() -> None:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(sql)

    committing = threading.Thread(target=commit)
    try:
        db.execute("ALTER SYSTEM SET synchronous_standby_names = 'pgcdc_nobody'")
        db.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        committing.start()
        wait_for(
            lambda: db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )[0][0],
            timeout=30,
            what="the commit to wait for the standby",
        )
        yield
    finally:
        db.execute("ALTER SYSTEM RESET synchronous_standby_names")
        db.execute("SELECT pg_reload_conf()")
        committing.join(30)
