"""A walsender connection (``replication=database``) over psycopg 3's libpq layer.

psycopg's high-level API has no replication support, but `psycopg.pq.PGconn` speaks everything
needed: simple-query replication commands and CopyBoth. This module is the only place that
turns libpq results and server errors into pgcdc's error classes.
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo
from psycopg.pq.abc import PGconn, PGresult

from pgcdc.errors import (
    ConnectionFailed,
    ConnectionLost,
    InvalidConninfo,
    PermissionDenied,
    PublicationNotFound,
    ReplicationError,
    ServerConfigurationError,
    SlotExists,
    SlotInUse,
    SlotInvalidated,
    SlotNotFound,
    StreamEnded,
    UnsupportedOption,
    first_line,
)
from pgcdc.protocol import Lsn
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.quoting import identifier, literal

__all__ = [
    "DEFAULT_SESSION_SETTINGS",
    "CreatedSlot",
    "ReplicationConnection",
    "SystemIdentity",
    "connect_timeout",
    "connection_error",
    "describe_error",
    "error_class",
    "error_from_result",
    "parse_conninfo",
    "sql_error",
]

#: Pinned so that the text output of every value is the same whatever the server's defaults.
DEFAULT_SESSION_SETTINGS: dict[str, str] = {
    "client_encoding": "UTF8",
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}

_E = pq.ExecStatus
_POLL = pq.PollingStatus
#: How long ending a session may wait for the server to finish the stream.
END_COPY_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    systemid: str
    timeline: int
    xlogpos: Lsn
    dbname: str | None


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None
    output_plugin: str


def error_class(
    sqlstate: str, primary: str, default: type[ReplicationError] = ReplicationError
) -> type[ReplicationError]:
    """The pgcdc error class for a server error, chosen by SQLSTATE and primary message;
    `default` when neither says more."""
    lowered = primary.lower()
    if sqlstate == "42704" and lowered.startswith("publication"):
        return PublicationNotFound
    if sqlstate == "42704" and "replication slot" in lowered:
        return SlotNotFound
    if sqlstate == "42710" and "replication slot" in lowered:
        return SlotExists
    if sqlstate == "55006":
        return SlotInUse
    if "wal_level" in lowered:
        return ServerConfigurationError
    if sqlstate == "55000" and ("invalidated" in lowered or "can no longer" in lowered):
        return SlotInvalidated
    if sqlstate == "42501" or sqlstate.startswith("28"):
        return PermissionDenied
    if sqlstate in ("22023", "0A000"):
        return UnsupportedOption
    if sqlstate.startswith(("57P", "08")):
        return ConnectionLost
    return default


def describe_error(doing: str, primary: str, detail: str | None, hint: str | None) -> str:
    text = f"{doing}: {primary}"
    if detail:
        text += f" ({detail})"
    if hint:
        text += f" Hint: {hint}"
    return text


def error_from_result(result: PGresult, doing: str, lsn: object = None) -> ReplicationError:
    """The pgcdc error for a server ErrorResponse."""
    field = pq.DiagnosticField

    def get(which: pq.DiagnosticField) -> str:
        return (result.error_field(which) or b"").decode(errors="replace")

    sqlstate = get(field.SQLSTATE)
    primary = get(field.MESSAGE_PRIMARY) or result.get_error_message().strip() or "unknown error"
    text = describe_error(doing, primary, get(field.MESSAGE_DETAIL), get(field.MESSAGE_HINT))
    return error_class(sqlstate, primary)(text, sqlstate=sqlstate or None, lsn=lsn)


def sql_error(
    exc: psycopg.Error, doing: str, default: type[ReplicationError] = ReplicationError
) -> ReplicationError:
    """The pgcdc error for a failed statement on an ordinary (psycopg) connection."""
    diag = exc.diag
    primary = diag.message_primary or first_line(exc)
    sqlstate = exc.sqlstate or ""
    text = describe_error(doing, primary, diag.message_detail, diag.message_hint)
    return error_class(sqlstate, primary, default)(_one_line(text), sqlstate=sqlstate or None)


def parse_conninfo(conninfo: str) -> dict[str, Any]:
    """A libpq connection string or URI as its parameters; `InvalidConninfo` (one line, no
    password in it) when libpq cannot parse it."""
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidConninfo(f"invalid connection string: {_one_line(str(exc))}") from None


def connect_timeout(params: dict[str, Any]) -> float:
    """Seconds a connection attempt may take: ``connect_timeout`` (or PGCONNECT_TIMEOUT) as
    libpq reads it, psycopg's default when unset or 0 (a wait must be bounded)."""
    try:
        return float(timeout_from_conninfo(params))
    except psycopg.ProgrammingError as exc:
        raise InvalidConninfo(f"invalid connection string: {_one_line(str(exc))}") from None


