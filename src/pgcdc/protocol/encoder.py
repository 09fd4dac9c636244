"""The pgoutput encoder: the exact inverse of `Decoder.decode`.

A message object holds everything its bytes depend on (an xid prefix is present exactly when
`xid` is set; a Stream Abort carries abort_lsn/abort_ts exactly when they are set), so encoding
needs no session state. Used by the tests, by fixtures that build streams by hand, and by
anything that re-emits a stream.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
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
)

__all__ = ["encode", "encode_tuple"]


def _cstring(text: str) -> bytes:
    data = text.encode()
    if b"\0" in data:
        raise ValueError(f"string {text!r} contains a NUL byte, which the protocol cannot carry")
    return data + b"\0"


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def encode_tuple(data: TupleData) -> bytes:
    parts = [struct.pack(">H", len(data.kinds))]
    for kind, value in zip(data.kinds, data.values, strict=True):
        if kind in (0x74, 0x62):  # 't', 'b'
            assert value is not None
            parts.append(struct.pack(">cI", bytes((kind,)), len(value)))
            parts.append(value)
        else:
            parts.append(bytes((kind,)))
    return b"".join(parts)


def _begin(m: Begin) -> bytes:
    return struct.pack(">cQqI", b"B", m.final_lsn, m.commit_ts, m.xid)


def _commit(m: Commit) -> bytes:
    return struct.pack(">cBQQq", b"C", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _origin(m: Origin) -> bytes:
    return struct.pack(">cQ", b"O", m.origin_lsn) + _cstring(m.origin_name)


def _relation(m: Relation) -> bytes:
    parts = [
        b"R",
        _xid(m.xid),
        struct.pack(">I", m.relid),
        _cstring(m.namespace),
        _cstring(m.relname),
        struct.pack(">cH", m.replica_identity.encode("latin-1"), len(m.columns)),
    ]
    for column in m.columns:
        parts.append(bytes((column.flags,)))
        parts.append(_cstring(column.name))
        parts.append(struct.pack(">Ii", column.type_oid, column.type_modifier))
    return b"".join(parts)


def _type(m: Type) -> bytes:
    return (
        b"Y"
        + _xid(m.xid)
        + struct.pack(">I", m.type_oid)
        + _cstring(m.namespace)
        + _cstring(m.name)
    )


def _insert(m: Insert) -> bytes:
    return b"I" + _xid(m.xid) + struct.pack(">I", m.relid) + b"N" + encode_tuple(m.new)


def _update(m: Update) -> bytes:
    old = b""
    if m.old_kind is not None:
        assert m.old is not None
        old = m.old_kind.encode() + encode_tuple(m.old)
    return b"U" + _xid(m.xid) + struct.pack(">I", m.relid) + old + b"N" + encode_tuple(m.new)


def _delete(m: Delete) -> bytes:
    return (
        b"D" + _xid(m.xid) + struct.pack(">I", m.relid) + m.old_kind.encode() + encode_tuple(m.old)
    )


def _truncate(m: Truncate) -> bytes:
    return (
        b"T"
        + _xid(m.xid)
        + struct.pack(">IB", len(m.relids), m.options)
        + struct.pack(f">{len(m.relids)}I", *m.relids)
    )


def _message(m: Message) -> bytes:
    return (
        b"M"
        + _xid(m.xid)
        + struct.pack(">BQ", m.flags, m.lsn)
        + _cstring(m.prefix)
        + struct.pack(">I", len(m.content))
        + m.content
    )


def _stream_start(m: StreamStart) -> bytes:
    return struct.pack(">cIB", b"S", m.xid, m.first_segment)


def _stream_stop(m: StreamStop) -> bytes:
    return b"E"


def _stream_commit(m: StreamCommit) -> bytes:
    return struct.pack(">cIBQQq", b"c", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _stream_abort(m: StreamAbort) -> bytes:
    if m.abort_lsn is None:
        return struct.pack(">cII", b"A", m.xid, m.subxid)
    return struct.pack(">cIIQq", b"A", m.xid, m.subxid, m.abort_lsn, m.abort_ts or 0)


def _begin_prepare(m: BeginPrepare) -> bytes:
    return struct.pack(">cQQqI", b"b", m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid) + _cstring(
        m.gid
    )


def _prepare_like(code: bytes) -> Callable[[Any], bytes]:
    def encode(m: Prepare | CommitPrepared | StreamPrepare) -> bytes:
        lsn = m.commit_lsn if isinstance(m, CommitPrepared) else m.prepare_lsn
        ts = m.commit_ts if isinstance(m, CommitPrepared) else m.prepare_ts
        head = struct.pack(">cBQQqI", code, m.flags, lsn, m.end_lsn, ts, m.xid)
        return head + _cstring(m.gid)

    return encode


def _rollback_prepared(m: RollbackPrepared) -> bytes:
    head = struct.pack(
        ">cBQQqqI",
        b"r",
        m.flags,
        m.prepare_end_lsn,
        m.rollback_end_lsn,
        m.prepare_ts,
        m.rollback_ts,
        m.xid,
    )
    return head + _cstring(m.gid)


def _undecoded(m: UndecodedChange) -> bytes:
    return m.message[:1] + _xid(m.xid) + m.message[1:]


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    UndecodedChange: _undecoded,
    Begin: _begin,
    Commit: _commit,
    Origin: _origin,
    Relation: _relation,
    Type: _type,
    Insert: _insert,
    Update: _update,
    Delete: _delete,
    Truncate: _truncate,
    Message: _message,
    StreamStart: _stream_start,
    StreamStop: _stream_stop,
    StreamCommit: _stream_commit,
    StreamAbort: _stream_abort,
    BeginPrepare: _begin_prepare,
    Prepare: _prepare_like(b"P"),
    CommitPrepared: _prepare_like(b"K"),
    StreamPrepare: _prepare_like(b"p"),
    RollbackPrepared: _rollback_prepared,
}


def encode(message: PgoutputMessage) -> bytes:
    """The wire bytes of one pgoutput message (an XLogData payload)."""
    return _ENCODERS[type(message)](message)
