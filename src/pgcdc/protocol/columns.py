"""Row changes decoded a column at a time: change frames into Arrow-ready buffers.

A *change frame* is one Insert, Update or Delete message as the pipeline stores it: ``uint32
ordinal | uint64 lsn | uint32 length | message`` (big-endian), the message without a stream
block's xid prefix (`change_frame`). `row_columns(relid, ncols)` collects the frames of one
relation (as one Relation message described it) into buffers laid out as Arrow wants them:
per row the ordinal, LSN, operation and old tuple kind, and per cell (row-major, new and old
tuple apart) the kind byte and the value bytes with int32 offsets. No Python object is made
per row or per value.

`add(buffer, start, end)` takes frames until one it cannot decode (another message type,
another relation, anything malformed) and returns that frame's offset: the caller decodes it
with `Decoder`, which raises the precise error, or handles a Truncate or Message there.
The C type of ``_speedups`` does this when it is built; `PyRowColumns` is the reference.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from pgcdc.protocol.frames import XLOG_HEADER_SIZE
from pgcdc.protocol.speedups import SPEEDUPS

__all__ = [
    "CHANGE_FRAME",
    "OP_DELETE",
    "OP_INSERT",
    "OP_UPDATE",
    "PyRowColumns",
    "RowBuffers",
    "append_change_frames",
    "change_frame",
    "row_columns",
]

CHANGE_FRAME = struct.Struct(">IQI")  # ordinal, lsn, message length
OP_INSERT, OP_UPDATE, OP_DELETE = 0, 1, 2
_u32 = struct.Struct(">I").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct("<q")
_I32 = struct.Struct("<i")


def change_frame(ordinal: int, lsn: int, message: bytes) -> bytes:
    return CHANGE_FRAME.pack(ordinal, lsn, len(message)) + message


def _append_change_frames(
    frames: list[bytes], ordinal: int, chunks: dict[int, bytearray]
) -> tuple[int, dict[int, int]]:
    counts: dict[int, int] = {}
    for frame in frames:
        ordinal += 1
        (data_start,) = _u64(frame, 1)
        message = frame[XLOG_HEADER_SIZE:]
        (relid,) = _u32(message, 1)
        chunks[relid] += CHANGE_FRAME.pack(ordinal, data_start, len(message)) + message
        counts[relid] = counts.get(relid, 0) + 1
    return ordinal, counts


#: `append_change_frames(frames, ordinal, chunks)`: each XLogData frame of `frames` (row
#: changes: `UndecodedChanges.frames`) as a change frame appended to the bytearray
#: `chunks[relid]` of its relation, its LSN the frame's data_start, the ordinals counting on
#: from `ordinal`; the last ordinal used and the frames appended per relid.
append_change_frames = SPEEDUPS.append_frames if SPEEDUPS is not None else _append_change_frames


@dataclass(frozen=True, slots=True)
class RowBuffers:
    """What `finish` gives: `rows` rows; int64 `ordinal` and `lsn`, uint8 `op` and
    `old_kind` (``K``, ``O`` or 0) per row; per tuple side (``new``, ``old``) `ncols` uint8
    kinds per row (0: the row has no such tuple) and the values' int32 offsets (one more than
    the cells) and bytes, little-endian."""

    rows: int
    ordinal: bytes
    lsn: bytes
    op: bytes
    old_kind: bytes
    new_kinds: bytes
    new_offsets: bytes
    new_values: bytes
    old_kinds: bytes
    old_offsets: bytes
    old_values: bytes


class RowColumnsLike(Protocol):
    rows: int

    def add(self, buffer: bytes | memoryview, start: int, end: int) -> int: ...

    def finish(self) -> tuple[object, ...]: ...


class PyRowColumns:
    """The reference implementation of the C ``RowColumns`` (same results, slower)."""

    def __init__(self, relid: int, ncols: int) -> None:
        self.relid = relid
        self.ncols = ncols
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self._head = [bytearray() for _ in range(4)]  # ordinal, lsn, op, old_kind
        self._kinds = [bytearray(), bytearray()]
        self._offsets = [bytearray(_I32.pack(0)), bytearray(_I32.pack(0))]
        self._values = [bytearray(), bytearray()]

    @property
    def value_bytes(self) -> int:
        return len(self._values[0]) + len(self._values[1])

    def _tuple(self, side: int, buf: bytes | memoryview, pos: int, end: int) -> int | None:
        ncols = self.ncols
        if pos + 2 > end or int.from_bytes(buf[pos : pos + 2], "big") != ncols:
            return None
        pos += 2
        kinds, offsets, cells = bytearray(), bytearray(), bytearray()
        base = len(self._values[side])
        for _ in range(ncols):
            if pos >= end:
                return None
            kind = buf[pos]
            if kind in b"tb":
                if end - pos < 5:
                    return None
                size = _u32(buf, pos + 1)[0]
                pos += 5
                if size > end - pos:
                    return None
                cells += buf[pos : pos + size]
                pos += size
            elif kind in b"nu":
                pos += 1
            else:
                return None
            kinds.append(kind)
            offsets += _I32.pack(base + len(cells))
        self._kinds[side] += kinds
        self._offsets[side] += offsets
        self._values[side] += cells
        return pos

    def _absent(self, side: int) -> None:
        self._kinds[side] += bytes(self.ncols)
        self._offsets[side] += _I32.pack(len(self._values[side])) * self.ncols

    def _row(self, buf: bytes | memoryview, start: int, end: int) -> tuple[int, int] | None:
        """Decode one message into the buffers: (op, old kind), or None (nothing kept)."""
        if end - start < 6 or _u32(buf, start + 1)[0] != self.relid:
            return None
        code, marker = buf[start], buf[start + 5]
        pos: int | None = start + 5
        if code == 0x49:  # I
            if marker != 0x4E:
                return None
            pos = self._tuple(0, buf, start + 6, end)
            self._absent(1)
            op, old_kind = OP_INSERT, 0
        elif code in (0x55, 0x44):  # U, D
            op, old_kind = (OP_UPDATE if code == 0x55 else OP_DELETE), 0
            if marker in (0x4B, 0x4F):  # K, O
                old_kind = marker
                pos = self._tuple(1, buf, start + 6, end)
            elif code == 0x44:
                return None
            else:
                self._absent(1)
            if pos is not None and code == 0x55:
                if pos >= end or buf[pos] != 0x4E:
                    return None
                pos = self._tuple(0, buf, pos + 1, end)
            elif pos is not None:
                self._absent(0)
        else:
            return None
        return None if pos != end else (op, old_kind)

    def add(self, buffer: bytes | memoryview, start: int, end: int) -> int:
        if start < 0 or end > len(buffer) or start > end:
            raise ValueError("add(): range out of the buffer")
        pos = start
        while end - pos >= CHANGE_FRAME.size:
            ordinal, lsn, size = CHANGE_FRAME.unpack_from(buffer, pos)
            if size > end - pos - CHANGE_FRAME.size:
                break
            marks = [len(b) for b in (*self._kinds, *self._offsets, *self._values)]
            row = self._row(buffer, pos + CHANGE_FRAME.size, pos + CHANGE_FRAME.size + size)
            if row is None:
                for b, n in zip((*self._kinds, *self._offsets, *self._values), marks, strict=True):
                    del b[n:]
                break
            self._head[0] += _I64.pack(ordinal)
            self._head[1] += _I64.pack(lsn)
            self._head[2].append(row[0])
            self._head[3].append(row[1])
            self.rows += 1
            pos += CHANGE_FRAME.size + size
        return pos

    def finish(self) -> tuple[object, ...]:
        result = (
            self.rows,
            *(bytes(b) for b in self._head),
            bytes(self._kinds[0]),
            bytes(self._offsets[0]),
            bytes(self._values[0]),
            bytes(self._kinds[1]),
            bytes(self._offsets[1]),
            bytes(self._values[1]),
        )
        self._reset()
        return result


def row_columns(relid: int, ncols: int) -> RowColumnsLike:
    """A collector of `relid`'s change frames (the C one when it is built)."""
    if SPEEDUPS is not None:
        return SPEEDUPS.RowColumns(relid, ncols)  # type: ignore[no-any-return,unused-ignore]
    return PyRowColumns(relid, ncols)


def finish(columns: RowColumnsLike) -> RowBuffers:
    return RowBuffers(*columns.finish())  # type: ignore[arg-type]
