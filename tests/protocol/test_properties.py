"""Property tests for the pgoutput codec.

Hypothesis builds whole session scripts that a server could send for each negotiated session
(proto_version 1-4 x streaming off/on/parallel): a Relation before any change to its relid, tuples
with that Relation's column count, xid prefixes exactly inside Stream Start ... Stream Stop, Stream
Abort with abort_lsn/abort_ts exactly under ``streaming 'parallel'``, two-phase messages only from
proto 3. Each message is turned into bytes by `wire` below, written from the protocol reference
independently of pgcdc's encoder. Then:

* decoding the script with one Decoder gives back the messages, and `encode` gives back the bytes;
* every proper prefix of a message is reported as truncated;
* mutated bytes (flips, overwrites, insertions, deletions, truncations) and bytes from another
  session either decode to a message that re-encodes to exactly those bytes, or raise a
  `ProtocolError` that leaves the decoder state alone; never any other exception.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pgcdc.errors import ProtocolError, TruncatedMessage
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
    PgoutputMessage,
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
    UndecodedChanges,
    Update,
    encode,
)
from pgcdc.protocol import columns as columns_module
from pgcdc.protocol import decoder as decoder_module
from pgcdc.protocol.columns import change_frame

SESSIONS = [
    (1, "off"),
    (2, "off"),
    (2, "on"),
    (3, "off"),
    (3, "on"),
    (4, "off"),
    (4, "on"),
    (4, "parallel"),
]
SESSION_IDS = [f"v{proto}-{streaming}" for proto, streaming in SESSIONS]

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings(FAST, max_examples=60)

# -- an independent encoder, written from the reference's byte layouts ---------------------------


def _cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def _prefix(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def _tuple(data: TupleData) -> bytes:
    out = struct.pack(">H", len(data.kinds))
    for kind, value in zip(data.kinds, data.values, strict=True):
        out += bytes([kind])
        if kind in b"tb":
            out += struct.pack(">I", len(value)) + value
    return out


def wire(m: PgoutputMessage) -> bytes:
    match m:
        case Begin():
            return struct.pack(">cQqI", b"B", m.final_lsn, m.commit_ts, m.xid)
        case Commit():
            return struct.pack(">cBQQq", b"C", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)
        case Origin():
            return b"O" + struct.pack(">Q", m.origin_lsn) + _cstring(m.origin_name)
        case Relation():
            out = b"R" + _prefix(m.xid) + struct.pack(">I", m.relid)
            out += _cstring(m.namespace) + _cstring(m.relname)
            out += m.replica_identity.encode("ascii") + struct.pack(">H", len(m.columns))
            for c in m.columns:
                out += bytes([c.flags]) + _cstring(c.name)
                out += struct.pack(">Ii", c.type_oid, c.type_modifier)
            return out
        case Type():
            out = b"Y" + _prefix(m.xid) + struct.pack(">I", m.type_oid)
            return out + _cstring(m.namespace) + _cstring(m.name)
        case Insert():
            return b"I" + _prefix(m.xid) + struct.pack(">I", m.relid) + b"N" + _tuple(m.new)
        case Update():
            out = b"U" + _prefix(m.xid) + struct.pack(">I", m.relid)
            if m.old_kind is not None:
                out += m.old_kind.encode() + _tuple(m.old)
            return out + b"N" + _tuple(m.new)
        case Delete():
            out = b"D" + _prefix(m.xid) + struct.pack(">I", m.relid)
            return out + m.old_kind.encode() + _tuple(m.old)
        case Truncate():
            out = b"T" + _prefix(m.xid) + struct.pack(">IB", len(m.relids), m.options)
            return out + b"".join(struct.pack(">I", r) for r in m.relids)
        case Message():
            out = b"M" + _prefix(m.xid) + struct.pack(">BQ", m.flags, m.lsn) + _cstring(m.prefix)
            return out + struct.pack(">I", len(m.content)) + m.content
        case StreamStart():
            return struct.pack(">cIB", b"S", m.xid, 1 if m.first_segment else 0)
        case StreamStop():
            return b"E"
        case StreamCommit():
            return struct.pack(
                ">cIBQQq", b"c", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts
            )
        case StreamAbort():
            out = struct.pack(">cII", b"A", m.xid, m.subxid)
            if m.abort_lsn is not None:
                out += struct.pack(">Qq", m.abort_lsn, m.abort_ts)
            return out
        case BeginPrepare():
            head = struct.pack(">cQQqI", b"b", m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid)
            return head + _cstring(m.gid)
        case Prepare() | StreamPrepare():
            code = b"P" if isinstance(m, Prepare) else b"p"
            head = struct.pack(
                ">cBQQqI", code, m.flags, m.prepare_lsn, m.end_lsn, m.prepare_ts, m.xid
            )
            return head + _cstring(m.gid)
        case CommitPrepared():
            head = struct.pack(
                ">cBQQqI", b"K", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts, m.xid
            )
            return head + _cstring(m.gid)
        case RollbackPrepared():
            head = struct.pack(
                ">cBQQqqI",
                b"r",
                m.flags,
                m.prepare_end_lsn,
                m.rollback_end_lsn,
                m.prepare_ts,
                m.rollback_ts,
                m.xid,
            )
            return head + _cstring(m.gid)
    raise AssertionError(f"no wire layout for {m!r}")


# -- strategies ----------------------------------------------------------------------------------

u32s = st.integers(0, 2**32 - 1) | st.sampled_from([2**31, 2**32 - 1])
i32s = st.integers(-(2**31), 2**31 - 1) | st.just(-1)
# Explicit edge values: unsigned 64-bit LSNs and signed timestamps at both ends of their range.
lsns = (st.integers(0, 2**64 - 1) | st.sampled_from([0, 2**63, 2**64 - 1])).map(Lsn)
timestamps = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63), -1, 2**63 - 1])
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10)
gids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
column_values = st.just(b"") | st.binary(max_size=12)
# A few relids that repeat, so Relation messages also replace cached entries.
RELIDS = st.one_of(st.sampled_from([16384, 16385, 16386]), u32s)


COLUMN_VALUES = {
    "n": st.just((b"n", None)),
    "u": st.just((b"u", None)),
    "t": st.tuples(st.just(b"t"), column_values),
    "b": st.tuples(st.just(b"b"), column_values),
}


def _to_tuple(columns: list[tuple[bytes, bytes | None]]) -> TupleData:
    return TupleData(b"".join(k for k, _ in columns), tuple(v for _, v in columns))


@functools.cache
def tuple_data(ncols: int, kinds: str = "nutb") -> st.SearchStrategy[TupleData]:
    column = st.one_of([COLUMN_VALUES[k] for k in kinds])
    return st.lists(column, min_size=ncols, max_size=ncols).map(_to_tuple)


COLUMN = st.builds(Column, st.sampled_from([0, 1]), names, u32s, i32s)
COLUMNS = st.just(()) | st.lists(COLUMN, min_size=1, max_size=6).map(tuple)
IDENTITIES = st.sampled_from("dnfi")
SEGMENT_COUNT = st.integers(0, 5)
BODY_LENGTH = st.integers(0, 6)
OLD_KINDS = st.sampled_from(["K", "O"])
TRUNCATE_OPTIONS = st.integers(0, 3)
TRUNCATE_RELIDS = st.lists(RELIDS, min_size=1, max_size=4).map(tuple)
CONTENTS = st.binary(max_size=24)


def relations(xid: int | None) -> st.SearchStrategy[Relation]:
    return st.builds(Relation, RELIDS, names, names, IDENTITIES, COLUMNS, st.just(xid))


class ScriptBuilder:
    """Draws one session's worth of messages, tracking what the server would know."""

    def __init__(self, draw: st.DrawFn, proto: int, streaming: str) -> None:
        self.draw = draw
        self.proto = proto
        self.streaming = streaming
        self.natts: dict[int, int] = {}  # relid -> column count of its latest Relation
        self.streamed: set[int] = set()  # xids with a chunk sent and no c/A/p yet
        self.out: list[PgoutputMessage] = []

    def build(self) -> list[PgoutputMessage]:
        segments = {"txn": self.txn, "nontx_message": self.nontx_message}
        if self.streaming != "off":
            segments["stream_chunk"] = self.stream_chunk
            segments["stream_end"] = self.stream_end
        if self.proto >= 3:
            segments["prepared_txn"] = self.prepared_txn
            segments["finish_prepared"] = self.finish_prepared
        for _ in range(self.draw(SEGMENT_COUNT)):
            self.draw(st.sampled_from(sorted(segments)).map(segments.get))()
        while self.streamed:  # finish every streamed transaction
            self.stream_end()
        return self.out

    def maybe_origin(self) -> None:
        if self.draw(st.booleans()):
            self.out.append(Origin(self.draw(lsns), self.draw(names)))

    def body(self, stream_xid: int | None) -> None:
        """Changes of one transaction (or one stream chunk, with per-message (sub)xids)."""
        for _ in range(self.draw(BODY_LENGTH)):
            xid = None
            if stream_xid is not None:
                xid = self.draw(st.sampled_from([stream_xid, stream_xid ^ 1]) | u32s)
            ops = ["relation", "type", "truncate", "message"]
            if not self.natts:
                ops += ["relation"] * 4  # describe a table early, so that changes can follow
            else:
                ops += ["insert", "update", "delete"] * 3  # mostly changes, like a real stream
            op = self.draw(st.sampled_from(ops))
            if op == "relation":
                relation = self.draw(relations(xid))
                self.natts[relation.relid] = len(relation.columns)
                self.out.append(relation)
            elif op == "type":
                self.out.append(Type(self.draw(u32s), self.draw(names), self.draw(names), xid))
            elif op == "truncate":
                relids = self.draw(TRUNCATE_RELIDS)
                self.out.append(Truncate(self.draw(TRUNCATE_OPTIONS), relids, xid))
            elif op == "message":
                self.out.append(
                    Message(1, self.draw(lsns), self.draw(names), self.draw(CONTENTS), xid)
                )
            else:
                relid = self.draw(st.sampled_from(sorted(self.natts)))
                self.out.append(self.change(op, relid, self.natts[relid], xid))

    def change(self, op: str, relid: int, ncols: int, xid: int | None) -> PgoutputMessage:
        if op == "insert":
            return Insert(relid, self.draw(tuple_data(ncols)), xid)
        old_kind = self.draw(OLD_KINDS)
        old = self.draw(tuple_data(ncols, "ntb"))  # an old tuple never has 'u'
        if op == "delete":
            return Delete(relid, old_kind, old, xid)
        if self.draw(st.booleans()):
            return Update(relid, None, None, self.draw(tuple_data(ncols)), xid)
        return Update(relid, old_kind, old, self.draw(tuple_data(ncols)), xid)

    def txn(self) -> None:
        xid, lsn, ts = self.draw(u32s), self.draw(lsns), self.draw(timestamps)
        self.out.append(Begin(lsn, ts, xid))
        self.maybe_origin()
        self.body(None)
        self.out.append(Commit(lsn, self.draw(lsns), ts))

    def nontx_message(self) -> None:
        self.out.append(Message(0, self.draw(lsns), self.draw(names), self.draw(CONTENTS)))

    def stream_chunk(self) -> None:
        xids = st.sampled_from(sorted(self.streamed)) | u32s if self.streamed else u32s
        xid = self.draw(xids)
        first = xid not in self.streamed
        self.streamed.add(xid)
        self.out.append(StreamStart(xid, first))
        if first:
            self.maybe_origin()
        self.body(xid)
        self.out.append(StreamStop())

    def stream_end(self) -> None:
        if not self.streamed:
            return
        xid = self.draw(st.sampled_from(sorted(self.streamed)))
        ends = ["commit", "abort", "subabort"] + (["prepare"] if self.proto >= 3 else [])
        end = self.draw(st.sampled_from(ends))
        if end == "commit":
            self.out.append(
                StreamCommit(xid, self.draw(lsns), self.draw(lsns), self.draw(timestamps))
            )
        elif end == "prepare":
            self.out.append(
                StreamPrepare(
                    self.draw(lsns),
                    self.draw(lsns),
                    self.draw(timestamps),
                    xid,
                    self.draw(gids),
                )
            )
        else:
            subxid = xid if end == "abort" else self.draw(u32s.filter(lambda s: s != xid))
            abort_lsn = abort_ts = None
            if self.streaming == "parallel":
                abort_lsn, abort_ts = self.draw(lsns), self.draw(timestamps)
            self.out.append(StreamAbort(xid, subxid, abort_lsn, abort_ts))
        if end != "subabort":
            self.streamed.discard(xid)

    def prepared_txn(self) -> None:
        lsn, end_lsn, ts = self.draw(lsns), self.draw(lsns), self.draw(timestamps)
        xid, gid = self.draw(u32s), self.draw(gids)
        self.out.append(BeginPrepare(lsn, end_lsn, ts, xid, gid))
        self.maybe_origin()
        self.body(None)
        self.out.append(Prepare(lsn, end_lsn, ts, xid, gid))

    def finish_prepared(self) -> None:
        # K/r may name a gid this session never saw prepared (reference §5.7).
        xid, gid = self.draw(u32s), self.draw(gids)
        if self.draw(st.booleans()):
            message = CommitPrepared(
                self.draw(lsns), self.draw(lsns), self.draw(timestamps), xid, gid
            )
        else:
            message = RollbackPrepared(
                self.draw(lsns),
                self.draw(lsns),
                self.draw(timestamps),
                self.draw(timestamps),
                xid,
                gid,
            )
        self.out.append(message)


