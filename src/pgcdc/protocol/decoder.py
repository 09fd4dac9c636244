"""The stateful, sans-I/O pgoutput decoder.

The bytes of a pgoutput message do not describe themselves completely: their layout depends on
the negotiated protocol version, on the streaming mode (Stream Abort carries an abort LSN and
timestamp only with ``streaming 'parallel'``), and on whether a Stream Start ... Stream Stop
block is open (R, Y, I, U, D, T and M then carry an xid prefix). Tuples are checked against the
Relation that described them. `Decoder` carries exactly that session state.

Decoding is strict: a message either decodes completely, with no byte left over, or raises a
`pgcdc.errors.ProtocolError` subclass naming the message type, the byte offset, the LSN when
the caller passed it, and a hex excerpt. State changes only after a message decoded cleanly.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import StrEnum

from pgcdc.errors import (
    ColumnCountMismatch,
    InvalidMessage,
    ProtocolError,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
    UnknownRelation,
)
from pgcdc.protocol.frames import XLOG_HEADER_SIZE
from pgcdc.protocol.lsn import Lsn
from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
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
    Type,
    UndecodedChange,
    Update,
    fast_constructor,
)
from pgcdc.protocol.speedups import SPEEDUPS

__all__ = ["MAX_PROTO_VERSION", "Decoder", "StreamingMode"]

MAX_PROTO_VERSION = 4


class StreamingMode(StrEnum):
    """The session's ``streaming`` option (PG14+: boolean; PG16+: off, on or parallel)."""

    OFF = "off"
    ON = "on"
    PARALLEL = "parallel"


_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u16 = struct.Struct(">H").unpack_from
_BEGIN = struct.Struct(">QqI")  # final_lsn, commit_ts, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, commit_ts
_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_ts
_STREAM_ABORT = struct.Struct(">II")
_STREAM_ABORT_PARALLEL = struct.Struct(">IIQq")
_BEGIN_PREPARE = struct.Struct(">QQqI")  # prepare_lsn, end_lsn, prepare_ts, xid
_PREPARE = struct.Struct(">BQQqI")  # flags, lsn, end_lsn, ts, xid (P, K, p)
_ROLLBACK_PREPARED = struct.Struct(">BQQqqI")
_MESSAGE_HEAD = struct.Struct(">BQ")  # flags, lsn

_ROW_CODES = frozenset(b"IUD")


def _row_frame(data: bytes, relations: dict[int, Relation]) -> bool:
    """`Decoder.row_frame` in Python (the C module's ``row_frame``)."""
    return (
        len(data) >= XLOG_HEADER_SIZE + 6  # (as `_undecoded`: the relid and a byte after)
        and data[0] == 0x77  # w
        and data[XLOG_HEADER_SIZE] in _ROW_CODES
        and _u32(data, XLOG_HEADER_SIZE + 1)[0] in relations
    )


_make_tuple = fast_constructor(TupleData)
_make_insert = fast_constructor(Insert)
_make_update = fast_constructor(Update)
_make_delete = fast_constructor(Delete)

_NAMES = {
    "B": "Begin",
    "C": "Commit",
    "O": "Origin",
    "R": "Relation",
    "Y": "Type",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "M": "Message",
    "S": "Stream Start",
    "E": "Stream Stop",
    "c": "Stream Commit",
    "A": "Stream Abort",
    "b": "Begin Prepare",
    "P": "Prepare",
    "K": "Commit Prepared",
    "r": "Rollback Prepared",
    "p": "Stream Prepare",
}


class _Fail(Exception):
    """Raised inside the decoder; `Decoder.decode` turns it into a public error with context."""

    def __init__(self, cls: type[ProtocolError], reason: str, offset: int) -> None:
        self.cls, self.reason, self.offset = cls, reason, offset


def _need(buf: bytes, pos: int, size: int, what: str) -> None:
    if pos + size > len(buf):
        raise _Fail(
            TruncatedMessage,
            f"{what} needs {size} bytes at byte {pos}, message has {len(buf)}",
            len(buf),
        )


