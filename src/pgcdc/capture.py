"""pgcdc capture files (``.pgcap``): a replication session's raw CopyBoth frames, replayable.

Layout (all integers big-endian)::

    magic        8 bytes   b"PGCDCCAP"
    version      uint16    1
    header_len   uint32
    header       header_len bytes of UTF-8 JSON (CaptureHeader)
    records      each:  uint32 length | uint32 crc32(frame) | int64 received_at | frame
    end marker   uint32 0xFFFFFFFF | uint32 record count

`frame` is one CopyData payload exactly as the server sent it (XLogData ``w`` or keepalive
``k``), `received_at` the client's clock in microseconds since 2000-01-01 UTC. The header
records what decoding the frames needs (proto version, streaming mode, ...). The CRC catches
bit rot that would still decode; the end marker tells a complete capture from one whose
recording was cut off.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import BinaryIO

from pgcdc.errors import CaptureError

__all__ = ["CaptureHeader", "CaptureReader", "CaptureRecord", "CaptureWriter"]

MAGIC = b"PGCDCCAP"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct(">8sHI")
_RECORD = struct.Struct(">IIq")
_END = 0xFFFFFFFF
MAX_FRAME = 1 << 30  # the server's own limit on one CopyData message


@dataclass(slots=True)
class CaptureHeader:
    """What a reader needs to decode the frames, and where they came from."""

    proto_version: int
    streaming: str = "off"
    binary: bool = False
    messages: bool = False
    two_phase: bool = False
    origin: str | None = None
    publication_names: list[str] = field(default_factory=list)
    server_version: int = 0
    slot: str = ""
    system_id: str = ""
    start_lsn: str = "0/0"
    created_at: str = ""
    pgcdc_version: str = ""
    note: str = ""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CaptureHeader:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CaptureError(f"capture header is not valid JSON: {exc}") from None
        if not isinstance(raw, dict) or "proto_version" not in raw:
            raise CaptureError("capture header lacks proto_version")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:
            raise CaptureError(f"capture header is malformed: {exc}") from None


@dataclass(frozen=True, slots=True)
class CaptureRecord:
    index: int
    offset: int
    received_at: int
    frame: bytes


class CaptureWriter:
    """Appends frames to a capture; `close()` writes the end marker."""

    def __init__(self, file: BinaryIO, header: CaptureHeader) -> None:
        self.file = file
        self.count = 0
        data = header.to_json()
        file.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(data)) + data)

    def write(self, frame: bytes, received_at: int) -> None:
        self.file.write(_RECORD.pack(len(frame), zlib.crc32(frame), received_at) + frame)
        self.count += 1

    def close(self) -> None:
        self.file.write(struct.pack(">II", _END, self.count))
        self.file.flush()


class CaptureReader:
    """Reads a capture; iterate for records. Raises CaptureError at the first bad byte.

    Records before the damage are yielded first, so a reader loses nothing that is intact.
    """

    def __init__(self, file: BinaryIO, name: str = "capture") -> None:
        self.file = file
        self.name = name
        preamble = file.read(_PREAMBLE.size)
        if len(preamble) < _PREAMBLE.size or not preamble.startswith(MAGIC):
            raise CaptureError(f"{name}: not a pgcdc capture file (bad magic)")
        _, version, header_len = _PREAMBLE.unpack(preamble)
        if version != FORMAT_VERSION:
            raise CaptureError(f"{name}: capture format version {version} is not supported")
        if header_len > MAX_FRAME:
            raise CaptureError(f"{name}: header length {header_len} is implausible")
        data = file.read(header_len)
        if len(data) < header_len:
            raise CaptureError(f"{name}: truncated in the header")
        self.header = CaptureHeader.from_json(data)
        self._offset = _PREAMBLE.size + header_len

    def _fail(self, index: int, reason: str) -> CaptureError:
        return CaptureError(f"{self.name}: record {index} at byte {self._offset}: {reason}")

    def __iter__(self) -> Iterator[CaptureRecord]:
        index = 0
        read = self.file.read
        while True:
            head = read(_RECORD.size)
            if len(head) >= 8 and head[:4] == b"\xff\xff\xff\xff":
                (count,) = struct.unpack(">I", head[4:8])
                if count != index:
                    raise self._fail(index, f"end marker counts {count} records, found {index}")
                if len(head) > 8 or read(1):
                    raise self._fail(index, "bytes after the end marker")
                return
            if len(head) < _RECORD.size:
                raise self._fail(
                    index,
                    "file ends without an end marker (truncated, or the recording was cut off)",
                )
            length, crc, received_at = _RECORD.unpack(head)
            if length > MAX_FRAME:
                raise self._fail(index, f"frame length {length} is implausible")
            frame = read(length)
            if len(frame) < length:
                raise self._fail(index, f"truncated frame: {len(frame)} of {length} bytes")
            if zlib.crc32(frame) != crc:
                raise self._fail(index, "checksum mismatch (corrupt frame)")
            yield CaptureRecord(index, self._offset, received_at, frame)
            self._offset += _RECORD.size + length
            index += 1