@st.composite
def scripts(draw: st.DrawFn, proto: int, streaming: str) -> list[PgoutputMessage]:
    return ScriptBuilder(draw, proto, streaming).build()


@st.composite
def mutations(draw: st.DrawFn, raw: bytes) -> bytes:
    """1-3 random edits of `raw`, biased towards bytes the decoder branches on."""
    interesting = st.sampled_from(b"\x00\x01\x02\x03\x7f\x80\xffntubNKOBCORYIUDTMSEcAbPKrpdfix")
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "append"]))
        if not data and op != "insert" and op != "append":
            break
        # Mostly past the type byte, so that most mutants still reach the message's decoder.
        at = 0
        if len(data) > 1 and draw(st.integers(0, 9)):
            at = draw(st.integers(1, len(data) - 1))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(interesting | st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 4))]
        elif op == "truncate":
            del data[at:]
        else:
            data += draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


# -- helpers -------------------------------------------------------------------------------------


def state(decoder: Decoder) -> tuple:
    return (
        {relid: id(rel) for relid, rel in decoder.relations.items()},
        {oid: id(t) for oid, t in decoder.types.items()},
        decoder.stream_xid,
    )


def decodes_exactly_or_fails_cleanly(decoder: Decoder, raw: bytes) -> None:
    """`raw` decodes to a message that re-encodes to `raw`, or raises a ProtocolError that
    leaves the decoder's state as it was. Any other exception fails the test."""
    before = state(decoder)
    try:
        message = decoder.decode(raw, lsn=0x10)
    except ProtocolError:
        assert state(decoder) == before
        return
    if message is None:
        assert raw == b""
    else:
        assert encode(message) == raw


