"""The CopyBoth sub-protocol around pgoutput: XLogData, primary keepalive, standby status update.

Each CopyData payload of a replication stream holds exactly one frame. For a logical slot an
XLogData frame holds exactly one pgoutput message; its `data_start` is that message's LSN, or 0
for messages written as "non-last" (Relation, Type, a Begin followed by an Origin), so it is not
a position to acknowledge by itself.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from pgcdc.errors import InvalidMessage, TruncatedMessage, UnknownMessageType
from pgcdc.protocol.lsn import Lsn
from pgcdc.protocol.messages import PgoutputMessage, UndecodedChange, fast_constructor

__all__ = [
    "PrimaryKeepalive",
    "StandbyStatusUpdate",
    "UndecodedChanges",
    "XLogData",
    "encode_frame",
    "parse_frame",
]

_XLOG_HEADER = struct.Struct(">cQQq")
_KEEPALIVE = struct.Struct(">cQqB")
_STATUS_UPDATE = struct.Struct(">cQQQqB")
XLOG_HEADER_SIZE = _XLOG_HEADER.size
_U64 = struct.Struct(">Q").unpack_from
_U32 = struct.Struct(">I").unpack_from


@dataclass(frozen=True, slots=True)
class XLogData:
    """``w``: one pgoutput message (`payload`) with its WAL position and the server's send time."""

    data_start: Lsn
    wal_end: Lsn
    send_time: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class UndecodedChanges(PgoutputMessage):
    """Inserts, Updates and Deletes the server sent back to back in a transaction, outside
    any stream block, each still the XLogData frame that carried it: what a `Decoder` with
    `undecoded_rows` takes whole (`Decoder.row_frame`: only the relation is checked). A
    stream hands the frames that arrived together over as one of these, to a consumer that
    stores changes as they came and decodes them later in bulk. `changes` gives each as its
    `UndecodedChange`, with its position (the frame's data_start)."""

    type_code: ClassVar[bytes] = b"I"  # (or U, D: each frame's own)
    frames: list[bytes]

    def changes(self) -> Iterator[tuple[Lsn, UndecodedChange]]:
        for frame in self.frames:
            payload = frame[XLOG_HEADER_SIZE:]
            yield Lsn(_U64(frame, 1)[0]), UndecodedChange(payload[0], _relid(frame), payload)

    def relids(self) -> list[int]:
        """The relations the changes are of, each once, in the order they first come."""
        return list(dict.fromkeys(map(_relid, self.frames)))


def _relid(frame: bytes) -> int:
    """The relid of an XLogData frame's Insert, Update or Delete (outside a stream block)."""
    return int(_U32(frame, XLOG_HEADER_SIZE + 1)[0])


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """``k``: the walsender's sent position; `reply_requested` asks for a status update now."""

    wal_end: Lsn
    send_time: int
    reply_requested: bool


@dataclass(frozen=True, slots=True)
class StandbyStatusUpdate:
    """``r``: the client's received (write), durably handled (flush) and applied positions.

    Only `flush` moves a logical slot's confirmed_flush_lsn.
    """

    write_lsn: Lsn
    flush_lsn: Lsn
    apply_lsn: Lsn
    client_time: int
    reply_requested: bool = False


Frame = XLogData | PrimaryKeepalive | StandbyStatusUpdate

_make_xlogdata = fast_constructor(XLogData)
_make_keepalive = fast_constructor(PrimaryKeepalive)
_new_int = int.__new__


def parse_frame(data: bytes) -> Frame:
    """Parse one CopyData payload of a replication stream."""
    if not data:
        raise TruncatedMessage("empty CopyData frame", data=data, offset=0, message_type="CopyData")
    code = data[0]
    if code == 0x77:  # 'w'
        if len(data) < XLOG_HEADER_SIZE:
            raise TruncatedMessage(
                f"XLogData header needs {XLOG_HEADER_SIZE} bytes, got {len(data)}",
                data=data,
                offset=len(data),
                message_type="XLogData",
            )
        _, start, end, ts = _XLOG_HEADER.unpack_from(data)
        return _make_xlogdata(_new_int(Lsn, start), _new_int(Lsn, end), ts, data[XLOG_HEADER_SIZE:])
    if code == 0x6B:  # 'k'
        _check_size(data, _KEEPALIVE.size, "primary keepalive")
        _, end, ts, reply = _KEEPALIVE.unpack(data)
        reply = _bool(reply, data, "primary keepalive")
        return _make_keepalive(_new_int(Lsn, end), ts, reply)
    if code == 0x72:  # 'r'
        _check_size(data, _STATUS_UPDATE.size, "standby status update")
        _, write, flush, apply, ts, reply = _STATUS_UPDATE.unpack(data)
        return StandbyStatusUpdate(
            Lsn(write), Lsn(flush), Lsn(apply), ts, _bool(reply, data, "standby status update")
        )
    raise UnknownMessageType(
        f"unknown CopyData frame type {chr(code)!r} (0x{code:02x}); expected 'w', 'k' or 'r'",
        data=data,
        offset=0,
        message_type="CopyData",
    )


def encode_frame(frame: Frame) -> bytes:
    """The exact inverse of `parse_frame`."""
    if isinstance(frame, XLogData):
        return (
            _XLOG_HEADER.pack(b"w", frame.data_start, frame.wal_end, frame.send_time)
            + frame.payload
        )
    if isinstance(frame, PrimaryKeepalive):
        return _KEEPALIVE.pack(b"k", frame.wal_end, frame.send_time, frame.reply_requested)
    return _STATUS_UPDATE.pack(
        b"r",
        frame.write_lsn,
        frame.flush_lsn,
        frame.apply_lsn,
        frame.client_time,
        frame.reply_requested,
    )


def _check_size(data: bytes, size: int, name: str) -> None:
    if len(data) < size:
        raise TruncatedMessage(
            f"{name} needs {size} bytes, got {len(data)}",
            data=data,
            offset=len(data),
            message_type=name,
        )
    if len(data) > size:
        raise InvalidMessage(
            f"{len(data) - size} trailing bytes after a {size}-byte {name}",
            data=data,
            offset=size,
            message_type=name,
        )


def _bool(value: int, data: bytes, name: str) -> bool:
    if value > 1:
        raise InvalidMessage(
            f"reply-requested byte must be 0 or 1, got {value}",
            data=data,
            offset=len(data) - 1,
            message_type=name,
        )
    return bool(value)
