"""A walsender connection (``replication=database``) over psycopg 3's libpq layer.

psycopg's high-level API has no replication support, but `psycopg.pq.PGconn` speaks everything
needed: simple-query replication commands and CopyBoth. This module is the only place that
turns libpq results and server errors into pgcdc's error classes.
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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
)
from pgcdc.protocol import Lsn
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.quoting import identifier, literal

__all__ = [
    "DEFAULT_SESSION_SETTINGS",
    "CreatedSlot",
    "ReplicationConnection",
    "SystemIdentity",
    "connection_error",
    "parse_conninfo",
    "describe_error",
    "error_class",
    "error_from_result",
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


def error_class(sqlstate: str, primary: str) -> type[ReplicationError]:
    """The pgcdc error class for a server error, chosen by SQLSTATE and primary message."""
    lowered = primary.lower()
    if sqlstate == "42704" and lowered.startswith("publication"):
        return PublicationNotFound
    if sqlstate == "42704" and "replication slot" in lowered:
        return SlotNotFound
    if sqlstate == "42710":
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
    return ReplicationError


def describe_error(doing: str, primary: str, detail: str | None, hint: str | None) -> str:
    text = f"{doing}: {primary}"
    if detail:
        text += f" ({detail})"
    if hint:
        text += f" Hint: {hint}"
    return text


def error_from_result(result: pq.PGresult, doing: str, lsn: object = None) -> ReplicationError:
    """The pgcdc error for a server ErrorResponse."""
    field = pq.DiagnosticField

    def get(which: pq.DiagnosticField) -> str:
        return (result.error_field(which) or b"").decode(errors="replace")

    sqlstate = get(field.SQLSTATE)
    primary = get(field.MESSAGE_PRIMARY) or result.get_error_message().strip() or "unknown error"
    text = describe_error(doing, primary, get(field.MESSAGE_DETAIL), get(field.MESSAGE_HINT))
    return error_class(sqlstate, primary)(text, sqlstate=sqlstate or None, lsn=lsn)


def parse_conninfo(conninfo: str) -> dict[str, Any]:
    """A libpq connection string or URI as its parameters; `InvalidConninfo` (one line, no
    password in it) when libpq cannot parse it."""
    try:
        return conninfo_to_dict(conninfo)
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


class ReplicationConnection:
    """One walsender session. Blocking; `read_copy_data` waits with a timeout."""

    def __init__(self, pgconn: pq.PGconn, conninfo: str) -> None:
        self.pgconn = pgconn
        self.conninfo = conninfo
        self.server_version: int = pgconn.server_version
        self._in_copy = False

    @classmethod
    def connect(
        cls, conninfo: str = "", *, application_name: str = "pgcdc"
    ) -> ReplicationConnection:
        """Connect with ``replication=database`` (conninfo: libpq string or URI; PG* env apply)."""
        params = parse_conninfo(conninfo)
        params.setdefault("application_name", application_name)
        params["replication"] = "database"
        full = make_conninfo("", **params)
        pgconn = pq.PGconn.connect(full.encode())
        if pgconn.status != pq.ConnStatus.OK:
            message = _one_line(pgconn.get_error_message())
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

    def execute(self, command: str, doing: str | None = None) -> list[tuple[str | None, ...]]:
        """Run a simple-protocol command; rows as text tuples."""
        result = self.pgconn.exec_(command.encode())
        status = result.status
        if status == _E.FATAL_ERROR:
            if self.pgconn.status != pq.ConnStatus.OK:
                message = _one_line(self.pgconn.get_error_message())
                raise ConnectionLost(f"{doing or command}: connection lost: {message}")
            raise error_from_result(result, doing or command)
        if status not in (_E.COMMAND_OK, _E.TUPLES_OK):
            raise ReplicationError(f"{doing or command}: unexpected result status {status.name}")
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
        result = self.pgconn.exec_(command.encode())
        if result.status == _E.COPY_BOTH:
            self._in_copy = True
            return
        if result.status == _E.FATAL_ERROR:
            raise error_from_result(
                result, f"starting replication from slot {slot!r}", lsn=Lsn(start_lsn) or None
            )
        raise ReplicationError(f"START_REPLICATION: unexpected result status {result.status.name}")

    def read_copy_data(self, timeout: float) -> bytes | None:
        """The next CopyData payload, or None when `timeout` seconds passed without one.

        Raises StreamEnded (the server ended the stream with an error), ConnectionLost.
        """
        pgconn = self.pgconn
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes == 0:
            try:
                ready, _, _ = select.select([pgconn.socket], [], [], timeout)
            except (OSError, ValueError) as exc:
                raise ConnectionLost(f"replication connection lost: {exc}") from None
            if not ready:
                return None
            try:
                pgconn.consume_input()
            except Exception as exc:  # psycopg.OperationalError; libpq lost the socket
                raise ConnectionLost(f"replication connection lost: {_first_line(exc)}") from None
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes == 0:
                return None
        if nbytes > 0:
            return bytes(data)
        self._in_copy = False
        raise self._stream_end_error()

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
            raise ConnectionLost(f"replication connection lost: {_first_line(exc)}") from None

    def end_copy(self) -> None:
        """Send CopyDone and drain until the server has finished the command."""
        if not self._in_copy:
            return
        self._in_copy = False
        try:
            self.pgconn.put_copy_end()
            self.pgconn.flush()
            # The server may still send CopyData before its own CopyDone; discard it.
            while True:
                nbytes, _ = self.pgconn.get_copy_data(0)
                if nbytes < 0:
                    break
            while self.pgconn.get_result() is not None:
                pass
        except Exception as exc:  # psycopg.OperationalError: nothing left to end cleanly
            raise ConnectionLost(f"ending the replication stream: {_first_line(exc)}") from None


def _one_line(text: str) -> str:
    """libpq's multi-line messages as one line."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