def replay(decoder: Decoder, messages: list[PgoutputMessage]) -> None:
    for message in messages:
        decoder.decode(wire(message))


# -- properties ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FAST
@given(data=st.data())
def test_session_round_trip(proto: int, streaming: str, data: st.DataObject) -> None:
    script = data.draw(scripts(proto, streaming), label="script")
    decoder = Decoder(proto, streaming)
    latest: dict[int, Relation] = {}

    for message in script:
        raw = wire(message)
        assert encode(message) == raw
        decoded = decoder.decode(raw)
        assert decoded == message
        assert encode(decoded) == raw
        if isinstance(message, StreamStart):
            assert decoder.stream_xid == message.xid
        if isinstance(message, StreamStop):
            assert not decoder.in_stream
        if isinstance(message, Relation):
            latest[message.relid] = message

    assert not decoder.in_stream
    assert decoder.relations == latest


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FAST
@given(data=st.data())
def test_every_proper_prefix_is_truncated(proto: int, streaming: str, data: st.DataObject) -> None:
    script = data.draw(scripts(proto, streaming).filter(bool), label="script")
    decoder = Decoder(proto, streaming)

    for message in script:
        raw = wire(message)
        before = state(decoder)
        for cut in range(1, len(raw)):
            with pytest.raises(TruncatedMessage):
                decoder.decode(raw[:cut])
            assert state(decoder) == before
        assert decoder.decode(raw) == message


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FUZZ
@given(data=st.data())
def test_mutations_decode_exactly_or_raise_protocol_error(
    proto: int, streaming: str, strict: bool, data: st.DataObject
) -> None:
    script = data.draw(scripts(proto, streaming).filter(bool), label="script")
    index = data.draw(st.integers(0, len(script) - 1), label="index")
    decoder = Decoder(proto, streaming, strict=strict)
    replay(decoder, script[:index])

    mutated = data.draw(mutations(wire(script[index])), label="mutated")

    decodes_exactly_or_fails_cleanly(decoder, mutated)


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FAST
@given(data=st.data())
def test_bytes_from_another_session_decode_exactly_or_raise_protocol_error(
    proto: int, streaming: str, data: st.DataObject
) -> None:
    other_proto, other_streaming = data.draw(st.sampled_from(SESSIONS), label="sent by")
    script = data.draw(scripts(other_proto, other_streaming), label="script")
    decoder = Decoder(proto, streaming)

    for message in script:
        decodes_exactly_or_fails_cleanly(decoder, wire(message))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@FUZZ
