"""Deletion vectors as the Delta protocol stores them (PROTOCOL.md, "Deletion Vector Format").

A deletion vector (DV) is the set of row indexes of one data file that are deleted. It is
serialized as a magic number (1681511377, little-endian) followed by a 64-bit RoaringBitmap
in the portable format: the number of 32-bit buckets (uint64), then per bucket its high 32
bits (uint32) and a 32-bit Roaring bitmap of the low bits (cookie, descriptive header,
offsets, then array or 8 KiB bitmap containers; run containers are read, never written).

A DV is stored inline in the log (storage type ``i``: Z85 text), or in a file named
``deletion_vector_<uuid>.bin`` beside the data (``u``: the descriptor holds the UUID in Z85,
after an optional directory prefix) or at an absolute path (``p``). A DV file is a version
byte (1) followed by DVs, each as its size (uint32, big-endian), its bytes, and their CRC-32
(big-endian); a descriptor's ``offset`` points at the size.

No I/O here but reading and writing the DV files themselves. Row sets are sorted, unique
``uint64`` numpy arrays.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAGIC",
    "DeletionVector",
    "DvFormatError",
    "Rows",
    "contains",
    "decode",
    "descriptor_rows",
    "dv_file_name",
    "encode",
    "no_rows",
    "sorted_rows",
    "union",
    "unique_id",
    "write_dv_file",
    "z85_decode",
    "z85_encode",
]

Rows = npt.NDArray[np.uint64]

#: The magic number of the portable format (the "native" one, 1681511376, is not read).
MAGIC = 1681511377
_NO_RUNS, _RUNS = 12346, 12347
_ARRAY_MAX = 4096  # an array container holds at most this many values; a bitmap more
_DV_FILE_VERSION = 1
_Z85 = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


class DvFormatError(ValueError):
    """Bytes that are not a deletion vector this module can read."""


def no_rows() -> Rows:
    return np.empty(0, np.uint64)


def sorted_rows(rows: Any) -> Rows:
    """`rows` (any integer sequence of non-negative row indexes) as a sorted unique array."""
    array = np.asarray(rows)
    if array.size and array.dtype.kind == "i" and int(array.min()) < 0:
        raise ValueError("a row index cannot be negative")
    out = array.astype(np.uint64, copy=False).ravel()
    if out.size > 1 and not bool(np.all(out[1:] > out[:-1])):
        out = np.unique(out)
    return out


def contains(rows: Rows, values: Rows) -> npt.NDArray[np.bool_]:
    """Per value (any order): whether sorted `rows` holds it."""
    if not rows.size:
        return np.zeros(values.size, np.bool_)
    at = np.minimum(np.searchsorted(rows, values), rows.size - 1)
    return np.asarray(rows[at] == values, np.bool_)


def union(rows: Rows, more: Rows) -> Rows:
    """Sorted `rows` with sorted unique `more` added (a DV and the rows a batch deletes)."""
    more = more[~contains(rows, more)]
    return np.insert(rows, np.searchsorted(rows, more), more) if more.size else rows


# -- Z85 (ZeroMQ's base 85): 4 bytes <-> 5 characters ------------------------------------


def z85_encode(data: bytes) -> str:
    """Z85 text of `data` (zero-padded to a multiple of 4 bytes, as the protocol says)."""
    data += b"\0" * (-len(data) % 4)
    words = np.frombuffer(data, ">u4").astype(np.uint64)
    digits = np.empty((words.size, 5), np.uint8)
    for i in range(4, -1, -1):
        digits[:, i] = (words % 85).astype(np.uint8)
        words //= 85
    return bytes(np.frombuffer(_Z85, np.uint8)[digits].ravel()).decode("ascii")


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 `text` (a multiple of 5 characters)."""
    raw = text.encode("ascii")
    if len(raw) % 5:
        raise DvFormatError(f"Z85 text of {len(raw)} characters (not a multiple of 5)")
    try:
        values = np.array([_Z85_VALUE[c] for c in raw], np.uint64).reshape(-1, 5)
    except KeyError as exc:
        raise DvFormatError(f"not a Z85 character: {chr(exc.args[0])!r}") from None
    words = np.zeros(values.shape[0], np.uint64)
    for i in range(5):
        words = words * 85 + values[:, i]
    if words.size and int(words.max()) > 0xFFFFFFFF:
        raise DvFormatError("Z85 group out of range")
    return words.astype(">u4").tobytes()


# -- RoaringBitmap, portable serialization ------------------------------------------------


