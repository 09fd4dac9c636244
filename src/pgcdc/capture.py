"""pgcdc capture files (``.pgcap``): a replication session's raw CopyBoth frames, replayable.

Layout, format version 2 (integers big-endian; "record" is a `pgcdc.records` record:
``uint32 length | uint32 crc32 | payload``)::

    magic        8 bytes   b"PGCDCCAP"
    version      uint16    2
    header       a record: UTF-8 JSON (CaptureHeader)
    frames       a record each: int64 received_at | frame
    end marker   a record: uint32 count of frame records

`frame` is one CopyData payload exactly as the server sent it (XLogData ``w`` or keepalive
``k``), `received_at` the client's clock in microseconds since 2000-01-01 UTC. The header
records what decoding the frames needs (proto version, streaming mode, ...), checked before
any frame is decoded. The CRCs catch bit rot that would still decode; the end marker tells a
complete capture from one whose recording was cut off.

Format version 1 (until pgcdc 0.1.0) is still read: the header as ``uint32 length | JSON``
without a checksum, frames as ``uint32 length | uint32 crc32(frame) | int64 received_at |
frame``, the end marker as ``uint32 0xFFFFFFFF | uint32 count``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, BinaryIO

from pgcdc.errors import CaptureError, RecordError, UnsupportedOption
from pgcdc.protocol import MAX_PROTO_VERSION, Lsn, StreamingMode
from pgcdc.records import MAX_PAYLOAD, read_records, write_record
from pgcdc.replication.options import OriginFilter, StreamOptions

__all__ = ["CaptureHeader", "CaptureReader", "CaptureRecord", "CaptureWriter"]

MAGIC = b"PGCDCCAP"
FORMAT_VERSION = 2
_PREAMBLE = struct.Struct(">8sH")
_RECEIVED_AT = struct.Struct(">q")
_COUNT = struct.Struct(">I")
_V1_HEADER_LEN = struct.Struct(">I")
_V1_RECORD = struct.Struct(">IIq")
_V1_END = struct.Struct(">II")  # 0xFFFFFFFF, count
_NO_END = "file ends without an end marker (truncated, or the recording was cut off)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_lsn(value: Any) -> bool:
    try:
        Lsn.parse(value)
    except (TypeError, ValueError):
        return False
    return True


_STREAMING_MODES = {m.value for m in StreamingMode}

#: What each header field may hold: a check, and what the check means (for the message).
#: Every field is required: pgcdc has always written them all.
_FIELD_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "proto_version": (
        lambda v: _is_int(v) and 1 <= v <= MAX_PROTO_VERSION,
        f"an integer from 1 to {MAX_PROTO_VERSION}",
    ),
    "streaming": (
        lambda v: isinstance(v, str) and v in _STREAMING_MODES,
        " or ".join(repr(m.value) for m in StreamingMode),
    ),
    "binary": (lambda v: isinstance(v, bool), "true or false"),
    "messages": (lambda v: isinstance(v, bool), "true or false"),
    "two_phase": (lambda v: isinstance(v, bool), "true or false"),
    "origin": (
        lambda v: v is None or (isinstance(v, str) and v in {"any", "none"}),
        "null, 'any' or 'none'",
    ),
    "publication_names": (_is_str_list, "a list of strings"),
    "server_version": (
        lambda v: _is_int(v) and (v == 0 or 100000 <= v < 1000000),
        "a server_version_num of PostgreSQL 10 or later (or 0: unknown)",
    ),
    "start_lsn": (_is_lsn, "an LSN X/Y"),
}


def _excerpt(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


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
        """The header, checked as a whole before it configures a decoder: every field there
        and of its type, nothing unknown, and a session the server could have had (the
        streaming mode, two-phase and the server version fit the proto version: the rules of
        `StreamOptions.negotiate`). Anything else is one `CaptureError` line."""
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:  # also not UTF-8, an absurd number
            raise CaptureError(f"capture header is not valid JSON: {_one_line(exc)}") from None
        if not isinstance(raw, dict):
            raise CaptureError(f"capture header is {_excerpt(raw)}, not a JSON object")
        names = [f.name for f in fields(cls)]
        unknown = [str(k) for k in raw if k not in names]
        if unknown:
            raise CaptureError(
                f"capture header has unknown field(s) {', '.join(map(_excerpt, unknown))} "
                "(a damaged header, or one written by a newer pgcdc)"
            )
        for name, value in raw.items():
            check, meaning = _FIELD_CHECKS.get(name, (lambda v: isinstance(v, str), "a string"))
            if not check(value):
                raise CaptureError(
                    f"capture header: {name} is {_excerpt(value)}, expected {meaning} "
                    "(a damaged or hand-edited header)"
                )
        missing = [name for name in names if name not in raw]
        if missing:
            raise CaptureError(f"capture header lacks {', '.join(missing)}")
        header = cls(**raw)
        header._check_session()
        return header

    def _check_session(self) -> None:
        """A session pgoutput could have sent these frames in (`StreamOptions.negotiate`,
        against the recorded server version when it is known)."""
        options = StreamOptions(
            tuple(self.publication_names),
            proto_version=self.proto_version,
            binary=self.binary,
            messages=self.messages,
            streaming=StreamingMode(self.streaming),
            two_phase=self.two_phase,
            origin=None if self.origin is None else OriginFilter(self.origin),
        )
        try:
            options.negotiate(self.server_version or _ANY_SERVER, require_publication=False)
        except UnsupportedOption as exc:
            raise CaptureError(
                f"capture header: {exc} (no session sends that: a damaged or hand-edited header)"
            ) from None


#: A server version that supports every option, for a header that does not know its server.
_ANY_SERVER = 999999


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


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
        file.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION))
        write_record(file, header.to_json())

    def write(self, frame: bytes, received_at: int) -> None:
        write_record(self.file, _RECEIVED_AT.pack(received_at) + frame)
        self.count += 1

    def close(self) -> None:
        write_record(self.file, _COUNT.pack(self.count))
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
        _, self.version = _PREAMBLE.unpack(preamble)
        if self.version == 1:
            self.header, self._offset = self._v1_header()
        elif self.version == FORMAT_VERSION:
            self._records = read_records(file, _PREAMBLE.size)
            try:
                first = next(self._records, None)
            except RecordError as exc:
                raise CaptureError(f"{name}: header {exc}") from None
            if first is None:
                raise CaptureError(f"{name}: truncated in the header")
            self.header = self._header(first.payload)
            self._offset = first.end
        else:
            raise CaptureError(f"{name}: capture format version {self.version} is not supported")

    def _header(self, data: bytes) -> CaptureHeader:
        try:
            return CaptureHeader.from_json(data)
        except CaptureError as exc:
            raise CaptureError(f"{self.name}: {exc}") from None

    def _fail(self, index: int, offset: int, reason: str) -> CaptureError:
        return CaptureError(f"{self.name}: record {index} at byte {offset}: {reason}")

    def _check_end(self, index: int, offset: int, count: int, trailing: bytes) -> None:
        """The end marker at `offset` counts `count` records; `index` were read."""
        if count != index:
            raise self._fail(index, offset, f"end marker counts {count} records, found {index}")
        if trailing:
            raise self._fail(index, offset, "bytes after the end marker")

    def __iter__(self) -> Iterator[CaptureRecord]:
        if self.version == 1:
            yield from self._v1_records()
            return
        index, offset = 0, self._offset
        try:
            for record in self._records:
                payload, offset = record.payload, record.end
                if len(payload) == _COUNT.size:
                    (count,) = _COUNT.unpack(payload)
                    self._check_end(index, record.offset, count, self.file.read(1))
                    return
                if len(payload) <= _RECEIVED_AT.size:
                    raise self._fail(index, record.offset, f"a {len(payload)}-byte record")
                (received_at,) = _RECEIVED_AT.unpack_from(payload)
                yield CaptureRecord(index, record.offset, received_at, payload[_RECEIVED_AT.size :])
                index += 1
        except RecordError as exc:
            raise self._fail(index, exc.offset, exc.reason) from None
        raise self._fail(index, offset, _NO_END)

    # -- format version 1 (read only) ---------------------------------------------------------

    def _v1_header(self) -> tuple[CaptureHeader, int]:
        raw = self.file.read(_V1_HEADER_LEN.size)
        if len(raw) < _V1_HEADER_LEN.size:
            raise CaptureError(f"{self.name}: truncated in the header")
        (header_len,) = _V1_HEADER_LEN.unpack(raw)
        if header_len > MAX_PAYLOAD:
            raise CaptureError(f"{self.name}: header length {header_len} is implausible")
        data = self.file.read(header_len)
        if len(data) < header_len:
            raise CaptureError(f"{self.name}: truncated in the header")
        return self._header(data), _PREAMBLE.size + _V1_HEADER_LEN.size + header_len

    def _v1_records(self) -> Iterator[CaptureRecord]:
        index, offset = 0, self._offset
        read = self.file.read
        while True:
            head = read(_V1_RECORD.size)
            if len(head) >= _V1_END.size and head[:4] == b"\xff\xff\xff\xff":
                _, count = _V1_END.unpack_from(head)
                self._check_end(index, offset, count, head[_V1_END.size :] + read(1))
                return
            if len(head) < _V1_RECORD.size:
                raise self._fail(index, offset, _NO_END)
            length, crc, received_at = _V1_RECORD.unpack(head)
            if length > MAX_PAYLOAD:
                raise self._fail(index, offset, f"frame length {length} is implausible")
            frame = read(length)
            if len(frame) < length:
                raise self._fail(index, offset, f"truncated frame: {len(frame)} of {length} bytes")
            if zlib.crc32(frame) != crc:
                raise self._fail(index, offset, "checksum mismatch (corrupt frame)")
            yield CaptureRecord(index, offset, received_at, frame)
            offset += _V1_RECORD.size + length
            index += 1