@given(
    session=st.sampled_from(SESSIONS),
    prelude=st.sampled_from([[], [StreamStart(7, True)]]),
    raw=st.binary(min_size=1, max_size=40),
)
def test_arbitrary_bytes_never_escape_as_other_errors(
    strict: bool, session: tuple[int, str], prelude: list, raw: bytes
) -> None:
    proto, streaming = session
    decoder = Decoder(proto, streaming, strict=strict)
    if streaming != "off":
        replay(decoder, prelude)

    decodes_exactly_or_fails_cleanly(decoder, raw)


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FUZZ
@given(data=st.data())
def test_c_fast_path_agrees_with_python(proto: int, streaming: str, data: st.DataObject) -> None:
    """On valid and mutated bytes, the C path returns the Python path's message or None."""
    if decoder_module.SPEEDUPS is None:  # the pure-Python run of this test, or no C build
        pytest.skip("compares the C fast path with Python")
    decode_change = decoder_module.SPEEDUPS.decode_change
    script = data.draw(scripts(proto, streaming).filter(bool), label="script")
    index = data.draw(st.integers(0, len(script) - 1), label="index")
    decoder = Decoder(proto, streaming, speedups=False)
    replay(decoder, script[:index])
    raw = data.draw(st.one_of(st.just(wire(script[index])), mutations(wire(script[index]))))

    fast = decode_change(raw, decoder.in_stream, decoder.relations)
    if fast is not None:
        assert fast == decoder.decode(raw)
        assert type(fast.new if not isinstance(fast, Delete) else fast.old) is TupleData


