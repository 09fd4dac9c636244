"""CopyBoth frames around pgoutput (reference §3): XLogData, primary keepalive and standby
status update, built with `struct.pack` from the reference layouts."""

from __future__ import annotations

import struct

import pytest

from pgcdc.errors import InvalidMessage, ProtocolError, TruncatedMessage, UnknownMessageType
from pgcdc.protocol import (
    Begin,
    Decoder,
    Lsn,
    PrimaryKeepalive,
    StandbyStatusUpdate,
    XLogData,
    encode_frame,
    parse_frame,
)

LSN = 0x16_B374D848
SEND_TIME = 767_795_696_789_012


def test_xlogdata_with_a_pgoutput_payload() -> None:
    payload = struct.pack(">cQqI", b"B", LSN, SEND_TIME, 777)
    raw = struct.pack(">cQQq", b"w", LSN, LSN, SEND_TIME) + payload
    assert len(raw) == 25 + len(payload)

    frame = parse_frame(raw)

    assert frame == XLogData(
        data_start=Lsn(LSN), wal_end=Lsn(LSN), send_time=SEND_TIME, payload=payload
    )
    assert type(frame.data_start) is Lsn and type(frame.wal_end) is Lsn
    assert encode_frame(frame) == raw
    assert Decoder().decode(frame.payload, lsn=frame.data_start) == Begin(Lsn(LSN), SEND_TIME, 777)


def test_xlogdata_distinct_start_and_end() -> None:
    raw = struct.pack(">cQQq", b"w", 0, 0xFFFF_FFFF_FFFF_FFFF, -1) + b"E"

    frame = parse_frame(raw)

    assert (frame.data_start, frame.wal_end, frame.send_time) == (0, 2**64 - 1, -1)
    assert frame.payload == b"E"
    assert encode_frame(frame) == raw


def test_xlogdata_zero_length_payload() -> None:
    raw = struct.pack(">cQQq", b"w", 0, 0, SEND_TIME)

    frame = parse_frame(raw)

    assert frame == XLogData(Lsn(0), Lsn(0), SEND_TIME, b"")
    assert encode_frame(frame) == raw
    assert Decoder(4, "parallel").decode(frame.payload) is None


def test_decoder_ignores_empty_payload_without_changing_state() -> None:
    decoder = Decoder(2, "on")
    decoder.decode(b"S" + struct.pack(">IB", 5, 1))

    assert decoder.decode(b"") is None
    assert decoder.stream_xid == 5


@pytest.mark.parametrize("reply", [0, 1])
def test_primary_keepalive(reply: int) -> None:
    raw = struct.pack(">cQqB", b"k", LSN, SEND_TIME, reply)
    assert len(raw) == 18

    frame = parse_frame(raw)

    assert frame == PrimaryKeepalive(
        wal_end=Lsn(LSN), send_time=SEND_TIME, reply_requested=bool(reply)
    )
    assert frame.reply_requested is bool(reply)
    assert encode_frame(frame) == raw


@pytest.mark.parametrize("reply", [False, True])
def test_standby_status_update(reply: bool) -> None:
    update = StandbyStatusUpdate(
        write_lsn=Lsn("16/B374D900"),
        flush_lsn=Lsn("16/B374D848"),
        apply_lsn=Lsn(0),
        client_time=SEND_TIME,
        reply_requested=reply,
    )
    expected = struct.pack(">cQQQqB", b"r", 0x16_B374D900, 0x16_B374D848, 0, SEND_TIME, int(reply))

    raw = encode_frame(update)

    assert len(raw) == 34
    assert raw == expected
    assert parse_frame(raw) == update


def test_standby_status_update_default_does_not_request_reply() -> None:
    raw = encode_frame(StandbyStatusUpdate(Lsn(1), Lsn(2), Lsn(3), 4))

    assert raw[-1] == 0
    assert raw == struct.pack(">cQQQqB", b"r", 1, 2, 3, 4, 0)


# -- malformed frames ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(25))
def test_xlogdata_truncated_header(size: int) -> None:
    raw = struct.pack(">cQQq", b"w", LSN, LSN, SEND_TIME)[: max(size, 1)]

    with pytest.raises(TruncatedMessage, match="XLogData"):
        parse_frame(raw)


def test_empty_frame() -> None:
    with pytest.raises(TruncatedMessage, match="empty CopyData"):
        parse_frame(b"")


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (struct.pack(">cQqB", b"k", LSN, SEND_TIME, 0), "primary keepalive"),
        (struct.pack(">cQQQqB", b"r", 1, 2, 3, 4, 0), "standby status update"),
    ],
)
def test_fixed_size_frames_truncated_and_trailing(raw: bytes, name: str) -> None:
    for cut in range(1, len(raw)):
        with pytest.raises(TruncatedMessage, match=name):
            parse_frame(raw[:cut])
    with pytest.raises(InvalidMessage, match="1 trailing bytes"):
        parse_frame(raw + b"\x00")


@pytest.mark.parametrize("code", [b"k", b"r"])
def test_reply_requested_must_be_0_or_1(code: bytes) -> None:
    if code == b"k":
        raw = struct.pack(">cQqB", b"k", LSN, SEND_TIME, 2)
    else:
        raw = struct.pack(">cQQQqB", b"r", 1, 2, 3, 4, 2)

    with pytest.raises(InvalidMessage, match="must be 0 or 1") as info:
        parse_frame(raw)
    assert info.value.offset == len(raw) - 1


@pytest.mark.parametrize("code", [b"h", b"B", b"\x00", b"\xff"])
def test_unknown_frame_type(code: bytes) -> None:
    with pytest.raises(UnknownMessageType) as info:
        parse_frame(code + bytes(40))
    assert f"0x{code[0]:02x}" in str(info.value)
    assert isinstance(info.value, ProtocolError)
