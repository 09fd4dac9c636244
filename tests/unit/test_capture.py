"""The capture file format: round trip, and clear errors for every kind of damage."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.capture import CaptureHeader, CaptureReader, CaptureWriter
from pgcdc.errors import CaptureError

GOLDEN = Path(__file__).parents[1] / "golden" / "pg16-max-binary-streaming.pgcap"
FRAMES = [b"k" + bytes(17), b"w" + bytes(24) + b"E", b"w" + bytes(24)]


def build(frames: list[bytes] = FRAMES, close: bool = True) -> bytes:
    out = io.BytesIO()
    writer = CaptureWriter(out, CaptureHeader(proto_version=4, streaming="parallel"))
    for i, frame in enumerate(frames):
        writer.write(frame, 1000 + i)
    if close:
        writer.close()
    return out.getvalue()


def read_all(data: bytes) -> list[bytes]:
    return [r.frame for r in CaptureReader(io.BytesIO(data))]


def test_round_trip() -> None:
    data = build()
    reader = CaptureReader(io.BytesIO(data))
    assert reader.header.proto_version == 4 and reader.header.streaming == "parallel"
    records = list(reader)
    assert [r.frame for r in records] == FRAMES
    assert [r.received_at for r in records] == [1000, 1001, 1002]


def test_every_truncation_is_reported() -> None:
    data = build()
    for cut in range(len(data)):
        with pytest.raises(CaptureError):
            read_all(data[:cut])


def test_intact_records_come_before_the_error() -> None:
    data = build(close=False)
    reader = CaptureReader(io.BytesIO(data))
    seen = []
    with pytest.raises(CaptureError, match="without an end marker"):
        for record in reader:
            seen.append(record.frame)
    assert seen == FRAMES


def test_corrupt_frame_fails_its_checksum() -> None:
    data = bytearray(build())
    data[-13] ^= 0x40  # the last byte of the last frame (the end marker is 12 bytes)
    with pytest.raises(CaptureError, match=r"record 2 .*checksum"):
        read_all(bytes(data))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "bad magic"),
        (b"NOTACAPTUREFILE!", "bad magic"),
        (b"PGCDCCAP\x00\x09\x00\x00\x00\x00", "version 9"),
        (b"PGCDCCAP\x00\x01\x00\x00\x00\x03abc", "not valid JSON"),
        (b"PGCDCCAP\x00\x01\x00\x00\x00\x02{}", "lacks proto_version"),
    ],
)
def test_bad_headers(data: bytes, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        CaptureReader(io.BytesIO(data))


def v1_capture(header: dict[str, object]) -> bytes:
    """A format-1 capture (no header checksum) with `header` and no frames."""
    data = json.dumps(header).encode()
    return b"PGCDCCAP" + struct.pack(">HI", 1, len(data)) + data + struct.pack(">II", 2**32 - 1, 0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("proto_version", 5, "proto_version is 5, expected an integer from 1 to 4"),
        ("proto_version", "4", 'proto_version is "4", expected an integer'),
        ("proto_version", True, "proto_version is true"),
        ("streaming", "oo", "streaming is \"oo\", expected 'off' or 'on' or 'parallel'"),
        ("binary", "yes", 'binary is "yes", expected true or false'),
        ("origin", "some", "origin is"),
        ("publication_names", "pub", "publication_names is"),
        ("server_version", "16", "server_version is"),
        ("slot", 5, "slot is 5, expected a string"),
    ],
)
def test_header_values_are_checked(field: str, value: object, message: str) -> None:
    """Format 1 has no header checksum; format 2 has one, but a hand-edited header passes it.
    Either way the values configure the decoder, so each is checked first."""
    header = {"proto_version": 4, "streaming": "parallel", field: value}
    with pytest.raises(CaptureError, match=message.replace("(", r"\(")):
        CaptureReader(io.BytesIO(v1_capture(header)), "c.pgcap")
    out = io.BytesIO()
    writer = CaptureWriter(out, CaptureHeader(proto_version=4))
    writer.close()
    edited = out.getvalue().replace(
        b'"proto_version": 4', json.dumps(field).encode() + b": " + json.dumps(value).encode()
    )
    with pytest.raises(CaptureError, match=r"c\.pgcap: header record at byte 10: "):
        CaptureReader(io.BytesIO(edited), "c.pgcap")  # the edit broke its record


def test_a_damaged_header_fails_its_checksum() -> None:
    data = bytearray(build())
    data[data.index(b"parallel")] ^= 0x01
    with pytest.raises(CaptureError, match=r"c\.pgcap: header record at byte 10: checksum"):
        CaptureReader(io.BytesIO(bytes(data)), "c.pgcap")


def test_format_1_is_still_read() -> None:
    """The golden captures were recorded in format 1, before the header had a checksum."""
    with open(GOLDEN, "rb") as file:
        reader = CaptureReader(file)
        assert reader.version == 1 and reader.header.proto_version == 4
        assert sum(1 for _ in reader) > 3000
    assert CaptureReader(io.BytesIO(build())).version == 2


def test_bytes_after_end_marker() -> None:
    with pytest.raises(CaptureError, match="after the end marker"):
        read_all(build() + b"x")


def pgcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc.cli.main", *args], capture_output=True, text=True, timeout=60
    )


def test_decode_cli_prints_every_message() -> None:
    text = pgcdc("decode", str(GOLDEN))
    json_lines = pgcdc("decode", "--format", "json", str(GOLDEN))
    assert text.returncode == 0 and json_lines.returncode == 0, text.stderr
    assert len(text.stdout.splitlines()) == len(json_lines.stdout.splitlines()) > 3000
    assert "StreamAbort" in text.stdout and '"type": "CommitPrepared"' in json_lines.stdout


def test_decode_cli_on_a_damaged_file(tmp_path: Path) -> None:
    data = GOLDEN.read_bytes()
    truncated = tmp_path / "cut.pgcap"
    truncated.write_bytes(data[: len(data) // 2])
    result = pgcdc("decode", str(truncated))
    assert result.returncode == 1
    assert result.stdout.count("\n") > 100, "intact records are printed before the error"
    assert result.stderr.startswith("pgcdc: error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr

    corrupt = tmp_path / "corrupt.pgcap"
    damaged = bytearray(data)
    damaged[len(data) // 3] ^= 0xFF
    corrupt.write_bytes(bytes(damaged))
    result = pgcdc("decode", str(corrupt))
    assert result.returncode == 1 and "checksum" in result.stderr
    assert "Traceback" not in result.stderr

    result = pgcdc("decode", str(GOLDEN.parent / "generate.py"))
    assert result.returncode == 1 and "not a pgcdc capture file" in result.stderr