# -- the strategies are not vacuous --------------------------------------------------------------


Shape = Callable[[PgoutputMessage], bool]


def is_a(cls: type) -> Shape:
    return lambda m: type(m) is cls


def expected_kinds(proto: int, streaming: str) -> dict[str, Shape]:
    """Message shapes that scripts for this session must be able to produce."""
    classes = [Begin, Commit, Origin, Relation, Type, Truncate, Delete]
    if streaming != "off":
        classes += [StreamStart, StreamStop, StreamCommit]
    if proto >= 3:
        classes += [BeginPrepare, Prepare, CommitPrepared, RollbackPrepared]
        if streaming != "off":
            classes.append(StreamPrepare)
    kinds = {cls.__name__: is_a(cls) for cls in classes}
    kinds["Insert with columns"] = lambda m: isinstance(m, Insert) and len(m.new) > 0
    kinds["Relation with a key column"] = lambda m: (
        isinstance(m, Relation) and any(c.is_key for c in m.columns)
    )
    kinds["Update without old tuple"] = lambda m: isinstance(m, Update) and m.old is None
    kinds["Update with old key"] = lambda m: isinstance(m, Update) and m.old_kind == "K"
    kinds["Update with old row"] = lambda m: isinstance(m, Update) and m.old_kind == "O"
    kinds["transactional Message"] = lambda m: isinstance(m, Message) and m.flags == 1
    kinds["non-transactional Message"] = lambda m: isinstance(m, Message) and m.flags == 0
    if streaming != "off":
        kinds["Insert with xid prefix"] = lambda m: isinstance(m, Insert) and m.xid is not None
        kinds["subxact StreamAbort"] = lambda m: isinstance(m, StreamAbort) and not m.is_toplevel
        kinds["toplevel StreamAbort"] = lambda m: isinstance(m, StreamAbort) and m.is_toplevel
    return kinds