def _runs_of(highs: npt.NDArray[Any]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Where each run of equal values of sorted `highs` starts and ends."""
    starts = np.concatenate(([0], np.flatnonzero(highs[1:] != highs[:-1]) + 1))
    return starts, np.append(starts[1:], highs.size)


def _roaring32(low: npt.NDArray[np.uint32]) -> bytes:
    """A 32-bit bitmap of sorted unique `low` values: no run containers (cookie 12346)."""
    highs = (low >> 16).astype(np.uint16)
    starts, ends = _runs_of(highs)
    counts = ends - starts
    header = struct.pack("<II", _NO_RUNS, starts.size)
    descriptive = np.empty(2 * starts.size, "<u2")
    descriptive[0::2] = highs[starts]
    descriptive[1::2] = counts - 1
    payloads = []
    for start, end, count in zip(starts.tolist(), ends.tolist(), counts.tolist(), strict=True):
        values = low[start:end] & 0xFFFF
        if count <= _ARRAY_MAX:
            payloads.append(values.astype("<u2").tobytes())
        else:
            bits = np.zeros(1 << 16, np.bool_)
            bits[values.astype(np.intp)] = True  # (an intp index: twice as fast as uint32)
            payloads.append(np.packbits(bits, bitorder="little").tobytes())
    first = len(header) + 8 * starts.size
    offsets = first + np.cumsum([0] + [len(p) for p in payloads[:-1]], dtype=np.int64)
    return b"".join([header, descriptive.tobytes(), offsets.astype("<u4").tobytes(), *payloads])


#: A DV of one array container in bucket 0 (the rows of a file under 65,536 rows, at most
#: 4,096 of them deleted: most DVs): magic, one bucket, its high bits, then the 32-bit
#: bitmap's cookie, one container, its high bits and count - 1, its offset; the values follow.
_ONE_ARRAY = struct.Struct("<IQIIIHHI")


def encode(rows: Rows) -> bytes:
    """The serialized DV (magic number and 64-bit portable RoaringBitmap) of `rows`."""
    rows = sorted_rows(rows)
    if 0 < rows.size <= _ARRAY_MAX and int(rows[-1]) < 1 << 16:
        head = _ONE_ARRAY.pack(MAGIC, 1, 0, _NO_RUNS, 1, 0, rows.size - 1, 16)
        return head + rows.astype("<u2").tobytes()
    return _encode_buckets(rows)


def _encode_buckets(rows: Rows) -> bytes:
    highs = (rows >> np.uint64(32)).astype(np.uint32)
    low = rows.astype(np.uint32)  # (the low 32 bits)
    starts, ends = _runs_of(highs) if rows.size else (np.empty(0, np.intp), np.empty(0, np.intp))
    parts = [struct.pack("<IQ", MAGIC, starts.size)]
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        parts.append(struct.pack("<I", int(highs[start])))
        parts.append(_roaring32(low[start:end]))
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise DvFormatError(f"deletion vector truncated at byte {self.pos}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def array(self, dtype: str, count: int) -> npt.NDArray[Any]:
        size = np.dtype(dtype).itemsize * count
        if self.pos + size > len(self.data):
            raise DvFormatError(f"deletion vector truncated at byte {self.pos}")
        out = np.frombuffer(self.data, dtype, count, self.pos)
        self.pos += size
        return out


def _read_roaring32(reader: _Reader) -> npt.NDArray[np.uint32]:
    start = reader.pos
    (cookie,) = reader.take("<I")
    if cookie == _NO_RUNS:
        (size,) = reader.take("<I")
        runs = np.zeros(size, np.bool_)
    elif cookie & 0xFFFF == _RUNS:
        size = (cookie >> 16) + 1
        flags = reader.array("u1", (size + 7) // 8)
        runs = np.unpackbits(flags, bitorder="little")[:size].astype(np.bool_)
    else:
        raise DvFormatError(f"not a portable RoaringBitmap (cookie {cookie})")
    descriptive = reader.array("<u2", 2 * size)
    keys, cards = descriptive[0::2].astype(np.uint32), descriptive[1::2].astype(np.int64) + 1
    if cookie == _NO_RUNS or size >= 4:
        offsets = reader.array("<u4", size)
        if size and int(offsets[0]) != reader.pos - start:
            raise DvFormatError("RoaringBitmap offsets do not follow its header")
    out = []
    for key, card, run in zip(keys.tolist(), cards.tolist(), runs.tolist(), strict=True):
        if run:
            (count,) = reader.take("<H")
            pairs = reader.array("<u2", 2 * count).astype(np.int64)
            starts, lengths = pairs[0::2], pairs[1::2] + 1
            runs_of = [np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)]
            low = np.concatenate(runs_of) if runs_of else np.empty(0, np.int64)
        elif card <= _ARRAY_MAX:
            low = reader.array("<u2", card)
        else:
            bits = np.unpackbits(reader.array("u1", 8192), bitorder="little")
            low = np.flatnonzero(bits)
        if len(low) != card:
            raise DvFormatError(f"container {key}: {len(low)} values, header says {card}")
        out.append((np.uint32(key) << np.uint32(16)) | np.asarray(low, np.uint32))
    return np.concatenate(out) if out else np.empty(0, np.uint32)


def decode(data: bytes) -> Rows:
    """The rows of a serialized DV."""
    reader = _Reader(data)
    (magic,) = reader.take("<I")
    if magic != MAGIC:
        raise DvFormatError(f"deletion vector magic number {magic}, expected {MAGIC}")
    (buckets,) = reader.take("<Q")
    out = []
    for _ in range(buckets):
        (high,) = reader.take("<I")
        low = _read_roaring32(reader).astype(np.uint64)
        out.append((np.uint64(high) << np.uint64(32)) | low)
    if reader.pos != len(data):
        raise DvFormatError(f"{len(data) - reader.pos} bytes after the deletion vector")
    rows = np.concatenate(out) if out else no_rows()
    if rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1])):
        raise DvFormatError("deletion vector values out of order")
    return rows


# -- descriptors and DV files ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeletionVector:
    """A DV descriptor of the log (``add.deletionVector``), as the protocol names its fields."""

    storage_type: str  # 'u' (file beside the data), 'i' (inline), 'p' (absolute path)
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def from_action(cls, action: dict[str, Any]) -> DeletionVector:
        return cls(
            str(action["storageType"]),
            str(action["pathOrInlineDv"]),
            int(action["sizeInBytes"]),
            int(action["cardinality"]),
            None if action.get("offset") is None else int(action["offset"]),
        )

    def to_action(self) -> dict[str, Any]:
        action: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            action["offset"] = self.offset
        action["sizeInBytes"] = self.size_in_bytes
        action["cardinality"] = self.cardinality
        return action

    @property
    def unique_id(self) -> str:
        """What tells this DV from others (the protocol's ``uniqueId``)."""
        return self.path_or_inline_dv + ("" if self.offset is None else f"@{self.offset}")

    def file_path(self, table_dir: str) -> str | None:
        """The DV file's absolute path (None: stored inline)."""
        if self.storage_type == "i":
            return None
        if self.storage_type == "p":
            text = self.path_or_inline_dv
            return unquote(text[len("file://") :]) if text.startswith("file://") else text
        if self.storage_type != "u":
            raise DvFormatError(f"deletion vector storage type {self.storage_type!r}")
        prefix, encoded = self.path_or_inline_dv[:-20], self.path_or_inline_dv[-20:]
        return os.path.join(table_dir, prefix, dv_file_name(uuid.UUID(bytes=z85_decode(encoded))))


def unique_id(action: dict[str, Any]) -> str:
    """`DeletionVector.unique_id` of a log's DV descriptor, without reading it whole."""
    offset = action.get("offset")
    return str(action["pathOrInlineDv"]) + ("" if offset is None else f"@{int(offset)}")


def dv_file_name(uid: uuid.UUID) -> str:
    return f"deletion_vector_{uid}.bin"


def descriptor_rows(table_dir: str, dv: DeletionVector) -> Rows:
    """The rows a descriptor marks deleted (its DV file read, its checksum checked)."""
    path = dv.file_path(table_dir)
    if path is None:
        data = z85_decode(dv.path_or_inline_dv)[: dv.size_in_bytes]
    else:
        with open(path, "rb") as f:
            f.seek(dv.offset or 0)
            head = f.read(4)
            if len(head) != 4:
                raise DvFormatError(f"{path}: no deletion vector at byte {dv.offset}")
            (size,) = struct.unpack(">I", head)
            data = f.read(size)
            tail = f.read(4)
        if size != dv.size_in_bytes or len(data) != size or len(tail) != 4:
            raise DvFormatError(f"{path}: deletion vector at byte {dv.offset} is cut short")
        if struct.unpack(">I", tail)[0] != zlib.crc32(data):
            raise DvFormatError(f"{path}: checksum mismatch at byte {dv.offset}")
    rows = decode(data)
    if rows.size != dv.cardinality:
        raise DvFormatError(
            f"deletion vector {dv.unique_id}: {rows.size} rows, its descriptor says "
            f"{dv.cardinality}"
        )
    return rows


def write_dv_file(table_dir: str, row_sets: list[Rows]) -> tuple[str, list[DeletionVector]]:
    """One new DV file in `table_dir` holding a DV per row set: its name and descriptors
    (storage type ``u``, no prefix). The file is written and synced before it is named."""
    uid = uuid.uuid4()
    body = bytearray([_DV_FILE_VERSION])
    descriptors = []
    encoded_id = z85_encode(uid.bytes)
    for rows in row_sets:
        data = encode(rows)
        descriptors.append(
            DeletionVector("u", encoded_id, len(data), int(rows.size), offset=len(body))
        )
        body += struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    name = dv_file_name(uid)
    _write_new(os.path.join(table_dir, name), bytes(body))
    return name, descriptors


def _write_new(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
