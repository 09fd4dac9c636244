"""The capture file format: round trip, and clear errors for every kind of damage."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.capture import CaptureHeader, CaptureReader, CaptureWriter
from pgcdc.errors import CaptureError
from pgcdc.protocol import Decoder
from pgcdc.records import write_record

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


# -- damaged headers: every one is one CaptureError line (issue 22, item 5) ------------------

#: A header as `pgcdc record` writes it.
VALID_HEADER: dict[str, object] = json.loads(
    CaptureHeader(
        proto_version=4,
        streaming="parallel",
        binary=True,
        messages=True,
        two_phase=True,
        publication_names=["pub"],
        server_version=160004,
        slot="s",
        system_id="7710797165593243048",
        start_lsn="0/1A2B3C",
        created_at="2026-11-22T01:11:07Z",
        pgcdc_version="0.1.0",
    ).to_json()
)
DELETE = object()


def capture_with(header_json: bytes, version: int) -> bytes:
    """A capture of no frames whose header is `header_json` (format 2: with a valid checksum,
    as a hand edit that rewrote the record would have)."""
    if version == 1:
        return v1_capture_bytes(header_json)
    out = io.BytesIO()
    out.write(b"PGCDCCAP" + struct.pack(">H", 2))
    write_record(out, header_json)
    write_record(out, struct.pack(">I", 0))
    return out.getvalue()


def v1_capture_bytes(header_json: bytes) -> bytes:
    head = b"PGCDCCAP" + struct.pack(">HI", 1, len(header_json))
    return head + header_json + struct.pack(">II", 2**32 - 1, 0)


def edited(**edits: object) -> bytes:
    header = {k: v for k, v in VALID_HEADER.items() if edits.get(k) is not DELETE}
    header.update({k: v for k, v in edits.items() if v is not DELETE})
    return json.dumps(header).encode()


DAMAGED_HEADERS: dict[str, tuple[bytes, str]] = {
    # inconsistent combinations (the Decoder would refuse them with a ValueError)
    "proto 1, streaming parallel": (
        edited(proto_version=1, streaming="parallel", two_phase=False),
        "streaming 'parallel' needs proto_version 4 or higher, 1 was requested",
    ),
    "proto 1, streaming on": (
        edited(proto_version=1, streaming="on", two_phase=False),
        "streaming needs proto_version 2 or higher",
    ),
    "proto 3, streaming parallel": (
        edited(proto_version=3, streaming="parallel"),
        "streaming 'parallel' needs proto_version 4",
    ),
    "proto 2, two_phase": (
        edited(proto_version=2, streaming="on"),
        "two_phase needs proto_version 3 or higher",
    ),
    "proto 4 from PostgreSQL 15": (
        edited(server_version=150018),
        "PostgreSQL 15 supports pgoutput proto_version 3 at most, 4 was requested",
    ),
    "streaming from PostgreSQL 13": (
        edited(
            proto_version=1,
            streaming="off",
            binary=True,
            messages=False,
            two_phase=False,
            server_version=130000,
        ),
        "binary needs PostgreSQL 14 or later, the server is 13",
    ),
    "origin from PostgreSQL 15": (
        edited(proto_version=3, streaming="on", origin="none", server_version=150018),
        "origin needs PostgreSQL 16 or later",
    ),
    # wrong types
    "streaming a list": (edited(streaming=["on"]), 'streaming is ["on"], expected'),
    "streaming an object": (edited(streaming={"on": 1}), 'streaming is {"on": 1}, expected'),
    "origin a list": (edited(origin=["none"]), 'origin is ["none"], expected'),
    "binary a number": (edited(binary=1), "binary is 1, expected true or false"),
    "proto_version a float": (edited(proto_version=4.0), "proto_version is 4.0, expected"),
    "proto_version NaN": (edited(proto_version=float("nan")), "proto_version is NaN"),
    "publication_names a string": (edited(publication_names="pub"), "publication_names is"),
    "publication_names with a number": (
        edited(publication_names=["pub", 5]),
        'publication_names is ["pub", 5], expected a list of strings',
    ),
    "slot a list": (edited(slot=["s"]), 'slot is ["s"], expected a string'),
    "note null": (edited(note=None), "note is null, expected a string"),
    "start_lsn not an LSN": (edited(start_lsn="yesterday"), 'start_lsn is "yesterday"'),
    "start_lsn a number": (edited(start_lsn=5), "start_lsn is 5, expected an LSN"),
    # unknown versions and fields
    "server_version 5": (edited(server_version=5), "server_version is 5, expected"),
    "server_version of PostgreSQL 9.6": (edited(server_version=90600), "server_version is 90600"),
    "proto_version 0": (edited(proto_version=0), "proto_version is 0, expected an integer"),
    "an unknown field": (edited(compression="zstd"), 'unknown field(s) "compression"'),
    # missing fields
    "no streaming": (edited(streaming=DELETE), "capture header lacks streaming"),
    "only proto_version": (b'{"proto_version": 1}', "lacks streaming, binary, messages"),
    "empty object": (b"{}", "lacks proto_version"),
    # not a header at all
    "a list": (b"[1, 2]", "capture header is [1, 2], not a JSON object"),
    "null": (b"null", "capture header is null, not a JSON object"),
    "not UTF-8": (b'{"slot": "\xff"}', "not valid JSON"),
    "deeply nested": (b"[" * 100_000, "not valid JSON"),
    "a number of 5000 digits": (b'{"proto_version": ' + b"1" * 5000 + b"}", "not valid JSON"),
}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", list(DAMAGED_HEADERS))
def test_damaged_headers_are_one_capture_error(name: str, version: int) -> None:
    header_json, message = DAMAGED_HEADERS[name]
    with pytest.raises(CaptureError) as raised:
        CaptureReader(io.BytesIO(capture_with(header_json, version)), "d.pgcap")
    text = str(raised.value)
    assert text.startswith("d.pgcap: capture header") and "\n" not in text, text
    assert message in text, text


def test_the_valid_header_is_read() -> None:
    """The table's base header is fine: each case fails for its own edit."""
    for version in (1, 2):
        reader = CaptureReader(io.BytesIO(capture_with(edited(), version)))
        assert reader.header == CaptureHeader(**VALID_HEADER)  # type: ignore[arg-type]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["off", "on", "parallel", "any", "none", "0/0", "1/FF"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
field_names = st.sampled_from(sorted(VALID_HEADER))


@st.composite
def mutated_headers(draw: st.DrawFn) -> bytes:
    """A valid header with a few fields deleted, replaced by any JSON value or added, then
    perhaps a few of its bytes changed."""
    header = dict(VALID_HEADER)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete":
            header.pop(draw(field_names), None)
        elif action == "replace":
            header[draw(field_names)] = draw(json_values)
        else:
            header[draw(st.text(max_size=8))] = draw(json_values)
    data = bytearray(json.dumps(header).encode())
    for _ in range(draw(st.integers(0, 2))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(mutated_headers(), st.sampled_from([1, 2]))
def test_a_mutated_header_is_read_or_one_capture_error(header_json: bytes, version: int) -> None:
    try:
        reader = CaptureReader(io.BytesIO(capture_with(header_json, version)), "m.pgcap")
    except CaptureError as exc:
        assert "\n" not in str(exc)
        return
    header = reader.header
    Decoder(header.proto_version, header.streaming)  # what decode does next: no ValueError
    assert list(reader) == []
