"""Decode the golden captures recorded from real servers (tests/golden/generate.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pgcdc.capture import CaptureHeader, CaptureReader
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
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
    PrimaryKeepalive,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    XLogData,
    encode,
    encode_frame,
    parse_frame,
)

GOLDEN = Path(__file__).parent / "golden"
CAPTURES = sorted(GOLDEN.glob("*.pgcap"))


@dataclass
class Session:
    header: CaptureHeader
    items: list[tuple[XLogData, PgoutputMessage]] = field(default_factory=list)
    keepalives: int = 0

    def of(self, cls: type) -> list:
        return [m for _, m in self.items if isinstance(m, cls)]

    def relation(self, name: str) -> Relation:
        return next(r for r in self.of(Relation) if r.relname == name)

    def changes(self, name: str, cls: type) -> list:
        relid = self.relation(name).relid
        return [m for m in self.of(cls) if m.relid == relid]

    @property
    def binary(self) -> bool:
        return self.header.binary


def load(path: Path) -> Session:
    with path.open("rb") as file:
        reader = CaptureReader(file, path.name)
        session = Session(reader.header)
        decoder = Decoder(reader.header.proto_version, reader.header.streaming)
        for record in reader:
            frame = parse_frame(record.frame)
            assert encode_frame(frame) == record.frame
            if isinstance(frame, PrimaryKeepalive):
                session.keepalives += 1
                continue
            assert isinstance(frame, XLogData)
            message = decoder.decode(frame.payload, frame.data_start)
            assert message is not None
            assert encode(message) == frame.payload, f"record {record.index}"
            session.items.append((frame, message))
    return session


def int4(session: Session, value: bytes | None) -> int:
    assert value is not None
    return struct.unpack(">i", value)[0] if session.binary else int(value)


def text(value: bytes | None) -> str:
    assert value is not None
    return value.decode()


@pytest.fixture(scope="module", params=CAPTURES, ids=[p.stem for p in CAPTURES])
def session(request: pytest.FixtureRequest) -> Session:
    return load(request.param)


def test_captures_cover_every_server_version() -> None:
    majors = {int(p.name[2:4]) for p in CAPTURES}
    assert {15, 16, 18} <= majors


def test_header_describes_the_session(session: Session) -> None:
    header = session.header
    assert header.publication_names == ["pub"]
    assert header.server_version // 10000 >= 15
    assert 1 <= header.proto_version <= 4
    assert session.keepalives > 0


def test_transactions_are_well_formed(session: Session) -> None:
    """B [O] body C, with Begin.final_lsn == Commit.commit_lsn; no empty body on PG15+."""
    open_begin: Begin | None = None
    body = 0
    for frame, message in session.items:
        if isinstance(message, Begin):
            assert open_begin is None
            open_begin, body = message, 0
        elif isinstance(message, Commit):
            assert open_begin is not None
            assert message.commit_lsn == open_begin.final_lsn
            assert message.end_lsn > message.commit_lsn
            assert frame.data_start == message.end_lsn
            assert body > 0, "PG15+ skips empty transactions"
            open_begin = None
        elif open_begin is not None and not isinstance(message, Relation | Type | Origin):
            body += 1
    assert open_begin is None


def test_relation_and_type_messages(session: Session) -> None:
    customers = session.relation("customers")
    assert customers.schema == "public"
    assert customers.replica_identity == "d"
    assert [c.name for c in customers.columns] == ["id", "name", "note", "m", "score"]
    assert [c.is_key for c in customers.columns] == [True, False, False, False, False]
    assert customers.columns[0].type_oid == 23
    types = {t.type_oid: t for t in session.of(Type)}
    mood = types[customers.columns[3].type_oid]
    assert (mood.schema, mood.name) == ("public", "mood")
    # a domain is announced under its own OID with its base type's name
    domain = types[customers.columns[4].type_oid]
    assert (domain.namespace, domain.schema, domain.name) == ("", "pg_catalog", "int4")
    fullrow = session.relation("fullrow")
    assert fullrow.replica_identity == "f"
    assert all(c.is_key for c in fullrow.columns)
    for frame, message in session.items:
        if isinstance(message, Relation | Type):
            assert frame.data_start == 0


def test_inserts_with_nulls_and_toast(session: Session) -> None:
    alice, empty = session.changes("customers", Insert)[:2]
    assert alice.new.kinds == (b"ttttt" if not session.binary else b"bbbbb")
    assert int4(session, alice.new.values[0]) == 1
    assert text(alice.new.values[1]) == "alice"
    assert text(alice.new.values[2]) == "toast-" * 2000
    assert text(alice.new.values[3]) == "happy"
    assert int4(session, alice.new.values[4]) == 7
    assert empty.new.kinds[1:] == b"nnnn"
    assert empty.new.values[1:] == (None,) * 4


def test_updates_and_deletes(session: Session) -> None:
    plain, key_change = session.changes("customers", Update)[:2]
    # the TOASTed note did not change: not sent, marked 'u'
    assert plain.old_kind is None and plain.old is None
    assert plain.new.unchanged_toast_columns == (2,)
    assert text(plain.new.values[1]) == "alice b"
    # primary key change: old key tuple, non-key columns are 'n' fillers
    assert key_change.old_kind == "K"
    assert int4(session, key_change.old.values[0]) == 2
    assert key_change.old.kinds[1:] == b"nnnn"
    assert int4(session, key_change.new.values[0]) == 3
    (deleted,) = session.changes("customers", Delete)
    assert deleted.old_kind == "K" and int4(session, deleted.old.values[0]) == 3
    (full_update,) = session.changes("fullrow", Update)
    assert full_update.old_kind == "O"
    assert [text(v) for v in full_update.old.values[1:]] == ["one"]
    assert [text(v) for v in full_update.new.values[1:]] == ["uno"]
    (full_delete,) = session.changes("fullrow", Delete)
    assert full_delete.old_kind == "O" and text(full_delete.old.values[1]) == "two"


def test_truncate(session: Session) -> None:
    parent, child = session.relation("parent").relid, session.relation("child").relid
    cascade, restart = session.of(Truncate)
    assert cascade.cascade and not cascade.restart_identity
    assert set(cascade.relids) == {parent, child}
    assert restart.restart_identity and not restart.cascade
    assert restart.relids == (child,)


def test_origin(session: Session) -> None:
    (origin,) = session.of(Origin)
    assert origin.origin_name == "node_a"
    assert origin.origin_lsn == Lsn.parse("0/ABCDEF")
    index = next(i for i, (_, m) in enumerate(session.items) if isinstance(m, Origin))
    begin_frame, begin = session.items[index - 1]
    assert isinstance(begin, Begin)
    assert begin_frame.data_start == 0  # a Begin followed by an Origin is written "non-last"


def test_logical_messages(session: Session) -> None:
    messages = session.of(Message)
    if not session.header.messages:
        assert messages == []
        return
    by_prefix = {m.prefix: m for m in messages}
    assert by_prefix["tx-prefix"].transactional
    assert by_prefix["tx-prefix"].content == b"in a transaction"
    nontx = by_prefix["nontx"]
    assert not nontx.transactional and nontx.content == b"\x00\xff\x00"
    # a non-transactional message stands outside any Begin ... Commit
    inside = False
    for _, message in session.items:
        inside = isinstance(message, Begin) or (inside and not isinstance(message, Commit))
        if message is nontx:
            assert not inside


def test_streamed_transactions(session: Session) -> None:
    starts = session.of(StreamStart)
    if session.header.streaming == "off":
        assert starts == [] and session.of(StreamAbort) == []
        return
    committed = session.of(StreamCommit)
    assert len(committed) == 1
    by_xid: dict[int, list[StreamStart]] = {}
    for start in starts:
        by_xid.setdefault(start.xid, []).append(start)
    for chunks in by_xid.values():
        assert chunks[0].first_segment and not any(c.first_segment for c in chunks[1:])
    parallel = session.header.streaming == "parallel"
    aborts = session.of(StreamAbort)
    top = [a for a in aborts if a.is_toplevel]
    sub = [a for a in aborts if not a.is_toplevel]
    assert len(top) == 1 and top[0].xid in by_xid
    assert all((a.abort_lsn is not None) == parallel for a in aborts)
    # inside a stream every change carries the xid of the (sub)transaction that made it
    stream_xid = None
    change_xids: dict[int, set[int]] = {}
    for _, message in session.items:
        if isinstance(message, StreamStart):
            stream_xid = message.xid
        elif isinstance(message, StreamStop):
            stream_xid = None
        elif isinstance(message, Insert | Relation):
            assert (message.xid is not None) == (stream_xid is not None)
            if stream_xid is not None:
                change_xids.setdefault(stream_xid, set()).add(message.xid)
    commit_xid = committed[0].xid
    if sub:
        assert sub[0].xid == commit_xid
        assert sub[0].subxid in change_xids[commit_xid], "subtransaction changes were streamed"


def test_two_phase(session: Session) -> None:
    if not session.header.two_phase:
        assert session.of(BeginPrepare) == [] and session.of(Prepare) == []
        return
    prepared = {p.gid: p for p in session.of(Prepare)}
    begins = {b.gid: b for b in session.of(BeginPrepare)}
    assert set(prepared) == set(begins) == {"gid-commit", "gid-rollback"}
    for gid, prepare in prepared.items():
        assert begins[gid].xid == prepare.xid
        assert begins[gid].end_lsn == prepare.end_lsn
    (rolled,) = session.of(RollbackPrepared)
    assert rolled.gid == "gid-rollback"
    assert rolled.prepare_end_lsn == prepared["gid-rollback"].end_lsn
    committed = {c.gid for c in session.of(CommitPrepared)}
    (streamed,) = session.of(StreamPrepare)
    assert streamed.gid == "gid-streamed"
    assert committed == {"gid-commit", "gid-streamed"}