def connection_error(message: str, conninfo: str) -> ConnectionFailed | PermissionDenied:
    """The error for a failed connection attempt, in one line, naming the address."""
    message = _one_line(message)
    params = parse_conninfo(conninfo)
    where = f"{params.get('host', 'local socket')}:{params.get('port', '5432')}"
    lowered = message.lower()
    if "replication" in lowered and ("permission" in lowered or "must be" in lowered):
        return PermissionDenied(f"cannot start a walsender at {where}: {message}")
    return ConnectionFailed(f"cannot connect to PostgreSQL at {where}: {message}")


#: What a reader read between two waits for the socket is a trickle below this
#: (`ReplicationConnection.gather_seconds`).
_TRICKLE_BYTES = 64 * 1024


class ReplicationConnection:
    """One walsender session. Blocking; `read_copy_data` waits with a timeout."""

    def __init__(self, pgconn: PGconn, conninfo: str) -> None:
        self.pgconn = pgconn
        self.conninfo = conninfo
        self.server_version: int = pgconn.server_version
        self._in_copy = False
        #: Seconds to let a trickle gather: when the reader had caught up and waited for the
        #: socket, and what it read since its last wait was a trickle (under
        #: `_TRICKLE_BYTES`), it sleeps this long before reading, so that one wake-up (one
        #: select, one read, one turn of the GIL) takes the messages of this time instead of
        #: one or two. Adds at most this much latency, never while the reader is behind or
        #: the data comes fast; 0 reads each message as it comes.
        self.gather_seconds = 0.0
        self._read_since_wait = 0

    @classmethod
    def connect(
        cls, conninfo: str = "", *, application_name: str = "pgcdc", timeout: float | None = None
    ) -> ReplicationConnection:
        """Connect with ``replication=database`` (conninfo: libpq string or URI; PG* env apply).

        The attempt waits interruptibly, at most `connect_timeout` seconds (or `timeout`, when
        that is shorter).
        """
        params = parse_conninfo(conninfo)
        params.setdefault("application_name", application_name)
        params["replication"] = "database"
        full = make_conninfo("", **params)
        timeout = min(connect_timeout(params), timeout if timeout is not None else math.inf)
        pgconn = pq.PGconn.connect_start(full.encode())
        try:
            in_time = _poll_until_connected(pgconn, time.monotonic() + timeout)
        except BaseException:  # Ctrl-C while waiting
            pgconn.finish()
            raise
        if pgconn.status != pq.ConnStatus.OK:
            message = _one_line(pgconn.get_error_message())
            if not in_time:
                message = f"{message} timeout expired after {timeout:.0f} s".strip()
            pgconn.finish()
            raise connection_error(message, conninfo)
        return cls(pgconn, full)

    @property
    def major_version(self) -> int:
        return self.server_version // 10000

    def close(self) -> None:
        self.pgconn.finish()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- simple commands -------------------------------------------------------------------

    def _exec(self, command: str, doing: str) -> PGresult:
        """Send a simple-protocol command and wait for its result, interruptibly (Ctrl-C
        arrives while waiting, not only once the server answered). The last result, or the
        first error; a COPY result ends the wait (the session is then in COPY mode)."""
        pgconn = self.pgconn
        try:
            pgconn.send_query(command.encode())
            outcome: PGresult | None = None
            while True:
                while pgconn.is_busy():
                    _wait_socket(pgconn, read=True, timeout=1.0)
                    pgconn.consume_input()
                result = pgconn.get_result()
                if result is None:
                    break
                if outcome is None or outcome.status != _E.FATAL_ERROR:
                    outcome = result
                if result.status in _COPY_STATES:
                    break
        except psycopg.OperationalError as exc:
            raise ConnectionLost(f"{doing}: connection lost: {first_line(exc)}") from None
        if outcome is None:
            message = _one_line(pgconn.get_error_message()) or "no result"
            raise ConnectionLost(f"{doing}: connection lost: {message}")
        return outcome

    def execute(self, command: str, doing: str | None = None) -> list[tuple[str | None, ...]]:
        """Run a simple-protocol command; rows as text tuples."""
        result = self._exec(command, doing or command)
        status = result.status
        if status == _E.FATAL_ERROR:
            if self.pgconn.status != pq.ConnStatus.OK:
                message = _one_line(self.pgconn.get_error_message())
                raise ConnectionLost(f"{doing or command}: connection lost: {message}")
            raise error_from_result(result, doing or command)
        if status not in (_E.COMMAND_OK, _E.TUPLES_OK):
            raise ReplicationError(
                f"{doing or command}: unexpected result status {_E(status).name}"
            )
        return [
            tuple(
                None if (v := result.get_value(r, c)) is None else v.decode()
                for c in range(result.nfields)
            )
            for r in range(result.ntuples)
        ]

    def identify_system(self) -> SystemIdentity:
        ((systemid, timeline, xlogpos, dbname),) = self.execute("IDENTIFY_SYSTEM")
        assert systemid is not None and timeline is not None and xlogpos is not None
        return SystemIdentity(systemid, int(timeline), Lsn.parse(xlogpos), dbname)

    def apply_settings(self, settings: dict[str, str]) -> None:
        """SET session GUCs; the walsender runs output functions with these (text values)."""
        for name, value in settings.items():
            self.execute(f"SET {name} = {literal(value)}", f"setting {name}")

    def create_slot(
        self,
        name: str,
        *,
        temporary: bool = False,
        two_phase: bool = False,
        failover: bool = False,
        snapshot: str = "nothing",
        plugin: str = "pgoutput",
    ) -> CreatedSlot:
        """CREATE_REPLICATION_SLOT, in the syntax this server understands.

        `snapshot` is ``export`` (the slot's snapshot stays importable while this connection
        runs no other command), ``use`` or ``nothing``.
        """
        major = self.major_version
        if two_phase and major < 15:
            raise UnsupportedOption(
                f"two-phase slots need PostgreSQL 15 or later, server is {major}"
            )
        if failover and major < 17:
            raise UnsupportedOption(
                f"failover slots need PostgreSQL 17 or later, server is {major}"
            )
        if failover and temporary:
            raise UnsupportedOption("a temporary slot cannot be a failover slot")
        head = f"CREATE_REPLICATION_SLOT {identifier(name)} {'TEMPORARY ' if temporary else ''}"
        head += f"LOGICAL {identifier(plugin)}"
        if major >= 15:
            opts = [f"SNAPSHOT '{snapshot}'"]
            if two_phase:
                opts.append("TWO_PHASE")
            if failover:
                opts.append("FAILOVER")
            command = f"{head} ({', '.join(opts)})"
        else:
            legacy = {"export": "EXPORT_SNAPSHOT", "use": "USE_SNAPSHOT"}
            command = f"{head} {legacy.get(snapshot, 'NOEXPORT_SNAPSHOT')}"
        ((slot_name, point, snapshot_name, output_plugin),) = self.execute(
            command, f"creating replication slot {name!r}"
        )
        assert slot_name is not None and point is not None
        return CreatedSlot(slot_name, Lsn.parse(point), snapshot_name, output_plugin or plugin)

    def alter_slot(self, name: str, *, failover: bool) -> None:
        """ALTER_REPLICATION_SLOT (PostgreSQL 17+): make the slot a failover slot or not."""
        if self.major_version < 17:
            raise UnsupportedOption(
                f"failover slots need PostgreSQL 17 or later, server is {self.major_version}"
            )
        value = "true" if failover else "false"
        command = f"ALTER_REPLICATION_SLOT {identifier(name)} (FAILOVER {value})"
        self.execute(command, f"altering replication slot {name!r}")

    def drop_slot(self, name: str, *, wait: bool = False) -> None:
        command = f"DROP_REPLICATION_SLOT {identifier(name)}{' WAIT' if wait else ''}"
        self.execute(command, f"dropping replication slot {name!r}")

    # -- CopyBoth --------------------------------------------------------------------------

    def start_replication(self, slot: str, start_lsn: Lsn, options: StreamOptions) -> None:
        """START_REPLICATION for negotiated `options`; on success the session is in CopyBoth."""
        command = (
            f"START_REPLICATION SLOT {identifier(slot)} LOGICAL {Lsn(start_lsn)} "
            f"({options.command_options()})"
        )
        result = self._exec(command, f"starting replication from slot {slot!r}")
        if result.status == _E.COPY_BOTH:
            self._in_copy = True
            return
        if result.status == _E.FATAL_ERROR:
            raise error_from_result(
                result, f"starting replication from slot {slot!r}", lsn=Lsn(start_lsn) or None
            )
        raise ReplicationError(
            f"START_REPLICATION: unexpected result status {_E(result.status).name}"
        )

    def read_copy_data(
        self, timeout: float, on_wait: Callable[[], float | None] | None = None
    ) -> bytes | None:
        """The next CopyData payload, or None when `timeout` seconds passed without one.
        `on_wait` is called whenever nothing is buffered and the socket must be waited for;
        it may ask to be called again within the seconds it returns.

        Raises StreamEnded (the server ended the stream with an error), ConnectionLost.
        """
        data = self.read_buffered()
        if data is not None:
            return data
        waited = self._wait_readable(timeout, on_wait)
        if waited is None:
            return None
        if waited:
            if self.gather_seconds and self._read_since_wait < _TRICKLE_BYTES:
                time.sleep(self.gather_seconds)
            self._read_since_wait = 0
        try:
            self.pgconn.consume_input()
        except Exception as exc:  # psycopg.OperationalError; libpq lost the socket
            raise ConnectionLost(f"replication connection lost: {first_line(exc)}") from None
        return self.read_buffered()

    def read_buffered(self) -> bytes | None:
        """The next CopyData payload if libpq has it whole already, else None: it neither
        waits nor reads the socket. Raises as `read_copy_data` when the stream ended."""
        nbytes, data = self.pgconn.get_copy_data(1)
        if nbytes > 0:
            self._read_since_wait += nbytes
            return bytes(data)
        if nbytes == 0:
            return None
        self._in_copy = False
        raise self._stream_end_error()

    def _wait_readable(
        self, timeout: float, on_wait: Callable[[], float | None] | None
    ) -> bool | None:
        """Wait until the socket is readable: False if it was at once (the reader is behind),
        True if it became so (the reader had caught up), None if `timeout` passed first."""
        socket = self.pgconn.socket
        deadline = time.monotonic() + timeout if on_wait is not None else 0.0
        due = None if on_wait is None else on_wait()
        if self._select(socket, 0.0):
            return False
        while True:
            limit = timeout
            if on_wait is not None:
                limit = max(0.0, deadline - time.monotonic())
                if due is not None:
                    limit = min(limit, due)
            if self._select(socket, limit):
                return True
            if on_wait is None or time.monotonic() >= deadline:
                return None
            due = on_wait()

    @staticmethod
    def _select(socket: int, limit: float) -> bool:
        try:
            ready, _, _ = select.select([socket], [], [], limit)
        except (OSError, ValueError) as exc:
            raise ConnectionLost(f"replication connection lost: {exc}") from None
        return bool(ready)

    def _stream_end_error(self) -> ReplicationError:
        """The reason the server ended CopyBoth (CopyDone, ErrorResponse, or EOF).

        An error libpq made up itself (no SQLSTATE: "server closed the connection
        unexpectedly") means the connection broke, e.g. a server shutdown or restart.
        """
        error: ReplicationError | None = None
        while (result := self.pgconn.get_result()) is not None:
            if result.status != _E.FATAL_ERROR or error is not None:
                continue
            if result.error_field(pq.DiagnosticField.SQLSTATE) is None:
                message = _one_line(result.get_error_message())
                error = ConnectionLost(f"replication connection lost: {message}")
            else:
                error = error_from_result(result, "replication stream ended")
                if type(error) is ReplicationError:
                    error = StreamEnded(str(error), sqlstate=error.sqlstate)
        if error is not None:
            return error
        if self.pgconn.status != pq.ConnStatus.OK:
            message = _one_line(self.pgconn.get_error_message()) or "server closed it"
            return ConnectionLost(f"replication connection lost: {message}")
        return StreamEnded("the server ended the replication stream (CopyDone)")

    def send_copy_data(self, data: bytes) -> None:
        try:
            self.pgconn.put_copy_data(data)
            self.pgconn.flush()
        except Exception as exc:  # psycopg.OperationalError
            raise ConnectionLost(f"replication connection lost: {first_line(exc)}") from None

    def end_copy(self) -> None:
        """Send CopyDone and drain until the server has finished the command."""
        if not self._in_copy:
            return
        self._in_copy = False
        pgconn = self.pgconn
        deadline = time.monotonic() + END_COPY_TIMEOUT
        try:
            pgconn.put_copy_end()
            pgconn.flush()
            # The server may still send CopyData before its own CopyDone; discard it.
            while True:
                nbytes, _ = pgconn.get_copy_data(1)
                if nbytes < 0:
                    break
                if nbytes == 0:
                    _wait_socket(pgconn, read=True, timeout=deadline - time.monotonic())
                    pgconn.consume_input()
            while True:
                while pgconn.is_busy():
                    _wait_socket(pgconn, read=True, timeout=deadline - time.monotonic())
                    pgconn.consume_input()
                if pgconn.get_result() is None:
                    break
        except (psycopg.OperationalError, TimeoutError) as exc:  # nothing left to end cleanly
            raise ConnectionLost(f"ending the replication stream: {first_line(exc)}") from None


