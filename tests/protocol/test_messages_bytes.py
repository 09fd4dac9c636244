"""Every pgoutput message type, built byte by byte from the protocol reference (§5) with
`struct.pack` (never with pgcdc's encoder), decoded with the session settings the message needs,
every field checked, and re-encoded to exactly the original bytes.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

import pytest

from pgcdc.errors import InvalidMessage, TruncatedMessage
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    Lsn,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    encode,
)

# -- wire helpers (independent of pgcdc) ---------------------------------------------------------

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
COMMIT_DT = datetime(2024, 5, 1, 12, 34, 56, 789012, tzinfo=UTC)
COMMIT_TS = (COMMIT_DT - PG_EPOCH) // timedelta(microseconds=1)
BEFORE_2000_TS = -86_400_000_000  # 1999-12-31 00:00 UTC: timestamps are signed

LSN_A = 0x16_B374D848  # 16/B374D848
LSN_B = 0xFFFF_FFF0_B374_D8A0  # LSNs are unsigned: these two have the top bit set
LSN_C = 0x8000_0017_0000_0010

ALL_SESSIONS = [
    (1, "off"),
    (2, "off"),
    (2, "on"),
    (3, "off"),
    (3, "on"),
    (4, "off"),
    (4, "on"),
    (4, "parallel"),
]


def u8(value: int) -> bytes:
    return struct.pack(">B", value)


def u16(value: int) -> bytes:
    return struct.pack(">H", value)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


NULL = b"n"
TOAST = b"u"


def text(value: bytes) -> bytes:
    return b"t" + u32(len(value)) + value


def binary(value: bytes) -> bytes:
    return b"b" + u32(len(value)) + value


def tuple_data(*columns: bytes) -> bytes:
    return u16(len(columns)) + b"".join(columns)


def column(flags: int, name: str, type_oid: int, typmod: int) -> bytes:
    return u8(flags) + cstring(name) + u32(type_oid) + i32(typmod)


def decode_exact(decoder: Decoder, raw: bytes):
    """Decode `raw` and check that the encoder gives back exactly the same bytes."""
    message = decoder.decode(raw)
    assert message is not None
    assert encode(message) == raw
    return message


# A two-column relation (id int4 key, name text) used by the DML tests.
REL_ID = 16390
USERS_RELATION = (
    b"R"
    + u32(REL_ID)
    + cstring("public")
    + cstring("users")
    + b"d"
    + u16(2)
    + column(1, "id", 23, -1)
    + column(0, "name", 25, -1)
)


def users_decoder(proto: int = 1, streaming: str = "off") -> Decoder:
    decoder = Decoder(proto, streaming)
    decoder.decode(USERS_RELATION)
    return decoder


# -- transaction control -------------------------------------------------------------------------


@pytest.mark.parametrize(("proto", "streaming"), ALL_SESSIONS)
def test_begin(proto: int, streaming: str) -> None:
    raw = struct.pack(">cQqI", b"B", LSN_A, COMMIT_TS, 0xFFFF_FFF0)
    assert len(raw) == 21

    message = decode_exact(Decoder(proto, streaming), raw)

    assert message == Begin(final_lsn=Lsn("16/B374D848"), commit_ts=COMMIT_TS, xid=0xFFFF_FFF0)
    assert type(message.final_lsn) is Lsn
    assert message.commit_time == COMMIT_DT


def test_commit() -> None:
    raw = b"C" + u8(0) + u64(LSN_A) + u64(LSN_B) + struct.pack(">q", BEFORE_2000_TS)
    assert len(raw) == 26

    message = decode_exact(Decoder(), raw)

    assert message == Commit(
        commit_lsn=Lsn(LSN_A), end_lsn=Lsn(LSN_B), commit_ts=BEFORE_2000_TS, flags=0
    )
    assert type(message.commit_lsn) is Lsn and type(message.end_lsn) is Lsn
    assert str(message.end_lsn) == "FFFFFFF0/B374D8A0"
    assert message.commit_time == datetime(1999, 12, 31, tzinfo=UTC)


@pytest.mark.parametrize("name", ["pg_16402", "", "orígen-ß"])
def test_origin(name: str) -> None:
    raw = b"O" + u64(LSN_C) + cstring(name)

    message = decode_exact(Decoder(), raw)

    assert message == Origin(origin_lsn=Lsn("80000017/10"), origin_name=name)
    assert type(message.origin_lsn) is Lsn


# -- schema --------------------------------------------------------------------------------------


def test_relation_every_field() -> None:
    raw = (
        b"R"
        + u32(0x8000_0001)  # OIDs are unsigned
        + cstring("public")
        + cstring("orders")
        + b"d"
        + u16(3)
        + column(1, "id", 23, -1)
        + column(0, "label", 1043, 68)  # varchar(64): typmod 64 + 4
        + column(0, "doc", 0xFFFF_FF00, -1)
    )

    decoder = Decoder()
    message = decode_exact(decoder, raw)

    assert message == Relation(
        relid=0x8000_0001,
        namespace="public",
        relname="orders",
        replica_identity="d",
        columns=(
            Column(flags=1, name="id", type_oid=23, type_modifier=-1),
            Column(flags=0, name="label", type_oid=1043, type_modifier=68),
            Column(flags=0, name="doc", type_oid=0xFFFF_FF00, type_modifier=-1),
        ),
        xid=None,
    )
    assert message.schema == "public"
    assert [c.name for c in message.key_columns] == ["id"]
    assert [c.is_key for c in message.columns] == [True, False, False]
    assert decoder.relations[0x8000_0001] is message


def test_relation_empty_namespace_is_pg_catalog() -> None:
    raw = b"R" + u32(1259) + cstring("") + cstring("pg_class") + b"n" + u16(0)

    message = decode_exact(Decoder(), raw)

    assert message.namespace == ""
    assert message.schema == "pg_catalog"
    assert message.relname == "pg_class"
    assert message.columns == ()


@pytest.mark.parametrize(
    ("identity", "key_flags"),
    [("d", (1, 0)), ("n", (0, 0)), ("f", (1, 1)), ("i", (0, 1))],
)
def test_relation_replica_identities(identity: str, key_flags: tuple[int, int]) -> None:
    raw = (
        b"R"
        + u32(16400)
        + cstring("sales")
        + cstring("línea")
        + identity.encode()
        + u16(2)
        + column(key_flags[0], "a", 23, -1)
        + column(key_flags[1], "b", 25, -1)
    )

    message = decode_exact(Decoder(), raw)

    assert message.replica_identity == identity
    assert message.relname == "línea"
    assert tuple(c.flags for c in message.columns) == key_flags
    assert len(message.key_columns) == sum(key_flags)


def test_relation_is_an_upsert_into_the_cache() -> None:
    decoder = users_decoder()
    wider = (
        b"R"
        + u32(REL_ID)
        + cstring("public")
        + cstring("users")
        + b"f"
        + u16(3)
        + column(1, "id", 23, -1)
        + column(1, "name", 25, -1)
        + column(1, "email", 25, -1)
    )

    decode_exact(decoder, wider)

    assert len(decoder.relations[REL_ID].columns) == 3
    insert = decode_exact(decoder, b"I" + u32(REL_ID) + b"N" + tuple_data(NULL, NULL, NULL))
    assert len(insert.new) == 3


@pytest.mark.parametrize(("namespace", "schema"), [("public", "public"), ("", "pg_catalog")])
def test_type(namespace: str, schema: str) -> None:
    raw = b"Y" + u32(16500) + cstring(namespace) + cstring("mood")

    decoder = Decoder()
    message = decode_exact(decoder, raw)

    assert message == Type(type_oid=16500, namespace=namespace, name="mood", xid=None)
    assert message.schema == schema
    assert decoder.types[16500] is message


# -- DML -----------------------------------------------------------------------------------------


def test_insert_with_every_column_kind_and_zero_length_values() -> None:
    relation = b"R" + u32(16410) + cstring("public") + cstring("kinds") + b"d" + u16(6)
    for i in range(6):
        relation += column(1 if i == 0 else 0, f"c{i}", 25, -1)
    raw = (
        b"I"
        + u32(16410)
        + b"N"
        + tuple_data(
            text(b"42"),
            NULL,
            TOAST,
            binary(b"\x00\x01\x00\xff"),
            text(b""),
            binary(b""),
        )
    )
    decoder = Decoder(2)
    decoder.decode(relation)

    message = decode_exact(decoder, raw)

    assert message == Insert(
        relid=16410,
        new=TupleData(
            kinds=b"tnubtb",
            values=(b"42", None, None, b"\x00\x01\x00\xff", b"", b""),
        ),
        xid=None,
    )
    new = message.new
    assert len(new) == 6
    assert [new.kind(i) for i in range(6)] == ["t", "n", "u", "b", "t", "b"]
    assert new.is_null(1) and not new.is_null(4)
    assert new.is_unchanged_toast(2) and not new.is_unchanged_toast(1)
    assert new.unchanged_toast_columns == (2,)
    assert new.text(0) == "42"
    assert new.text(4) == ""
    assert new.text(1) is None


def test_insert_text_value_is_utf8() -> None:
    raw = b"I" + u32(REL_ID) + b"N" + tuple_data(text(b"7"), text("Zoë 名前".encode()))

    message = decode_exact(users_decoder(), raw)

    assert message.new.text(1) == "Zoë 名前"
    assert message.new.values[1] == "Zoë 名前".encode()


def test_update_without_old_tuple() -> None:
    raw = b"U" + u32(REL_ID) + b"N" + tuple_data(text(b"1"), TOAST)

    message = decode_exact(users_decoder(), raw)

    assert message == Update(
        relid=REL_ID,
        old_kind=None,
        old=None,
        new=TupleData(kinds=b"tu", values=(b"1", None)),
        xid=None,
    )


def test_update_with_old_key() -> None:
    raw = (
        b"U"
        + u32(REL_ID)
        + b"K"
        + tuple_data(text(b"1"), NULL)  # non-key column is an 'n' filler
        + b"N"
        + tuple_data(text(b"2"), text(b"bob"))
    )

    message = decode_exact(users_decoder(), raw)

    assert message == Update(
        relid=REL_ID,
        old_kind="K",
        old=TupleData(kinds=b"tn", values=(b"1", None)),
        new=TupleData(kinds=b"tt", values=(b"2", b"bob")),
        xid=None,
    )


def test_update_with_old_row() -> None:
    raw = (
        b"U"
        + u32(REL_ID)
        + b"O"
        + tuple_data(text(b"1"), text(b"al"))
        + b"N"
        + tuple_data(text(b"1"), NULL)
    )

    message = decode_exact(users_decoder(), raw)

    assert message.old_kind == "O"
    assert message.old == TupleData(kinds=b"tt", values=(b"1", b"al"))
    assert message.new == TupleData(kinds=b"tn", values=(b"1", None))


@pytest.mark.parametrize("old_kind", ["K", "O"])
def test_delete(old_kind: str) -> None:
    old = tuple_data(text(b"9"), NULL if old_kind == "K" else text(b"zed"))
    raw = b"D" + u32(REL_ID) + old_kind.encode() + old

    message = decode_exact(users_decoder(), raw)

    expected_old = (
        TupleData(kinds=b"tn", values=(b"9", None))
        if old_kind == "K"
        else TupleData(kinds=b"tt", values=(b"9", b"zed"))
    )
    assert message == Delete(relid=REL_ID, old_kind=old_kind, old=expected_old, xid=None)


@pytest.mark.parametrize(
    ("options", "cascade", "restart_identity"),
    [(0, False, False), (1, True, False), (2, False, True), (3, True, True)],
)
def test_truncate(options: int, cascade: bool, restart_identity: bool) -> None:
    relids = (16390, 16400, 0xFFFF_FFFF)
    raw = b"T" + u32(len(relids)) + u8(options) + b"".join(u32(r) for r in relids)

    message = decode_exact(Decoder(), raw)

    assert message == Truncate(options=options, relids=relids, xid=None)
    assert message.cascade is cascade
    assert message.restart_identity is restart_identity


def test_truncate_single_relation() -> None:
    raw = b"T" + u32(1) + u8(0) + u32(REL_ID)

    assert decode_exact(Decoder(), raw).relids == (REL_ID,)


# -- logical decoding messages -------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "transactional"), [(1, True), (0, False)])
def test_message(flags: int, transactional: bool) -> None:
    content = b"\x00bin\x00ary\xff\x00"
    raw = b"M" + u8(flags) + u64(LSN_A) + cstring("app/audit") + u32(len(content)) + content

    message = decode_exact(Decoder(2), raw)

    assert message == Message(
        flags=flags, lsn=Lsn(LSN_A), prefix="app/audit", content=content, xid=None
    )
    assert message.transactional is transactional
    assert type(message.lsn) is Lsn


def test_message_empty_prefix_and_content() -> None:
    raw = b"M" + u8(0) + u64(0) + cstring("") + u32(0)

    message = decode_exact(Decoder(), raw)

    assert (message.prefix, message.content, message.lsn) == ("", b"", Lsn(0))


# -- streaming -----------------------------------------------------------------------------------

STREAM_XID = 8000
SUBXID = 8001


@pytest.mark.parametrize("first_segment", [True, False])
def test_stream_start_and_stop(first_segment: bool) -> None:
    decoder = Decoder(2, "on")
    raw = b"S" + u32(0xFFFF_FFFE) + u8(int(first_segment))
    assert len(raw) == 6

    start = decode_exact(decoder, raw)

    assert start == StreamStart(xid=0xFFFF_FFFE, first_segment=first_segment)
    assert start.first_segment is first_segment
    assert decoder.in_stream and decoder.stream_xid == 0xFFFF_FFFE

    stop = decode_exact(decoder, b"E")

    assert stop == StreamStop()
    assert not decoder.in_stream and decoder.stream_xid is None


@pytest.mark.parametrize(("proto", "streaming"), [(2, "on"), (4, "parallel")])
def test_stream_commit(proto: int, streaming: str) -> None:
    raw = b"c" + u32(STREAM_XID) + u8(0) + u64(LSN_A) + u64(LSN_B) + struct.pack(">q", COMMIT_TS)
    assert len(raw) == 30

    message = decode_exact(Decoder(proto, streaming), raw)

    assert message == StreamCommit(
        xid=STREAM_XID, commit_lsn=Lsn(LSN_A), end_lsn=Lsn(LSN_B), commit_ts=COMMIT_TS, flags=0
    )
    assert message.commit_time == COMMIT_DT


@pytest.mark.parametrize(("proto", "streaming"), [(2, "on"), (3, "on"), (4, "on")])
@pytest.mark.parametrize(("subxid", "toplevel"), [(STREAM_XID, True), (SUBXID, False)])
def test_stream_abort_without_parallel_is_9_bytes(
    proto: int, streaming: str, subxid: int, toplevel: bool
) -> None:
    raw = b"A" + u32(STREAM_XID) + u32(subxid)
    assert len(raw) == 9

    message = decode_exact(Decoder(proto, streaming), raw)

    assert message == StreamAbort(xid=STREAM_XID, subxid=subxid, abort_lsn=None, abort_ts=None)
    assert message.is_toplevel is toplevel


def test_stream_abort_parallel_is_25_bytes() -> None:
    raw = b"A" + u32(STREAM_XID) + u32(SUBXID) + u64(LSN_C) + struct.pack(">q", COMMIT_TS)
    assert len(raw) == 25

    message = decode_exact(Decoder(4, "parallel"), raw)

    assert message == StreamAbort(
        xid=STREAM_XID, subxid=SUBXID, abort_lsn=Lsn(LSN_C), abort_ts=COMMIT_TS
    )
    assert type(message.abort_lsn) is Lsn
    assert not message.is_toplevel


def test_stream_abort_25_bytes_rejected_when_streaming_on() -> None:
    raw = b"A" + u32(STREAM_XID) + u32(STREAM_XID) + u64(LSN_C) + struct.pack(">q", COMMIT_TS)

    with pytest.raises(InvalidMessage, match="16 trailing bytes"):
        Decoder(4, "on").decode(raw)


def test_stream_abort_9_bytes_rejected_when_streaming_parallel() -> None:
    raw = b"A" + u32(STREAM_XID) + u32(STREAM_XID)

    with pytest.raises(TruncatedMessage):
        Decoder(4, "parallel").decode(raw)


def test_origin_after_stream_start_has_no_xid_prefix() -> None:
    decoder = Decoder(2, "on")
    decode_exact(decoder, b"S" + u32(STREAM_XID) + u8(1))

    message = decode_exact(decoder, b"O" + u64(0) + cstring("node_a"))

    assert message == Origin(origin_lsn=Lsn(0), origin_name="node_a")


# The messages that carry an xid prefix inside a stream block, as (type byte, bytes after the
# type byte and the optional xid, expected message without xid).
PREFIXED_CASES = {
    "Relation": (
        b"R",
        u32(16420) + cstring("s") + cstring("t") + b"f" + u16(1) + column(1, "k", 20, -1),
        Relation(16420, "s", "t", "f", (Column(1, "k", 20, -1),)),
    ),
    "Type": (b"Y", u32(16501) + cstring("") + cstring("int4"), Type(16501, "", "int4")),
    "Insert": (
        b"I",
        u32(REL_ID) + b"N" + tuple_data(text(b"5"), binary(b"\x00")),
        Insert(REL_ID, TupleData(b"tb", (b"5", b"\x00"))),
    ),
    "Update": (
        b"U",
        u32(REL_ID) + b"K" + tuple_data(text(b"5"), NULL) + b"N" + tuple_data(text(b"6"), TOAST),
        Update(REL_ID, "K", TupleData(b"tn", (b"5", None)), TupleData(b"tu", (b"6", None))),
    ),
    "Delete": (
        b"D",
        u32(REL_ID) + b"O" + tuple_data(text(b"5"), text(b"x")),
        Delete(REL_ID, "O", TupleData(b"tt", (b"5", b"x"))),
    ),
    "Truncate": (b"T", u32(2) + u8(1) + u32(REL_ID) + u32(16420), Truncate(1, (REL_ID, 16420))),
    "Message": (
        b"M",
        u8(1) + u64(LSN_A) + cstring("p") + u32(3) + b"a\x00b",
        Message(1, Lsn(LSN_A), "p", b"a\x00b"),
    ),
}


@pytest.mark.parametrize("case", list(PREFIXED_CASES))
@pytest.mark.parametrize("xid", [STREAM_XID, SUBXID], ids=["toplevel-xid", "subxact-xid"])
def test_xid_prefix_inside_stream_only(case: str, xid: int) -> None:
    code, body, expected = PREFIXED_CASES[case]
    decoder = users_decoder(4, "on")

    outside = decode_exact(decoder, code + body)
    decode_exact(decoder, b"S" + u32(STREAM_XID) + u8(1))
    inside = decode_exact(decoder, code + u32(xid) + body)
    decode_exact(decoder, b"E")
    after = decode_exact(decoder, code + body)

    assert outside == expected and outside.xid is None
    assert inside.xid == xid
    assert type(inside) is type(expected)
    for field in expected.__dataclass_fields__:
        if field != "xid":
            assert getattr(inside, field) == getattr(expected, field), field
    assert after == expected


def test_relation_described_inside_stream_serves_later_changes() -> None:
    decoder = Decoder(2, "on")
    decode_exact(decoder, b"S" + u32(STREAM_XID) + u8(1))
    relation = decode_exact(decoder, b"R" + u32(SUBXID) + USERS_RELATION[1:])
    insert = decode_exact(decoder, b"I" + u32(SUBXID) + u32(REL_ID) + b"N" + tuple_data(NULL, NULL))
    decode_exact(decoder, b"E")

    assert relation.xid == SUBXID and relation.relid == REL_ID
    assert insert == Insert(REL_ID, TupleData(b"nn", (None, None)), xid=SUBXID)
    # Outside the block the same relation is still known, now without an xid prefix.
    delete = decode_exact(decoder, b"D" + u32(REL_ID) + b"K" + tuple_data(text(b"1"), NULL))
    assert delete.xid is None


# -- two-phase commit ----------------------------------------------------------------------------

GID = "pgcdc-gid-Ω"


@pytest.mark.parametrize(("proto", "streaming"), [(3, "off"), (4, "parallel")])
def test_begin_prepare(proto: int, streaming: str) -> None:
    raw = struct.pack(">cQQqI", b"b", LSN_A, LSN_B, COMMIT_TS, 4242) + cstring(GID)
    assert len(raw) == 29 + len(GID.encode()) + 1

    message = decode_exact(Decoder(proto, streaming), raw)

    assert message == BeginPrepare(
        prepare_lsn=Lsn(LSN_A), end_lsn=Lsn(LSN_B), prepare_ts=COMMIT_TS, xid=4242, gid=GID
    )


def test_prepare() -> None:
    raw = struct.pack(">cBQQqI", b"P", 0, LSN_A, LSN_B, COMMIT_TS, 4242) + cstring(GID)
    assert len(raw) == 30 + len(GID.encode()) + 1

    message = decode_exact(Decoder(3), raw)

    assert message == Prepare(
        prepare_lsn=Lsn(LSN_A),
        end_lsn=Lsn(LSN_B),
        prepare_ts=COMMIT_TS,
        xid=4242,
        gid=GID,
        flags=0,
    )


def test_prepare_with_longest_gid() -> None:
    gid = "g" * 200  # GIDSIZE
    raw = struct.pack(">cBQQqI", b"P", 0, LSN_A, LSN_B, COMMIT_TS, 1) + cstring(gid)

    assert decode_exact(Decoder(3), raw).gid == gid


def test_commit_prepared() -> None:
    raw = struct.pack(">cBQQqI", b"K", 0, LSN_C, LSN_C + 0x30, COMMIT_TS, 4242) + cstring(GID)

    message = decode_exact(Decoder(4), raw)

    assert message == CommitPrepared(
        commit_lsn=Lsn(LSN_C),
        end_lsn=Lsn(LSN_C + 0x30),
        commit_ts=COMMIT_TS,
        xid=4242,
        gid=GID,
        flags=0,
    )


def test_rollback_prepared() -> None:
    head = struct.pack(">cBQQqqI", b"r", 0, LSN_B, LSN_C, COMMIT_TS, BEFORE_2000_TS, 4242)
    raw = head + cstring(GID)
    assert len(raw) == 38 + len(GID.encode()) + 1

    message = decode_exact(Decoder(3), raw)

    assert message == RollbackPrepared(
        prepare_end_lsn=Lsn(LSN_B),
        rollback_end_lsn=Lsn(LSN_C),
        prepare_ts=COMMIT_TS,
        rollback_ts=BEFORE_2000_TS,
        xid=4242,
        gid=GID,
        flags=0,
    )


@pytest.mark.parametrize(("proto", "streaming"), [(3, "on"), (4, "on"), (4, "parallel")])
def test_stream_prepare(proto: int, streaming: str) -> None:
    raw = struct.pack(">cBQQqI", b"p", 0, LSN_A, LSN_B, COMMIT_TS, STREAM_XID) + cstring(GID)

    message = decode_exact(Decoder(proto, streaming), raw)

    assert message == StreamPrepare(
        prepare_lsn=Lsn(LSN_A),
        end_lsn=Lsn(LSN_B),
        prepare_ts=COMMIT_TS,
        xid=STREAM_XID,
        gid=GID,
        flags=0,
    )


# -- a whole session -----------------------------------------------------------------------------


def test_interleaved_session_keeps_state_straight() -> None:
    """S…E chunks of a streamed xact with a complete B…C in between, then the stream commits."""
    decoder = Decoder(4, "parallel")
    script = [
        b"S" + u32(STREAM_XID) + u8(1),
        b"R" + u32(STREAM_XID) + USERS_RELATION[1:],
        b"I" + u32(SUBXID) + u32(REL_ID) + b"N" + tuple_data(text(b"1"), NULL),
        b"E",
        struct.pack(">cQqI", b"B", LSN_A, COMMIT_TS, 9000),
        b"I" + u32(REL_ID) + b"N" + tuple_data(text(b"2"), NULL),
        b"C" + u8(0) + u64(LSN_A) + u64(LSN_B) + struct.pack(">q", COMMIT_TS),
        b"S" + u32(STREAM_XID) + u8(0),
        b"D" + u32(STREAM_XID) + u32(REL_ID) + b"K" + tuple_data(text(b"1"), NULL),
        b"E",
        b"A" + u32(STREAM_XID) + u32(SUBXID) + u64(LSN_B) + struct.pack(">q", COMMIT_TS),
        b"c" + u32(STREAM_XID) + u8(0) + u64(LSN_C) + u64(LSN_C + 8) + struct.pack(">q", 0),
    ]

    decoded = [decode_exact(decoder, raw) for raw in script]

    assert [type(m).__name__ for m in decoded] == [
        "StreamStart",
        "Relation",
        "Insert",
        "StreamStop",
        "Begin",
        "Insert",
        "Commit",
        "StreamStart",
        "Delete",
        "StreamStop",
        "StreamAbort",
        "StreamCommit",
    ]
    assert [getattr(m, "xid", "-") for m in decoded[1:3]] == [STREAM_XID, SUBXID]
    assert decoded[5].xid is None
    assert decoded[8].xid == STREAM_XID
    assert decoded[10].abort_lsn == Lsn(LSN_B)
    assert not decoder.in_stream
