"""The exception hierarchy of pgcdc.

Every error pgcdc raises on purpose derives from `PgcdcError`, so a caller (and the CLI) can tell
a problem pgcdc diagnosed from a bug. Each class names one kind of failure; the message says what
happened, where (message type, byte offset, file position) and at which LSN when that is known.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CaptureError",
    "ColumnCountMismatch",
    "ConnectionFailed",
    "ConnectionLost",
    "InvalidConninfo",
    "InvalidMessage",
    "InvalidStartPosition",
    "MonitoringError",
    "OutputFileError",
    "PermissionDenied",
    "PgcdcError",
    "PipelineFailed",
    "PluginError",
    "PluginLoadError",
    "PluginOptionError",
    "ProtocolError",
    "PublicationError",
    "PublicationNotFound",
    "RecordError",
    "ReplicationError",
    "ApplyError",
    "SchemaChangeError",
    "ServerConfigurationError",
    "SlotExists",
    "SlotInUse",
    "SlotInvalidated",
    "SlotLost",
    "SlotNotFound",
    "SlotPluginMismatch",
    "SourceError",
    "SpillError",
    "SpoolError",
    "StorageError",
    "StreamEnded",
    "TargetError",
    "TruncatedMessage",
    "UnexpectedMessage",
    "UnknownMessageType",
    "UnknownRelation",
    "UnsupportedOption",
    "ValueDecodeError",
    "ValueOutOfRange",
    "first_line",
]

EXCERPT_BYTES = 16


def hex_excerpt(data: bytes | bytearray | memoryview, offset: int) -> str:
    """A short hex view of `data` around `offset`, with the offending byte bracketed."""
    data = bytes(data)
    start = max(0, offset - EXCERPT_BYTES // 2)
    end = min(len(data), start + EXCERPT_BYTES)
    parts = []
    for i in range(start, end):
        byte = f"{data[i]:02x}"
        parts.append(f"[{byte}]" if i == offset else byte)
    if offset >= len(data):
        parts.append("[end]")
    prefix = "… " if start > 0 else ""
    suffix = " …" if end < len(data) else ""
    return prefix + " ".join(parts) + suffix


def first_line(exc: BaseException) -> str:
    """An error's first line (its type's name when it says nothing): for one-line reports."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PgcdcError(Exception):
    """Base class of every error pgcdc raises deliberately."""


class ProtocolError(PgcdcError):
    """Bytes that are not a valid message of the negotiated pgoutput session.

    Carries the message type, the byte offset inside the message where decoding failed, the LSN
    of the XLogData frame when known, and a hex excerpt of the bytes around the offset.
    """

    def __init__(
        self,
        reason: str,
        *,
        data: bytes | bytearray | memoryview = b"",
        offset: int = 0,
        message_type: str | None = None,
        lsn: object | None = None,
    ) -> None:
        self.reason = reason
        self.offset = offset
        self.message_type = message_type
        self.lsn = lsn
        self.excerpt = hex_excerpt(data, offset) if data else ""
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.message_type is not None:
            where.append(f"{self.message_type} message")
        where.append(f"byte {self.offset}")
        if self.lsn:
            where.append(f"LSN {self.lsn}")
        text = f"{self.reason} ({', '.join(where)})"
        if self.excerpt:
            text += f": {self.excerpt}"
        return text


class TruncatedMessage(ProtocolError):
    """The message ended before a field it must contain."""


class InvalidMessage(ProtocolError):
    """A field holds a value the format does not allow (flags, kinds, lengths, names)."""


class UnknownMessageType(ProtocolError):
    """The first byte names no message this session can send."""


class UnexpectedMessage(ProtocolError):
    """A valid message that cannot occur in this session state (e.g. Stream Stop outside a stream,
    a streaming message when streaming was not negotiated)."""


class UnknownRelation(ProtocolError):
    """A change refers to a relation id no Relation message has described."""


class ColumnCountMismatch(ProtocolError):
    """A TupleData's column count differs from its Relation's."""


class RecordError(PgcdcError):
    """A framed record (`pgcdc.records`) that is truncated or damaged, at byte `offset` of
    its file. Capture, spill and spool readers report it with their file's name."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"record at byte {offset}: {reason}")


class CaptureError(PgcdcError):
    """A capture file that is not in pgcdc's capture format, or is corrupt or truncated."""


class ReplicationError(PgcdcError):
    """A failure talking to PostgreSQL. `sqlstate` is the server's error code when it sent one;
    `lsn` is the last position the client had reached, when known."""

    def __init__(self, message: str, *, sqlstate: str | None = None, lsn: object = None) -> None:
        self.sqlstate = sqlstate
        self.lsn = lsn
        if lsn:
            message = f"{message} (at LSN {lsn})"
        super().__init__(message)


class UnsupportedOption(ReplicationError):
    """An option this server version (or proto version) cannot accept; raised before sending."""


class ConnectionFailed(ReplicationError):
    """Could not connect or authenticate (wrong password, no REPLICATION privilege, host down)."""


class InvalidConninfo(ConnectionFailed):
    """The connection string or URI itself is malformed (no server was asked)."""


class ConnectionLost(ReplicationError):
    """An established connection broke (server restart or shutdown, network, timeout).

    Retryable: the stream resumes from the last confirmed LSN.
    """


class ServerConfigurationError(ReplicationError):
    """The server is not set up for logical replication (e.g. wal_level is not logical)."""