_COPY_STATES = frozenset({_E.COPY_BOTH, _E.COPY_IN, _E.COPY_OUT})


def _wait_socket(pgconn: PGconn, *, read: bool, timeout: float) -> bool:
    """Wait up to `timeout` seconds for libpq's socket; False when the time ran out.

    A plain `select`, so Ctrl-C (SIGINT) interrupts it; TimeoutError when `timeout` is not
    positive, so that a caller looping towards a deadline stops there.
    """
    if timeout <= 0:
        raise TimeoutError("timeout expired")
    try:
        sock = pgconn.socket
        ready = select.select([sock] if read else [], [] if read else [sock], [], timeout)
    except (OSError, ValueError) as exc:
        raise psycopg.OperationalError(str(exc)) from None
    return bool(ready[0] or ready[1])


def _poll_until_connected(pgconn: PGconn, deadline: float) -> bool:
    """Drive a `connect_start` connection until OK or failed; False if `deadline` came first
    (the connection's status then says it is not OK)."""
    status = _POLL.WRITING
    while status not in (_POLL.OK, _POLL.FAILED) and pgconn.status != pq.ConnStatus.BAD:
        try:
            _wait_socket(pgconn, read=status == _POLL.READING, timeout=deadline - time.monotonic())
        except TimeoutError:
            return False
        except psycopg.OperationalError:
            return True  # no socket: libpq's message says why
        status = _POLL(pgconn.connect_poll())
    return True


def _one_line(text: str) -> str:
    """libpq's multi-line messages as one line."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())
