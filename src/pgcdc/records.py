"""Framed, checksummed records: the one record format of capture, spill and spool files.

A file of records is a sequence of::

    uint32 length | uint32 crc32(payload) | payload        (big-endian)

Readers yield every intact record and stop at the first damaged one with a `RecordError`
naming its byte offset, so a truncated or corrupt file loses nothing that is intact. The CRC
catches damage that would still parse; the length bound catches a damaged length before it
turns into a huge allocation. `read_records` reads a stream record by record (a file while it
grows, a spill file read back); `read_range` reads a byte range written earlier in one read
(a spool range on an executor). No imports beyond the standard library and `pgcdc.errors`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from pgcdc.errors import RecordError

__all__ = [
    "HEADER_SIZE",
    "MAX_PAYLOAD",
    "Record",
    "encode_record",
    "read_range",
    "read_records",
    "split_payloads",
    "split_records",
    "write_record",
]

_HEADER = struct.Struct(">II")
HEADER_SIZE = _HEADER.size
#: The default bound on one payload (PostgreSQL's own limit on one CopyData message).
MAX_PAYLOAD = 1 << 30


@dataclass(frozen=True, slots=True)
class Record:
    #: Byte offset of the record's header in its file.
    offset: int
    payload: bytes

    @property
    def end(self) -> int:
        """Byte offset just past the record (where the next one starts)."""
        return self.offset + HEADER_SIZE + len(self.payload)


def encode_record(payload: bytes) -> bytes:
    """One record: header and payload."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def write_record(file: BinaryIO, payload: bytes) -> int:
    """Append one record to `file`; the number of bytes written."""
    record = encode_record(payload)
    file.write(record)
    return len(record)


def _check(offset: int, length: int, crc: int, payload: bytes) -> None:
    if len(payload) < length:
        raise RecordError(offset, f"truncated payload: {len(payload)} of {length} bytes")
    if zlib.crc32(payload) != crc:
        raise RecordError(offset, "checksum mismatch (damaged payload)")


def read_records(
    file: BinaryIO, offset: int = 0, *, max_payload: int = MAX_PAYLOAD
) -> Iterator[Record]:
    """The records from `file`'s current position (at byte `offset` of the file) to its end.

    Reads one record at a time. The end of the file is fine between records only.
    """
    read = file.read
    while header := read(HEADER_SIZE):
        if len(header) < HEADER_SIZE:
            raise RecordError(offset, f"truncated header: {len(header)} of {HEADER_SIZE} bytes")
        length, crc = _HEADER.unpack(header)
        if length > max_payload:
            raise RecordError(offset, f"length {length} is implausible (damaged header)")
        payload = read(length)
        _check(offset, length, crc, payload)
        yield Record(offset, payload)
        offset += HEADER_SIZE + length


def split_records(
    data: bytes, offset: int = 0, *, max_payload: int = MAX_PAYLOAD
) -> Iterator[Record]:
    """The records in `data`, which starts at byte `offset` of its file and must end on a
    record boundary."""
    at = offset
    for payload in split_payloads(data, offset, max_payload=max_payload):
        yield Record(at, payload)
        at += HEADER_SIZE + len(payload)


def split_payloads(
    data: bytes, offset: int = 0, *, max_payload: int = MAX_PAYLOAD
) -> Iterator[bytes]:
    """The payloads of `split_records` (a reader of many small records: no `Record` each)."""
    pos, size, unpack = 0, len(data), _HEADER.unpack_from
    while pos < size:
        if pos + HEADER_SIZE > size:
            raise RecordError(
                offset + pos, f"truncated header: {size - pos} of {HEADER_SIZE} bytes"
            )
        length, crc = unpack(data, pos)
        if length > max_payload:
            raise RecordError(offset + pos, f"length {length} is implausible (damaged header)")
        start = pos + HEADER_SIZE
        payload = data[start : start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            _check(offset + pos, length, crc, payload)  # raises, saying which
        yield payload
        pos = start + length


def read_range(
    path: str | os.PathLike[str], offset: int, length: int, *, max_payload: int = MAX_PAYLOAD
) -> Iterator[Record]:
    """The records in bytes [offset, offset + length) of the file at `path`, read at once.

    OSError (the file cannot be read) is the caller's to report; a range cut short by the
    end of the file is a `RecordError`.
    """
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read(length)
    yield from split_records(data, offset, max_payload=max_payload)
    if len(data) < length:
        raise RecordError(offset + len(data), f"the file ends {length - len(data)} bytes early")
