"""Framed, checksummed records (`pgcdc.records`): every intact record before the damage, then
one error naming the damaged record's byte offset; a stream and a byte range read alike."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pgcdc.errors import RecordError
from pgcdc.records import (
    HEADER_SIZE,
    Record,
    encode_record,
    read_range,
    read_records,
    split_records,
    write_record,
)

PAYLOADS = [b"first", b"", b"x" * 300, bytes(range(256))]


def build(payloads: list[bytes] = PAYLOADS) -> tuple[bytes, list[int]]:
    """The file and each record's offset."""
    out = io.BytesIO()
    offsets = []
    for payload in payloads:
        offsets.append(out.tell())
        assert write_record(out, payload) == HEADER_SIZE + len(payload)
    return out.getvalue(), offsets


def stream(data: bytes, start: int = 0) -> list[Record]:
    file = io.BytesIO(data)
    file.seek(start)
    return list(read_records(file, start))


def test_round_trip_in_a_stream_and_in_a_range() -> None:
    data, offsets = build()
    for read in (stream(data), list(split_records(data))):
        assert [r.payload for r in read] == PAYLOADS
        assert [r.offset for r in read] == offsets
        assert read[-1].end == len(data)
    # from the middle of a file, with the file's own offsets
    tail = stream(data, offsets[2])
    assert [r.offset for r in tail] == offsets[2:]
    assert [r.payload for r in tail] == PAYLOADS[2:]


def test_the_layout_is_length_crc_payload_big_endian() -> None:
    assert encode_record(b"ab") == b"\x00\x00\x00\x02" + (0x9E83486D).to_bytes(4, "big") + b"ab"


def test_every_truncation_is_reported_after_the_intact_records() -> None:
    data, offsets = build()
    for cut in range(len(data)):
        if cut in offsets:
            continue  # a file may end between records
        for reader in (lambda d: read_records(io.BytesIO(d)), split_records):
            seen = []
            with pytest.raises(RecordError) as raised:
                seen.extend(r.payload for r in reader(data[:cut]))
            damaged = max(i for i, at in enumerate(offsets) if at < cut)
            assert seen == PAYLOADS[:damaged]
            assert raised.value.offset == offsets[damaged]
            assert "truncated" in str(raised.value)


@pytest.mark.parametrize("which", range(len(PAYLOADS)))
def test_a_flipped_bit_fails_the_checksum_at_its_record(which: int) -> None:
    data, offsets = build()
    damaged = bytearray(data)
    damaged[offsets[which] + 5] ^= 0x10  # inside the crc
    seen = []
    with pytest.raises(RecordError, match=f"record at byte {offsets[which]}: checksum"):
        seen.extend(r.payload for r in read_records(io.BytesIO(bytes(damaged))))
    assert seen == PAYLOADS[:which]


def test_an_implausible_length_is_refused_before_reading_it() -> None:
    data = b"\xff\xff\xff\xf0" + bytes(4)
    with pytest.raises(RecordError, match="length 4294967280 is implausible"):
        list(read_records(io.BytesIO(data)))
    with pytest.raises(RecordError, match="implausible"):
        list(split_records(encode_record(b"abc"), max_payload=2))


def test_read_range(tmp_path: Path) -> None:
    data, offsets = build()
    path = tmp_path / "records"
    path.write_bytes(data)
    middle = list(read_range(path, offsets[1], offsets[3] - offsets[1]))
    assert [(r.offset, r.payload) for r in middle] == [
        (offsets[1], PAYLOADS[1]),
        (offsets[2], PAYLOADS[2]),
    ]
    with pytest.raises(RecordError, match=f"record at byte {offsets[3]}: truncated"):
        list(read_range(path, offsets[3], len(data) - offsets[3] - 1))
    path.write_bytes(data[: offsets[3]])
    with pytest.raises(RecordError, match=f"record at byte {offsets[3]}: the file ends"):
        list(read_range(path, offsets[2], len(data) - offsets[2]))