class PermissionDenied(ReplicationError):
    """The role lacks a privilege the operation needs."""


class SlotNotFound(ReplicationError):
    """The replication slot does not exist."""


class SlotInUse(ReplicationError):
    """The replication slot is active in another process."""


class SlotExists(ReplicationError):
    """A slot with that name already exists."""


class SlotInvalidated(ReplicationError):
    """The slot can no longer be used (its WAL was removed, or it timed out while idle)."""


class SlotPluginMismatch(ReplicationError):
    """The slot is not a logical slot of the pgoutput plugin (e.g. one made for test_decoding)."""


class InvalidStartPosition(ReplicationError):
    """A start position the server has not reached (starting there would skip changes)."""


class PublicationNotFound(ReplicationError):
    """A publication named in publication_names does not exist."""


class PublicationError(ReplicationError):
    """A publication cannot be created or changed as asked (it exists already, a table is
    missing or not in it, a bad row filter or option)."""


class StreamEnded(ReplicationError):
    """The server ended the replication stream with an error."""


class PluginError(PgcdcError):
    """An output plugin cannot be loaded or used as written."""


class PluginLoadError(PluginError):
    """The plugin cannot be imported, or breaks the callback rules (e.g. a half streaming group)."""


class PluginOptionError(PluginError):
    """An option given to a plugin is unknown or has an invalid value (raised from startup)."""


class OutputFileError(PgcdcError):
    """A file pgcdc was asked to write (``-f``) cannot be created or written."""


class MonitoringError(PgcdcError):
    """An operations figure cannot be had: a batch log that cannot be read or written, a
    plot or a metrics endpoint that cannot be made, a library for it that is not installed."""


class SpillError(PgcdcError):
    """A spilled transaction could not be written to or read back from its spill file."""


class SpoolError(PgcdcError):
    """The Spark source's spool of committed transactions is unreadable or out of order."""


class StorageError(PgcdcError):
    """A file pgcdc keeps (a pipeline's state) cannot be read or written where it lives: a
    local directory, or an object store that refuses (credentials, a missing bucket)."""


class PipelineFailed(PgcdcError):
    """The pipeline stopped with an error (the first line of it, cleaned up)."""


class SlotLost(PgcdcError):
    """The pipeline's slot no longer exists though its targets hold data."""


class SourceError(PgcdcError):
    """The Spark source cannot run: a missing or wrong option, or its replication session
    failed (the cause is in the message)."""


class ValueDecodeError(PgcdcError):
    """A column value's bytes are not a valid text or binary form of its type."""


class ValueOutOfRange(PgcdcError):
    """A column value its Arrow/Spark type cannot hold exactly (an infinite or out-of-range
    date or timestamp, a numeric wider than its decimal, a multi-dimensional array, ...), under
    the out-of-range policy "error". Names the table, the column, the value and the LSN."""

    def __init__(
        self,
        reason: str,
        *,
        table: str,
        column: str,
        value: str,
        lsn: object | None = None,
        row: int | None = None,
        where: str | None = None,
    ) -> None:
        self.reason = reason
        self.table = table
        self.column = column
        self.value = value
        self.lsn = lsn
        #: The value's place among the values typed together, when typed a column at a time
        #: (the caller knows which change or copied row that is: `located`).
        self.row = row
        if where is None and lsn is not None:
            where = f"at LSN {lsn}"
        self.where = where
        place = f" ({where})" if where else ""
        super().__init__(f"{table}.{column}: value {value} {reason}{place}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _out_of_range,
            (self.reason, self.table, self.column, self.value, self.lsn, self.row, self.where),
        )

    def located(self, *, lsn: object | None = None, where: str | None = None) -> ValueOutOfRange:
        """The same error, saying where the value came from (a change's LSN, a copy)."""
        return ValueOutOfRange(
            self.reason,
            table=self.table,
            column=self.column,
            value=self.value,
            lsn=lsn,
            row=self.row,
            where=where,
        )


def _out_of_range(*args: object) -> ValueOutOfRange:
    reason, table, column, value, lsn, row, where = args
    return ValueOutOfRange(
        str(reason),
        table=str(table),
        column=str(column),
        value=str(value),
        lsn=lsn,
        row=row,  # type: ignore[arg-type]
        where=where,  # type: ignore[arg-type]
    )


class TargetError(PgcdcError):
    """A change set cannot be applied to a target table (wrong table or mode, a type the
    table format cannot hold, a change the table's key cannot identify)."""


class ApplyError(TargetError):
    """A table's targets could not take a batch of its changes: names the table and the
    changes (commit LSNs, the first key); the slot was not moved past them."""


class SchemaChangeError(TargetError):
    """A column's type changed in a way the target cannot follow (not the same type, not a
    lossless widening, and its values cannot be read again by key: a key column, or a table
    without a key). Names the table, the column, both types and the LSN of the change that
    carried the new type; nothing of its batch was written."""

    def __init__(
        self, *, table: str, column: str, old_type: str, new_type: str, lsn: object | None = None
    ) -> None:
        self.table = table
        self.column = column
        self.old_type = old_type
        self.new_type = new_type
        self.lsn = lsn
        super().__init__(
            f"{table}.{column}: type changed from {old_type} to {new_type}, which the target "
            "can neither widen to nor read again by key (a key column, or a table without a "
            f"key) (at LSN {lsn if lsn is not None else '?'}); nothing was written; recopy "
            "the table"
        )
