"""Malformed and out-of-place pgoutput messages: which `ProtocolError` subclass each raises, what
its text says (message type, byte offset, LSN, hex excerpt), and that a failed message leaves the
decoder's state exactly as it was."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from pgcdc.errors import (
    ColumnCountMismatch,
    InvalidMessage,
    PgcdcError,
    ProtocolError,
    TruncatedMessage,
    UnexpectedMessage,
    UnknownMessageType,
    UnknownRelation,
)
from pgcdc.protocol import Decoder, Lsn, encode

# -- wire helpers (independent of pgcdc) ---------------------------------------------------------

ERROR_LSN = Lsn("16/B374D848")


def u8(value: int) -> bytes:
    return struct.pack(">B", value)


def u16(value: int) -> bytes:
    return struct.pack(">H", value)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def text(value: bytes) -> bytes:
    return b"t" + u32(len(value)) + value


def tuple_data(*columns: bytes) -> bytes:
    return u16(len(columns)) + b"".join(columns)


def column(flags: int, name: str, type_oid: int = 25, typmod: int = -1) -> bytes:
    return u8(flags) + cstring(name) + u32(type_oid) + struct.pack(">i", typmod)


REL_ID = 16390
XID = 700
SUBXID = 701
RELATION = (
    b"R"
    + u32(REL_ID)
    + cstring("public")
    + cstring("users")
    + b"d"
    + u16(2)
    + column(1, "id", 23)
    + column(0, "name")
)
STREAM_START = b"S" + u32(XID) + u8(1)
BEGIN = b"B" + u64(0x100) + i64(5) + u32(XID)
COMMIT = b"C" + u8(0) + u64(0x100) + u64(0x128) + i64(5)
STREAM_COMMIT = b"c" + u32(XID) + u8(0) + u64(0x100) + u64(0x128) + i64(5)
STREAM_ABORT = b"A" + u32(XID) + u32(SUBXID)
STREAM_ABORT_PARALLEL = STREAM_ABORT + u64(0x200) + i64(6)
BEGIN_PREPARE = b"b" + u64(0x100) + u64(0x128) + i64(5) + u32(XID) + cstring("gid-1")
PREPARE = b"P" + u8(0) + u64(0x100) + u64(0x128) + i64(5) + u32(XID) + cstring("gid-1")
COMMIT_PREPARED = b"K" + u8(0) + u64(0x300) + u64(0x328) + i64(7) + u32(XID) + cstring("gid-1")
ROLLBACK_PREPARED = (
    b"r" + u8(0) + u64(0x128) + u64(0x328) + i64(5) + i64(7) + u32(XID) + cstring("gid-1")
)
STREAM_PREPARE = b"p" + u8(0) + u64(0x100) + u64(0x128) + i64(5) + u32(XID) + cstring("gid-1")
INSERT_BODY = u32(REL_ID) + b"N" + tuple_data(text(b"1"), text(b"ann"))
UPDATE_BODY = u32(REL_ID) + b"O" + tuple_data(text(b"1"), b"n") + b"N" + tuple_data(b"n", b"u")
DELETE_BODY = u32(REL_ID) + b"K" + tuple_data(text(b"1"), b"n")
TRUNCATE_BODY = u32(2) + u8(3) + u32(REL_ID) + u32(16400)
MESSAGE_BODY = u8(1) + u64(0x150) + cstring("pfx") + u32(4) + b"\x00ab\x00"
TYPE_BODY = u32(16500) + cstring("public") + cstring("mood")


@dataclass(frozen=True)
class Case:
    """A valid message, the session that can receive it, and what must be decoded before it."""

    name: str  # as it appears in error messages: "Insert" -> "Insert message"
    raw: bytes
    proto: int = 1
    streaming: str = "off"
    setup: tuple[bytes, ...] = ()

    def decoder(self, *, strict: bool = True) -> Decoder:
        decoder = Decoder(self.proto, self.streaming, strict=strict)
        for raw in self.setup:
            decoder.decode(raw)
        return decoder


IN_STREAM = {"proto": 2, "streaming": "on", "setup": (RELATION, STREAM_START)}

CASES = [
    Case("Begin", BEGIN),
    Case("Commit", COMMIT),
    Case("Origin", b"O" + u64(0x99) + cstring("origin_1")),
    Case("Relation", RELATION),
    Case("Relation", b"R" + u32(SUBXID) + RELATION[1:], **IN_STREAM),
    Case("Type", b"Y" + TYPE_BODY),
    Case("Type", b"Y" + u32(SUBXID) + TYPE_BODY, **IN_STREAM),
    Case("Insert", b"I" + INSERT_BODY, setup=(RELATION,)),
    Case("Insert", b"I" + u32(SUBXID) + INSERT_BODY, **IN_STREAM),
    Case("Update", b"U" + u32(REL_ID) + b"N" + tuple_data(text(b"2"), b"u"), setup=(RELATION,)),
    Case("Update", b"U" + UPDATE_BODY, setup=(RELATION,)),
    Case("Update", b"U" + u32(XID) + UPDATE_BODY, **IN_STREAM),
    Case("Delete", b"D" + DELETE_BODY, setup=(RELATION,)),
    Case("Delete", b"D" + u32(XID) + DELETE_BODY, **IN_STREAM),
    Case("Truncate", b"T" + TRUNCATE_BODY),
    Case("Truncate", b"T" + u32(SUBXID) + TRUNCATE_BODY, **IN_STREAM),
    Case("Message", b"M" + MESSAGE_BODY, proto=2),
    Case("Message", b"M" + u32(XID) + MESSAGE_BODY, **IN_STREAM),
    Case("Stream Start", STREAM_START, proto=2, streaming="on"),
    Case("Stream Commit", STREAM_COMMIT, proto=2, streaming="on"),
    Case("Stream Abort", STREAM_ABORT, proto=4, streaming="on"),
    Case("Stream Abort", STREAM_ABORT_PARALLEL, proto=4, streaming="parallel"),
    Case("Begin Prepare", BEGIN_PREPARE, proto=3),
    Case("Prepare", PREPARE, proto=3),
    Case("Commit Prepared", COMMIT_PREPARED, proto=3),
    Case("Rollback Prepared", ROLLBACK_PREPARED, proto=3),
    Case("Stream Prepare", STREAM_PREPARE, proto=3, streaming="on"),
]
CASE_IDS = [f"{c.name}-{'stream' if STREAM_START in c.setup else c.proto}" for c in CASES]


def state(decoder: Decoder) -> tuple:
    """Everything a failed decode must leave untouched."""
    return (
        {relid: id(rel) for relid, rel in decoder.relations.items()},
        {oid: id(t) for oid, t in decoder.types.items()},
        decoder.stream_xid,
    )


def test_catalogue_is_valid() -> None:
    """The messages the error tests cut up decode cleanly and round-trip as they are."""
    for case in CASES:
        message = case.decoder().decode(case.raw)
        assert encode(message) == case.raw, case


# -- truncation and trailing bytes ---------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_truncation_is_reported_and_leaves_state_alone(case: Case) -> None:
    decoder = case.decoder()
    before = state(decoder)

    for cut in range(1, len(case.raw)):
        prefix = case.raw[:cut]
        with pytest.raises(TruncatedMessage) as info:
            decoder.decode(prefix, lsn=ERROR_LSN)
        error = info.value
        assert isinstance(error, ProtocolError) and isinstance(error, PgcdcError)
        assert error.message_type == case.name
        assert error.offset == cut
        assert error.lsn == ERROR_LSN
        rendered = str(error)
        assert f"{case.name} message" in rendered
        assert f"byte {cut}" in rendered
        assert "LSN 16/B374D848" in rendered
        assert rendered.endswith(f"{prefix[-1]:02x} [end]")
        assert state(decoder) == before, f"state changed after a {cut}-byte prefix"

    # The decoder still decodes the complete message afterwards.
    assert encode(decoder.decode(case.raw)) == case.raw


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("extra", [b"\x00", b"N\x00\x00"])
def test_trailing_bytes_are_invalid(case: Case, extra: bytes) -> None:
    decoder = case.decoder()
    before = state(decoder)

    with pytest.raises(InvalidMessage, match=f"{len(extra)} trailing bytes") as info:
        decoder.decode(case.raw + extra, lsn=ERROR_LSN)

    assert info.value.offset == len(case.raw)
    assert f"{case.name} message, byte {len(case.raw)}, LSN 16/B374D848" in str(info.value)
    assert state(decoder) == before


def test_stream_stop_with_trailing_byte_keeps_stream_open() -> None:
    decoder = Decoder(2, "on")
    decoder.decode(STREAM_START)

    with pytest.raises(InvalidMessage, match="1 trailing bytes"):
        decoder.decode(b"E\x00")

    assert decoder.stream_xid == XID


def test_error_without_lsn_does_not_mention_one() -> None:
    with pytest.raises(TruncatedMessage) as info:
        Decoder().decode(BEGIN[:10])

    assert info.value.lsn is None
    assert "LSN" not in str(info.value)
    assert "(Begin message, byte 10)" in str(info.value)


# -- unknown and unnegotiated message types ------------------------------------------------------


@pytest.mark.parametrize("code", [b"Z", b"\x00", b"\xff", b"w", b"k", b"x"])
def test_unknown_message_type(code: bytes) -> None:
    with pytest.raises(UnknownMessageType) as info:
        Decoder(4, "parallel").decode(code + bytes(20), lsn=ERROR_LSN)

    rendered = str(info.value)
    assert f"0x{code[0]:02x}" in rendered
    assert "byte 0" in rendered and "LSN 16/B374D848" in rendered
    assert f"[{code[0]:02x}]" in rendered
    assert info.value.offset == 0


STREAM_ONLY = [
    ("Stream Start", STREAM_START),
    ("Stream Stop", b"E"),
    ("Stream Commit", STREAM_COMMIT),
    ("Stream Abort", STREAM_ABORT),
    ("Stream Prepare", STREAM_PREPARE),
]


@pytest.mark.parametrize("proto", [1, 2, 3, 4])
@pytest.mark.parametrize(("name", "raw"), STREAM_ONLY, ids=[n for n, _ in STREAM_ONLY])
def test_stream_messages_need_streaming(proto: int, name: str, raw: bytes) -> None:
    with pytest.raises(UnexpectedMessage, match="streaming was not negotiated") as info:
        Decoder(proto, "off").decode(raw, lsn=ERROR_LSN)

    assert f"{name} message" in str(info.value)
    assert info.value.offset == 0


TWO_PHASE_ONLY = [
    ("Begin Prepare", BEGIN_PREPARE),
    ("Prepare", PREPARE),
    ("Commit Prepared", COMMIT_PREPARED),
    ("Rollback Prepared", ROLLBACK_PREPARED),
    ("Stream Prepare", STREAM_PREPARE),
]


@pytest.mark.parametrize(("proto", "streaming"), [(1, "off"), (2, "off"), (2, "on")])
@pytest.mark.parametrize(("name", "raw"), TWO_PHASE_ONLY, ids=[n for n, _ in TWO_PHASE_ONLY])
def test_two_phase_messages_need_proto_3(proto: int, streaming: str, name: str, raw: bytes) -> None:
    with pytest.raises(UnexpectedMessage) as info:
        Decoder(proto, streaming).decode(raw)

    assert f"{name} message" in str(info.value)


def test_stream_prepare_needs_streaming_even_with_proto_3() -> None:
    with pytest.raises(UnexpectedMessage, match="streaming was not negotiated"):
        Decoder(3, "off").decode(STREAM_PREPARE)


# -- stream block state --------------------------------------------------------------------------


def test_stream_stop_outside_a_stream() -> None:
    decoder = Decoder(2, "on")

    with pytest.raises(UnexpectedMessage, match="without a Stream Start") as info:
        decoder.decode(b"E")

    assert "Stream Stop message" in str(info.value)
    assert decoder.stream_xid is None


def test_stream_start_inside_a_stream() -> None:
    decoder = Decoder(2, "on")
    decoder.decode(STREAM_START)

    with pytest.raises(UnexpectedMessage, match=f"inside the stream block of xid {XID}"):
        decoder.decode(b"S" + u32(999) + u8(0))

    assert decoder.stream_xid == XID


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("Begin", BEGIN),
        ("Commit", COMMIT),
        ("Stream Commit", STREAM_COMMIT),
        ("Stream Abort", STREAM_ABORT),
        ("Stream Prepare", STREAM_PREPARE),
        ("Begin Prepare", BEGIN_PREPARE),
        ("Prepare", PREPARE),
        ("Commit Prepared", COMMIT_PREPARED),
        ("Rollback Prepared", ROLLBACK_PREPARED),
    ],
)
def test_transaction_boundaries_inside_a_stream(name: str, raw: bytes) -> None:
    decoder = Decoder(3, "on")
    decoder.decode(STREAM_START)

    with pytest.raises(UnexpectedMessage) as info:
        decoder.decode(raw, lsn=ERROR_LSN)

    assert f"{name} message, byte 0, LSN 16/B374D848" in str(info.value)
    assert decoder.stream_xid == XID


def test_truncated_stream_start_does_not_open_a_stream() -> None:
    decoder = Decoder(2, "on")
    decoder.decode(RELATION)

    with pytest.raises(TruncatedMessage):
        decoder.decode(STREAM_START[:5])

    assert not decoder.in_stream
    # An Insert without an xid prefix is still read as one.
    assert decoder.decode(b"I" + INSERT_BODY).xid is None


def test_stream_start_with_trailing_byte_does_not_open_a_stream() -> None:
    decoder = Decoder(2, "on")

    with pytest.raises(InvalidMessage):
        decoder.decode(STREAM_START + b"\x00")

    assert decoder.stream_xid is None


def test_stream_start_first_segment_must_be_boolean() -> None:
    decoder = Decoder(2, "on")

    with pytest.raises(InvalidMessage, match="first_segment") as info:
        decoder.decode(b"S" + u32(XID) + u8(2))

    assert info.value.offset == 5
    assert decoder.stream_xid is None


# -- relations and tuples ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"I" + u32(999) + b"N" + tuple_data(b"n"),
        b"U" + u32(999) + b"N" + tuple_data(b"n"),
        b"D" + u32(999) + b"K" + tuple_data(b"n"),
    ],
    ids=["Insert", "Update", "Delete"],
)
@pytest.mark.parametrize("in_stream", [False, True])
def test_change_for_an_undescribed_relation(body: bytes, in_stream: bool) -> None:
    decoder = Decoder(2, "on")
    decoder.decode(RELATION)
    raw = body
    if in_stream:
        decoder.decode(STREAM_START)
        raw = body[:1] + u32(SUBXID) + body[1:]

    with pytest.raises(UnknownRelation, match="relation id 999") as info:
        decoder.decode(raw, lsn=ERROR_LSN)

    offset = 5 if in_stream else 1
    assert info.value.offset == offset
    names = {"I": "Insert", "U": "Update", "D": "Delete"}
    assert f"{names[chr(body[0])]} message, byte {offset}, LSN 16/B374D848" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "offset"),
    [
        (b"I" + u32(REL_ID) + b"N" + tuple_data(b"n", b"n", b"n"), 6),
        (b"I" + u32(REL_ID) + b"N" + tuple_data(b"n"), 6),
        (b"I" + u32(REL_ID) + b"N" + tuple_data(), 6),
        (b"U" + u32(REL_ID) + b"K" + tuple_data(b"n") + b"N" + tuple_data(b"n", b"n"), 6),
        (b"U" + u32(REL_ID) + b"O" + tuple_data(b"n", b"n") + b"N" + tuple_data(b"n"), 11),
        (b"D" + u32(REL_ID) + b"O" + tuple_data(b"n", b"n", b"n"), 6),
    ],
    ids=["insert-3", "insert-1", "insert-0", "update-old", "update-new", "delete"],
)
def test_tuple_column_count_must_match_relation(raw: bytes, offset: int) -> None:
    decoder = Decoder()
    decoder.decode(RELATION)

    with pytest.raises(ColumnCountMismatch, match=r"public\.users \(id 16390\) has 2") as info:
        decoder.decode(raw)

    assert info.value.offset == offset
    assert f"byte {offset}" in str(info.value)


def test_column_count_follows_the_latest_relation() -> None:
    decoder = Decoder()
    decoder.decode(RELATION)
    decoder.decode(b"R" + u32(REL_ID) + cstring("public") + cstring("users") + b"d" + u16(0))

    with pytest.raises(ColumnCountMismatch):
        decoder.decode(b"I" + u32(REL_ID) + b"N" + tuple_data(b"n", b"n"))
    assert decoder.decode(b"I" + u32(REL_ID) + b"N" + tuple_data()).new.kinds == b""


@pytest.mark.parametrize("kind", [b"x", b"N", b"T", b"\x00"])
def test_invalid_column_kind(kind: bytes) -> None:
    decoder = Decoder()
    decoder.decode(RELATION)
    raw = b"I" + u32(REL_ID) + b"N" + tuple_data(text(b"1"), kind)

    with pytest.raises(InvalidMessage, match="invalid column kind") as info:
        decoder.decode(raw)

    assert info.value.offset == 14  # after I, relid, N, ncols and the 't' + length + '1' column
    assert f"[{kind[0]:02x}]" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "offset"),
    [
        (b"I" + u32(REL_ID) + b"K" + tuple_data(b"n", b"n"), 5),
        (b"U" + u32(REL_ID) + b"X" + tuple_data(b"n", b"n"), 5),
        (b"U" + u32(REL_ID) + b"K" + tuple_data(b"n", b"n") + b"K" + tuple_data(b"n", b"n"), 10),
        (b"D" + u32(REL_ID) + b"N" + tuple_data(b"n", b"n"), 5),
    ],
    ids=["insert-K", "update-X", "update-K-then-K", "delete-N"],
)
def test_invalid_tuple_marker(raw: bytes, offset: int) -> None:
    decoder = Decoder()
    decoder.decode(RELATION)

    with pytest.raises(InvalidMessage, match=r"tuple marker|before the new tuple") as info:
        decoder.decode(raw)

    assert info.value.offset == offset


# -- reserved flags and strictness ---------------------------------------------------------------


@dataclass(frozen=True)
class FlagCase:
    raw: bytes
    offset: int
    field: str
    value: object
    proto: int = 1
    streaming: str = "off"


FLAG_CASES = {
    "commit-flags": FlagCase(b"C" + u8(1) + COMMIT[2:], 1, "flags", 1),
    "stream-commit-flags": FlagCase(
        STREAM_COMMIT[:5] + u8(0x80) + STREAM_COMMIT[6:], 5, "flags", 0x80, 2, "on"
    ),
    "prepare-flags": FlagCase(b"P" + u8(2) + PREPARE[2:], 1, "flags", 2, 3),
    "commit-prepared-flags": FlagCase(b"K" + u8(4) + COMMIT_PREPARED[2:], 1, "flags", 4, 3),
    "rollback-prepared-flags": FlagCase(
        b"r" + u8(0xFF) + ROLLBACK_PREPARED[2:], 1, "flags", 0xFF, 3
    ),
    "stream-prepare-flags": FlagCase(b"p" + u8(1) + STREAM_PREPARE[2:], 1, "flags", 1, 3, "on"),
    "truncate-options": FlagCase(b"T" + u32(1) + u8(4) + u32(REL_ID), 5, "options", 4),
    "message-flags": FlagCase(b"M" + u8(3) + MESSAGE_BODY[1:], 1, "flags", 3),
    "replica-identity": FlagCase(
        b"R" + u32(1) + cstring("s") + cstring("t") + b"x" + u16(0), 9, "replica_identity", "x"
    ),
}


@pytest.mark.parametrize("case", FLAG_CASES.values(), ids=FLAG_CASES.keys())
def test_nonzero_reserved_bits_rejected_in_strict_mode(case: FlagCase) -> None:
    with pytest.raises(InvalidMessage) as info:
        Decoder(case.proto, case.streaming).decode(case.raw)

    assert info.value.offset == case.offset
    assert f"[{case.raw[case.offset]:02x}]" in str(info.value)


@pytest.mark.parametrize("case", FLAG_CASES.values(), ids=FLAG_CASES.keys())
def test_nonzero_reserved_bits_kept_when_not_strict(case: FlagCase) -> None:
    message = Decoder(case.proto, case.streaming, strict=False).decode(case.raw)

    assert getattr(message, case.field) == case.value
    assert encode(message) == case.raw


def test_column_flags_beyond_the_key_bit() -> None:
    raw = b"R" + u32(1) + cstring("s") + cstring("t") + b"d" + u16(1) + column(0x03, "c")

    with pytest.raises(InvalidMessage, match="column flags") as info:
        Decoder().decode(raw)
    assert info.value.offset == 12

    message = Decoder(strict=False).decode(raw)
    assert message.columns[0].flags == 3 and message.columns[0].is_key
    assert encode(message) == raw


@pytest.mark.parametrize("identity", [b"\x00", b"D", b"\x7f", b"\x80", b"\xe9", b"\xff"])
def test_any_replica_identity_byte_round_trips_when_not_strict(identity: bytes) -> None:
    # Regression: a byte >= 0x80 used to become a 1-char str that encode() wrote as 2 UTF-8
    # bytes (struct.error). Fixed in c62d1e0 (encoded as latin-1).
    raw = b"R" + u32(1) + cstring("s") + cstring("t") + identity + u16(0)

    message = Decoder(strict=False).decode(raw)

    assert ord(message.replica_identity) == identity[0]
    assert encode(message) == raw


# -- text fields ---------------------------------------------------------------------------------

BAD_UTF8 = b"ab\xc3("  # a lead byte followed by a non-continuation byte, at offset +2
BAD_COLUMN_NAME = (
    b"R" + u32(1) + cstring("s") + cstring("t") + b"d" + u16(1) + u8(0) + b"\xff\x00" + u32(25)
) + struct.pack(">i", -1)


@pytest.mark.parametrize(
    ("name", "raw", "offset", "proto"),
    [
        ("Origin", b"O" + u64(1) + BAD_UTF8 + b"\x00", 11, 1),
        ("Relation", b"R" + u32(1) + BAD_UTF8 + b"\x00" + cstring("t") + b"d" + u16(0), 7, 1),
        ("Relation", b"R" + u32(1) + cstring("s") + BAD_UTF8 + b"\x00" + b"d" + u16(0), 9, 1),
        ("Relation", BAD_COLUMN_NAME, 13, 1),
        ("Type", b"Y" + u32(1) + BAD_UTF8 + b"\x00" + cstring("t"), 7, 1),
        ("Type", b"Y" + u32(1) + cstring("") + BAD_UTF8 + b"\x00", 8, 1),
        ("Message", b"M" + u8(0) + u64(1) + BAD_UTF8 + b"\x00" + u32(0), 12, 1),
        ("Begin Prepare", BEGIN_PREPARE[:29] + BAD_UTF8 + b"\x00", 31, 3),
        ("Prepare", PREPARE[:30] + BAD_UTF8 + b"\x00", 32, 3),
        ("Commit Prepared", COMMIT_PREPARED[:30] + BAD_UTF8 + b"\x00", 32, 3),
        ("Rollback Prepared", ROLLBACK_PREPARED[:38] + BAD_UTF8 + b"\x00", 40, 3),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_names_must_be_utf8(name: str, raw: bytes, offset: int, proto: int, strict: bool) -> None:
    with pytest.raises(InvalidMessage, match="not valid UTF-8") as info:
        Decoder(proto, strict=strict).decode(raw, lsn=ERROR_LSN)

    assert info.value.offset == offset
    assert f"{name} message, byte {offset}, LSN 16/B374D848" in str(info.value)
    assert f"[{raw[offset]:02x}]" in str(info.value)


# -- a failed message changes nothing ------------------------------------------------------------


def test_failed_relation_does_not_touch_the_cache() -> None:
    decoder = Decoder()
    first = decoder.decode(RELATION)
    replacement = (
        b"R" + u32(REL_ID) + cstring("public") + cstring("users") + b"d" + u16(1) + column(1, "id")
    )

    identity = 1 + 4 + len(b"public\0users\0")
    assert replacement[identity : identity + 1] == b"d"
    bad_identity = replacement[:identity] + b"z" + replacement[identity + 1 :]

    for bad in (replacement[:-1], replacement + b"\x00", bad_identity):
        with pytest.raises(ProtocolError):
            decoder.decode(bad)
        assert decoder.relations == {REL_ID: first}
        assert decoder.relations[REL_ID] is first

    with pytest.raises(TruncatedMessage):
        decoder.decode(b"R" + u32(555) + cstring("public"))
    assert 555 not in decoder.relations
    # Tuples are still checked against the original two-column relation.
    assert len(decoder.decode(b"I" + INSERT_BODY).new) == 2


def test_failed_type_does_not_touch_the_cache() -> None:
    decoder = Decoder()

    with pytest.raises(TruncatedMessage):
        decoder.decode((b"Y" + TYPE_BODY)[:-1])
    with pytest.raises(InvalidMessage):
        decoder.decode(b"Y" + TYPE_BODY + b"\x00")

    assert decoder.types == {}


# -- decoder construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("proto", "streaming"),
    [(0, "off"), (5, "off"), (1, "on"), (1, True), (3, "parallel"), (2, "sometimes")],
)
def test_decoder_rejects_impossible_sessions(proto: int, streaming: object) -> None:
    with pytest.raises(ValueError):
        Decoder(proto, streaming)