def _end(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        raise _Fail(InvalidMessage, f"{len(buf) - pos} trailing bytes", pos)


def _string(buf: bytes, pos: int, what: str) -> tuple[str, int]:
    end = buf.find(0, pos)
    if end < 0:
        raise _Fail(TruncatedMessage, f"{what}: string has no terminating NUL", len(buf))
    try:
        return buf[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise _Fail(InvalidMessage, f"{what} is not valid UTF-8", pos + exc.start) from None


def _flag_byte(value: int, allowed: int, what: str, pos: int) -> None:
    if value & ~allowed:
        raise _Fail(InvalidMessage, f"invalid {what} 0x{value:02x}", pos)


def _read_tuple(buf: bytes, pos: int, relation: Relation) -> tuple[TupleData, int]:
    """Read the TupleData at `pos` for `relation`; the hot loop of the whole decoder."""
    (ncols,) = _u16(buf, pos)
    if ncols != len(relation.columns):
        raise _Fail(
            ColumnCountMismatch,
            f"TupleData has {ncols} columns but relation {relation.schema}.{relation.relname} "
            f"(id {relation.relid}) has {len(relation.columns)}",
            pos,
        )
    pos += 2
    values: list[bytes | None] = [None] * ncols
    kinds = bytearray(ncols)
    for i in range(ncols):
        kind = kinds[i] = buf[pos]
        if kind == 0x74 or kind == 0x62:  # 't', 'b'
            (size,) = _u32(buf, pos + 1)
            pos += 5
            values[i] = buf[pos : pos + size]
            pos += size
        elif kind == 0x6E or kind == 0x75:  # 'n', 'u': value stays None
            pos += 1
        else:
            raise _Fail(
                InvalidMessage,
                f"invalid column kind {chr(kind)!r} (0x{kind:02x}) for column {i}; "
                "expected 'n', 'u', 't' or 'b'",
                pos,
            )
    if pos > len(buf):
        raise _Fail(
            TruncatedMessage,
            f"a column value runs {pos - len(buf)} bytes past the end of the message",
            len(buf),
        )
    return _make_tuple(bytes(kinds), tuple(values)), pos


class Decoder:
    """Decodes the pgoutput messages of one replication session.

    `proto_version` and `streaming` are what the session negotiated in START_REPLICATION.
    `strict` (the default) rejects non-zero reserved flag bytes, unknown replica identity and
    column flags; `strict=False` keeps them as sent. `speedups=False` decodes in pure Python
    even when the C fast path is built. `undecoded_rows=True` leaves the TupleData of Insert,
    Update and Delete undecoded (`UndecodedChange`: only the relation is checked), for a
    consumer that decodes them later, in bulk.
    """

    def __init__(
        self,
        proto_version: int = 1,
        streaming: StreamingMode | str | bool = StreamingMode.OFF,
        *,
        strict: bool = True,
        speedups: bool = True,
        undecoded_rows: bool = False,
    ) -> None:
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise ValueError(f"proto_version must be 1..{MAX_PROTO_VERSION}, got {proto_version}")
        if isinstance(streaming, bool):
            streaming = StreamingMode.ON if streaming else StreamingMode.OFF
        self.streaming = StreamingMode(streaming)
        if self.streaming is StreamingMode.ON and proto_version < 2:
            raise ValueError("streaming needs proto_version 2 or higher")
        if self.streaming is StreamingMode.PARALLEL and proto_version < 4:
            raise ValueError("streaming 'parallel' needs proto_version 4 or higher")
        self.proto_version = proto_version
        self.strict = strict
        # The C fast path for Insert/Update/Delete; it answers None for anything it does not
        # handle, and the Python path below then decodes it or raises the precise error.
        self._decode_change = SPEEDUPS.decode_change if speedups and SPEEDUPS else None
        if undecoded_rows:  # the C path peeks at the relation only; the rest stays bytes
            self._decode_change = SPEEDUPS.peek_change if speedups and SPEEDUPS else None
        self.undecoded_rows = undecoded_rows
        self._row_frame = SPEEDUPS.row_frame if speedups and SPEEDUPS else _row_frame
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        #: xid of the open Stream Start ... Stream Stop block, None outside one.
        self.stream_xid: int | None = None
        self._abort = (
            _STREAM_ABORT_PARALLEL if self.streaming is StreamingMode.PARALLEL else _STREAM_ABORT
        )
        self._dispatch: dict[int, Callable[[bytes], PgoutputMessage]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
        }
        if self.streaming is not StreamingMode.OFF:
            self._dispatch |= {
                ord("S"): self._stream_start,
                ord("E"): self._stream_stop,
                ord("c"): self._stream_commit,
                ord("A"): self._stream_abort,
            }
        if proto_version >= 3:
            self._dispatch |= {
                ord("b"): self._begin_prepare,
                ord("P"): self._prepare,
                ord("K"): self._commit_prepared,
                ord("r"): self._rollback_prepared,
            }
            if self.streaming is not StreamingMode.OFF:
                self._dispatch[ord("p")] = self._stream_prepare

    @property
    def in_stream(self) -> bool:
        return self.stream_xid is not None

    def row_frame(self, data: bytes) -> bool:
        """Whether the CopyData `data` is an XLogData frame whose message `undecoded_rows`
        takes as it is: an Insert, Update or Delete of a known relation, outside a stream
        block (a frame of `UndecodedChanges`; it changes no state here)."""
        return (
            self.undecoded_rows
            and self.stream_xid is None
            and self._row_frame(data, self.relations)
        )

    def decode(self, payload: bytes, lsn: int | None = None) -> PgoutputMessage | None:
        """Decode one pgoutput message (an XLogData payload); None for an empty payload.

        `lsn` (the XLogData's data_start) is used only to say where an error happened.
        """
        if not payload:
            return None
        if self._decode_change is not None:
            message = self._decode_change(payload, self.stream_xid is not None, self.relations)
            if message is not None:
                return message
        if self.undecoded_rows and payload[0] in _ROW_CODES:
            return self._undecoded(payload, lsn)
        handler = self._dispatch.get(payload[0])
        if handler is None:
            raise self._unknown(payload, lsn)
        try:
            return handler(payload)
        except _Fail as fail:
            raise fail.cls(
                fail.reason,
                data=payload,
                offset=fail.offset,
                message_type=_message_name(payload),
                lsn=_lsn(lsn),
            ) from None
        except (struct.error, IndexError):
            raise TruncatedMessage(
                f"message ends after {len(payload)} bytes, in the middle of a field",
                data=payload,
                offset=len(payload),
                message_type=_message_name(payload),
                lsn=_lsn(lsn),
            ) from None

    def _undecoded(self, payload: bytes, lsn: int | None) -> UndecodedChange:
        """An Insert, Update or Delete with its relation checked, its tuples left as bytes."""
        start = 1 if self.stream_xid is None else 5
        if len(payload) < start + 5:
            raise TruncatedMessage(
                f"message ends after {len(payload)} bytes, before its relation id",
                data=payload,
                offset=len(payload),
                message_type=_message_name(payload),
                lsn=_lsn(lsn),
            )
        (relid,) = _u32(payload, start)
        if relid not in self.relations:
            try:
                self._unknown_relation(relid, start)
            except _Fail as fail:
                raise fail.cls(
                    fail.reason,
                    data=payload,
                    offset=fail.offset,
                    message_type=_message_name(payload),
                    lsn=_lsn(lsn),
                ) from None
        if start == 1:
            return UndecodedChange(payload[0], relid, payload)
        return UndecodedChange(payload[0], relid, payload[:1] + payload[5:], _u32(payload, 1)[0])

    def _unknown(self, payload: bytes, lsn: int | None) -> ProtocolError:
        code = chr(payload[0])
        name = _NAMES.get(code)
        if name is None:
            return UnknownMessageType(
                f"unknown pgoutput message type {code!r} (0x{payload[0]:02x})",
                data=payload,
                offset=0,
                lsn=_lsn(lsn),
            )
        if code in "SEcAp" and self.streaming is StreamingMode.OFF:
            why = "streaming was not negotiated"
        else:
            why = f"it needs a higher proto_version than {self.proto_version}"
        return UnexpectedMessage(
            f"{name} message received but {why}",
            data=payload,
            offset=0,
            message_type=name,
            lsn=_lsn(lsn),
        )

    # -- helpers ---------------------------------------------------------------------------

    def _xid_prefix(self, buf: bytes) -> tuple[int | None, int]:
        if self.stream_xid is None:
            return None, 1
        _need(buf, 1, 4, "xid")
        return _u32(buf, 1)[0], 5

    def _outside_stream(self, buf: bytes) -> None:
        if self.stream_xid is not None:
            raise _Fail(
                UnexpectedMessage,
                f"{_message_name(buf)} inside the stream block of xid {self.stream_xid}",
                0,
            )

    def _fixed(self, buf: bytes, layout: struct.Struct) -> tuple:
        _need(buf, 1, layout.size, "fixed fields")
        _end(buf, 1 + layout.size)
        return layout.unpack_from(buf, 1)

    def _reserved_flags(self, flags: int, pos: int) -> None:
        if flags and self.strict:
            raise _Fail(InvalidMessage, f"reserved flags byte must be 0, got 0x{flags:02x}", pos)

    def _unknown_relation(self, relid: int, pos: int) -> Relation:
        """The error for a change to a relation id no Relation message described."""
        raise _Fail(
            UnknownRelation, f"relation id {relid} was never described by a Relation message", pos
        )

    # -- transaction control ---------------------------------------------------------------

    def _begin(self, buf: bytes) -> Begin:
        self._outside_stream(buf)
        final_lsn, ts, xid = self._fixed(buf, _BEGIN)
        return Begin(Lsn(final_lsn), ts, xid)

    def _commit(self, buf: bytes) -> Commit:
        self._outside_stream(buf)
        flags, commit_lsn, end_lsn, ts = self._fixed(buf, _COMMIT)
        self._reserved_flags(flags, 1)
        return Commit(Lsn(commit_lsn), Lsn(end_lsn), ts, flags)

    def _origin(self, buf: bytes) -> Origin:
        _need(buf, 1, 8, "origin_lsn")
        name, pos = _string(buf, 9, "origin name")
        _end(buf, pos)
        return Origin(Lsn(int.from_bytes(buf[1:9])), name)

    # -- schema ----------------------------------------------------------------------------

    def _relation(self, buf: bytes) -> Relation:
        xid, pos = self._xid_prefix(buf)
        _need(buf, pos, 4, "relid")
        (relid,) = _u32(buf, pos)
        namespace, pos = _string(buf, pos + 4, "namespace")
        relname, pos = _string(buf, pos, "relation name")
        _need(buf, pos, 3, "replica identity and column count")
        identity = chr(buf[pos])
        if self.strict and identity not in "dnfi":
            raise _Fail(InvalidMessage, f"invalid replica identity {identity!r}", pos)
        (natts,) = _u16(buf, pos + 1)
        pos += 3
        columns = []
        for _ in range(natts):
            _need(buf, pos, 1, "column flags")
            flags = buf[pos]
            if self.strict:
                _flag_byte(flags, 1, "column flags", pos)
            name, pos = _string(buf, pos + 1, "column name")
            _need(buf, pos, 8, "column type oid and typmod")
            columns.append(Column(flags, name, _u32(buf, pos)[0], _i32(buf, pos + 4)[0]))
            pos += 8
        _end(buf, pos)
        relation = Relation(relid, namespace, relname, identity, tuple(columns), xid)
        self.relations[relid] = relation
        return relation

    def _type(self, buf: bytes) -> Type:
        xid, pos = self._xid_prefix(buf)
        _need(buf, pos, 4, "type oid")
        (oid,) = _u32(buf, pos)
        namespace, pos = _string(buf, pos + 4, "type namespace")
        name, pos = _string(buf, pos, "type name")
        _end(buf, pos)
        type_ = Type(oid, namespace, name, xid)
        self.types[oid] = type_
        return type_

    # -- DML: the hot path -----------------------------------------------------------------

    def _insert(self, buf: bytes) -> Insert:
        if self.stream_xid is None:
            xid, pos = None, 1
        else:
            (xid,), pos = _u32(buf, 1), 5
        (relid,) = _u32(buf, pos)
        if buf[pos + 4] != 0x4E:  # 'N'
            raise _Fail(InvalidMessage, "expected 'N' before the new tuple", pos + 4)
        relation = self.relations.get(relid) or self._unknown_relation(relid, pos)
        new, pos = _read_tuple(buf, pos + 5, relation)
        if pos != len(buf):
            _end(buf, pos)
        return _make_insert(relid, new, xid)

    def _update(self, buf: bytes) -> Update:
        if self.stream_xid is None:
            xid, pos = None, 1
        else:
            (xid,), pos = _u32(buf, 1), 5
        (relid,) = _u32(buf, pos)
        relation = self.relations.get(relid) or self._unknown_relation(relid, pos)
        pos += 4
        marker = buf[pos]
        old_kind = old = None
        if marker == 0x4B or marker == 0x4F:  # 'K', 'O'
            old_kind = "K" if marker == 0x4B else "O"
            old, pos = _read_tuple(buf, pos + 1, relation)
            marker = buf[pos]
        if marker != 0x4E:  # 'N'
            expected = "'N'" if old_kind else "'K', 'O' or 'N'"
            raise _Fail(
                InvalidMessage, f"expected {expected} tuple marker, got {chr(marker)!r}", pos
            )
        new, pos = _read_tuple(buf, pos + 1, relation)
        if pos != len(buf):
            _end(buf, pos)
        return _make_update(relid, old_kind, old, new, xid)

    def _delete(self, buf: bytes) -> Delete:
        if self.stream_xid is None:
            xid, pos = None, 1
        else:
            (xid,), pos = _u32(buf, 1), 5
        (relid,) = _u32(buf, pos)
        relation = self.relations.get(relid) or self._unknown_relation(relid, pos)
        marker = buf[pos + 4]
        if marker != 0x4B and marker != 0x4F:
            raise _Fail(
                InvalidMessage, f"expected 'K' or 'O' tuple marker, got {chr(marker)!r}", pos + 4
            )
        old, pos = _read_tuple(buf, pos + 5, relation)
        if pos != len(buf):
            _end(buf, pos)
        return _make_delete(relid, "K" if marker == 0x4B else "O", old, xid)

    def _truncate(self, buf: bytes) -> Truncate:
        xid, pos = self._xid_prefix(buf)
        _need(buf, pos, 5, "relation count and options")
        (nrels,) = _u32(buf, pos)
        options = buf[pos + 4]
        if self.strict:
            _flag_byte(options, 3, "truncate options", pos + 4)
        pos += 5
        _need(buf, pos, 4 * nrels, f"{nrels} relation ids")
        relids = struct.unpack_from(f">{nrels}I", buf, pos)
        _end(buf, pos + 4 * nrels)
        return Truncate(options, relids, xid)

    def _message(self, buf: bytes) -> Message:
        xid, pos = self._xid_prefix(buf)
        _need(buf, pos, 9, "flags and lsn")
        flags, lsn = _MESSAGE_HEAD.unpack_from(buf, pos)
        if self.strict:
            _flag_byte(flags, 1, "message flags", pos)
        prefix, pos = _string(buf, pos + 9, "message prefix")
        _need(buf, pos, 4, "content length")
        (size,) = _u32(buf, pos)
        pos += 4
        _need(buf, pos, size, "content")
        _end(buf, pos + size)
        return Message(flags, Lsn(lsn), prefix, buf[pos : pos + size], xid)

    # -- streaming -------------------------------------------------------------------------

    def _stream_start(self, buf: bytes) -> StreamStart:
        self._outside_stream(buf)
        _need(buf, 1, 5, "xid and first_segment")
        _end(buf, 6)
        (xid,) = _u32(buf, 1)
        first = buf[5]
        _flag_byte(first, 1, "first_segment", 5)
        self.stream_xid = xid
        return StreamStart(xid, bool(first))

    def _stream_stop(self, buf: bytes) -> StreamStop:
        if self.stream_xid is None:
            raise _Fail(UnexpectedMessage, "Stream Stop without a Stream Start", 0)
        _end(buf, 1)
        self.stream_xid = None
        return StreamStop()

    def _stream_commit(self, buf: bytes) -> StreamCommit:
        self._outside_stream(buf)
        xid, flags, commit_lsn, end_lsn, ts = self._fixed(buf, _STREAM_COMMIT)
        self._reserved_flags(flags, 5)
        return StreamCommit(xid, Lsn(commit_lsn), Lsn(end_lsn), ts, flags)

    def _stream_abort(self, buf: bytes) -> StreamAbort:
        self._outside_stream(buf)
        fields = self._fixed(buf, self._abort)
        if len(fields) == 2:
            return StreamAbort(fields[0], fields[1])
        xid, subxid, abort_lsn, abort_ts = fields
        return StreamAbort(xid, subxid, Lsn(abort_lsn), abort_ts)

    # -- two-phase -------------------------------------------------------------------------

    def _gid(self, buf: bytes, pos: int) -> str:
        gid, end = _string(buf, pos, "gid")
        _end(buf, end)
        return gid

    def _begin_prepare(self, buf: bytes) -> BeginPrepare:
        self._outside_stream(buf)
        _need(buf, 1, _BEGIN_PREPARE.size, "fixed fields")
        lsn, end_lsn, ts, xid = _BEGIN_PREPARE.unpack_from(buf, 1)
        return BeginPrepare(Lsn(lsn), Lsn(end_lsn), ts, xid, self._gid(buf, 29))

    def _prepare_fields(self, buf: bytes) -> tuple[int, Lsn, Lsn, int, int, str]:
        self._outside_stream(buf)
        _need(buf, 1, _PREPARE.size, "fixed fields")
        flags, lsn, end_lsn, ts, xid = _PREPARE.unpack_from(buf, 1)
        self._reserved_flags(flags, 1)
        return flags, Lsn(lsn), Lsn(end_lsn), ts, xid, self._gid(buf, 30)

    def _prepare(self, buf: bytes) -> Prepare:
        flags, lsn, end_lsn, ts, xid, gid = self._prepare_fields(buf)
        return Prepare(lsn, end_lsn, ts, xid, gid, flags)

    def _commit_prepared(self, buf: bytes) -> CommitPrepared:
        flags, lsn, end_lsn, ts, xid, gid = self._prepare_fields(buf)
        return CommitPrepared(lsn, end_lsn, ts, xid, gid, flags)

    def _stream_prepare(self, buf: bytes) -> StreamPrepare:
        flags, lsn, end_lsn, ts, xid, gid = self._prepare_fields(buf)
        return StreamPrepare(lsn, end_lsn, ts, xid, gid, flags)

    def _rollback_prepared(self, buf: bytes) -> RollbackPrepared:
        self._outside_stream(buf)
        _need(buf, 1, _ROLLBACK_PREPARED.size, "fixed fields")
        flags, prep_end, rb_end, prep_ts, rb_ts, xid = _ROLLBACK_PREPARED.unpack_from(buf, 1)
        self._reserved_flags(flags, 1)
        gid = self._gid(buf, 1 + _ROLLBACK_PREPARED.size)
        return RollbackPrepared(Lsn(prep_end), Lsn(rb_end), prep_ts, rb_ts, xid, gid, flags)


def _message_name(buf: bytes) -> str:
    code = chr(buf[0])
    return _NAMES.get(code, repr(code))


def _lsn(value: int | None) -> Lsn | None:
    return Lsn(value) if value else None