def collect_once(strategy: st.SearchStrategy, examples: int) -> Callable:
    """Run `check` on `examples` derandomized (so: always the same) examples of `strategy`."""

    def run(check: Callable) -> None:
        search = settings(
            max_examples=examples,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        search(given(strategy)(check))()

    return run


def test_tuple_strategy_covers_every_column_kind() -> None:
    kinds: set[int] = set()
    empty_value_kinds: set[int] = set()

    def check(data: TupleData) -> None:
        kinds.update(data.kinds)
        empty_value_kinds.update(
            k for k, v in zip(data.kinds, data.values, strict=True) if v == b""
        )

    collect_once(tuple_data(4), 100)(check)

    assert kinds == set(b"nutb")
    assert empty_value_kinds == set(b"tb")


# The script builder's paths depend on streaming (off / on / parallel) and on proto >= 3; these
# three sessions take all of them.
@pytest.mark.parametrize(("proto", "streaming"), [(1, "off"), (3, "on"), (4, "parallel")])
def test_scripts_cover_every_message_shape(proto: int, streaming: str) -> None:
    """Every shape the session allows shows up in 150 (derandomized) scripts, and
    under 'parallel', and only there, a Stream Abort carries abort_lsn and abort_ts."""
    wanted = expected_kinds(proto, streaming)
    seen: set[str] = set()
    abort_forms: set[bool] = set()

    def check(script: list[PgoutputMessage]) -> None:
        for message in script:
            seen.update(name for name, matches in wanted.items() if matches(message))
            if isinstance(message, StreamAbort):
                abort_forms.add(message.abort_lsn is not None)

    collect_once(scripts(proto, streaming), 150)(check)

    assert sorted(set(wanted) - seen) == []
    if streaming != "off":
        assert abort_forms == {streaming == "parallel"}


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FUZZ
@given(data=st.data())
def test_c_peek_agrees_with_python(proto: int, streaming: str, data: st.DataObject) -> None:
    """With undecoded rows, the C path's peek at a row change is the Python path's, or None
    (the Python path then decides)."""
    if decoder_module.SPEEDUPS is None:
        pytest.skip("compares the C fast path with Python")
    peek = decoder_module.SPEEDUPS.peek_change
    script = data.draw(scripts(proto, streaming).filter(bool), label="script")
    index = data.draw(st.integers(0, len(script) - 1), label="index")
    decoder = Decoder(proto, streaming, speedups=False, undecoded_rows=True)
    replay(decoder, script[:index])
    raw = data.draw(st.one_of(st.just(wire(script[index])), mutations(wire(script[index]))))
    fast = peek(raw, decoder.in_stream, decoder.relations)
    if fast is not None:
        assert fast == decoder.decode(raw)


@pytest.mark.parametrize(("proto", "streaming"), SESSIONS, ids=SESSION_IDS)
@FUZZ
@given(data=st.data())
def test_row_frames_agree_with_the_decoder(proto: int, streaming: str, data: st.DataObject) -> None:
    """A frame `Decoder.row_frame` takes is one the decoder leaves as the same UndecodedChange
    (`UndecodedChanges.changes`), in C and in Python; its change frame is the same bytes."""
    script = data.draw(scripts(proto, streaming).filter(bool), label="script")
    index = data.draw(st.integers(0, len(script) - 1), label="index")
    decoder = Decoder(proto, streaming, speedups=False, undecoded_rows=True)
    replay(decoder, script[:index])
    raw = data.draw(st.one_of(st.just(wire(script[index])), mutations(wire(script[index]))))
    start = data.draw(st.integers(0, 2**64 - 1), label="data_start")
    frame = struct.pack(">cQQq", b"w", start, start, 0) + raw
    taken = decoder.row_frame(frame)
    peeked = decoder_module._row_frame(frame, decoder.relations)
    assert taken == (peeked and not decoder.in_stream)
    if decoder_module.SPEEDUPS is not None:
        assert decoder_module.SPEEDUPS.row_frame(frame, decoder.relations) == peeked
    if not taken:
        return
    ((position, change),) = list(UndecodedChanges([frame]).changes())
    assert (position, change) == (start, decoder.decode(raw))
    ordinal = data.draw(st.integers(0, 2**32 - 2), label="ordinal")
    expected = bytearray(b"old") + change_frame(ordinal + 1, start, raw)
    for append in {columns_module._append_change_frames, columns_module.append_change_frames}:
        chunks = {change.relid: bytearray(b"old")}
        assert append([frame], ordinal, chunks) == (ordinal + 1, {change.relid: 1})
        assert chunks == {change.relid: expected}


def test_a_row_frame_too_short_to_decode_is_left_to_the_decoder() -> None:
    """A change that ends right after its relid is not taken whole: the decoder says what is
    wrong with it, as it does without runs."""
    decoder = Decoder(1, undecoded_rows=True)
    decoder.decode(wire(Relation(7, "public", "t", "d", ())))
    for payload in (b"I\x00\x00\x00\x07", b"I\x00\x00\x00\x07N"):
        frame = struct.pack(">cQQq", b"w", 1, 1, 0) + payload
        assert decoder.row_frame(frame) == (len(payload) == 6)
        assert decoder_module._row_frame(frame, decoder.relations) == (len(payload) == 6)
        if decoder_module.SPEEDUPS is not None:
            assert decoder_module.SPEEDUPS.row_frame(frame, decoder.relations) == (
                len(payload) == 6
            )
    with pytest.raises(TruncatedMessage):
        decoder.decode(b"I\x00\x00\x00\x07")


def test_change_frames_go_to_their_relations_in_order() -> None:
    """Frames of several relations: each relation's chunk gets its frames, the ordinals count
    on over all of them; a relation without a chunk or an ordinal past 32 bits is refused."""
    frames = [
        struct.pack(">cQQqcI", b"w", 100 + i, 0, 0, b"IUD"[i % 3 : i % 3 + 1], relid)
        + b"x" * (i + 1)
        for i, relid in enumerate([7, 8, 7, 7, 9])
    ]
    for append in {columns_module._append_change_frames, columns_module.append_change_frames}:
        chunks = {7: bytearray(), 8: bytearray(), 9: bytearray()}
        assert append(frames, 10, chunks) == (15, {7: 3, 8: 1, 9: 1})
        assert [bytes(chunks[7]), bytes(chunks[8]), bytes(chunks[9])] == [
            b"".join(change_frame(11 + i, 100 + i, frames[i][25:]) for i in (0, 2, 3)),
            change_frame(12, 101, frames[1][25:]),
            change_frame(15, 104, frames[4][25:]),
        ]
        with pytest.raises(KeyError):
            append(frames, 0, {7: bytearray()})
    if decoder_module.SPEEDUPS is not None:
        with pytest.raises(OverflowError):
            columns_module.append_change_frames(frames[:1], 2**32 - 1, {7: bytearray()})
