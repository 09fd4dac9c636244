"""The acknowledgement state machine: never confirm what the consumer has not durably handled;
refuse a message its phase does not allow; after a reconnect, skip what was handled."""

from __future__ import annotations

import pytest

from pgcdc.errors import UnexpectedMessage
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    Insert,
    Lsn,
    Message,
    Prepare,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TupleData,
    Type,
)
from pgcdc.replication import Acknowledgement, Phase

ROW = TupleData(b"t", (b"1",))


def txn(tracker: Acknowledgement, commit: int, end: int) -> None:
    tracker.on_message(Begin(Lsn(commit), 0, 1), Lsn(commit - 50))
    tracker.on_message(Insert(1, ROW), Lsn(commit - 40))
    tracker.on_message(Commit(Lsn(commit), Lsn(end), 0), Lsn(end))


def test_flush_follows_consumer_confirmations_only() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    txn(tracker, 200, 210)
    assert tracker.write_lsn == 210
    assert tracker.flush_lsn == 100, "delivered but not yet confirmed"
    tracker.confirm(Lsn(210))
    assert tracker.flush_lsn == 210


def test_idle_keepalive_advances_only_when_everything_is_confirmed() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_keepalive(Lsn(150))
    assert tracker.flush_lsn == 150, "nothing delivered, nothing open: WAL may be released"
    txn(tracker, 200, 210)
    tracker.on_keepalive(Lsn(300))
    assert tracker.flush_lsn == 100, "transaction 210 not confirmed yet"
    tracker.confirm(Lsn(210))
    assert tracker.flush_lsn == 300


def test_open_transaction_blocks_keepalive_advance() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_message(Begin(Lsn(500), 0, 1), Lsn(400))
    tracker.on_keepalive(Lsn(450))
    assert tracker.flush_lsn == 100
    tracker.on_message(Commit(Lsn(500), Lsn(510), 0), Lsn(510))
    tracker.confirm(Lsn(510))
    assert tracker.flush_lsn == 510


def test_open_stream_blocks_until_commit_or_toplevel_abort() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_message(StreamStart(7, True), Lsn(120))
    tracker.on_message(Insert(1, ROW, xid=8), Lsn(130))
    tracker.on_message(StreamStop(), Lsn(140))
    tracker.on_keepalive(Lsn(150))
    assert tracker.flush_lsn == 100, "streamed transaction 7 is still open"
    tracker.on_message(StreamAbort(7, 8, Lsn(160), 0), Lsn(160))
    assert tracker.flush_lsn == 100, "a subtransaction abort leaves it open"
    tracker.on_message(StreamCommit(7, Lsn(170), Lsn(180), 0), Lsn(180))
    tracker.on_keepalive(Lsn(190))
    assert tracker.flush_lsn == 100, "stream commit delivered, not confirmed"
    tracker.confirm(Lsn(180))
    assert tracker.flush_lsn == 190


def test_a_consumer_stops_at_endpos_past_an_open_streamed_transaction() -> None:
    """--until-idle: the server sent every chunk of streamed transaction 7 and then a keepalive
    past the end position; nothing more comes until 7 ends, so the consumer may stop, with 7
    unconfirmed. Inside a transaction or a stream block it may not."""
    tracker = Acknowledgement(start=Lsn(100))
    assert tracker.may_stop(Lsn(100), Lsn(100)) and not tracker.may_stop(Lsn(100), None)
    tracker.on_message(StreamStart(7, True), Lsn(120))
    assert not tracker.may_stop(Lsn(300), Lsn(200)), "in a stream block"
    tracker.on_message(Insert(1, ROW, xid=7), Lsn(130))
    tracker.on_message(StreamStop(), Lsn(140))
    assert not tracker.may_stop(Lsn(150), Lsn(200)), "the server has not reached endpos"
    txn(tracker, 190, 195)
    tracker.confirm(Lsn(195))
    tracker.on_message(Begin(Lsn(260), 0, 9), Lsn(250))
    assert not tracker.may_stop(Lsn(300), Lsn(200)), "in a transaction"
    tracker.on_message(Commit(Lsn(260), Lsn(270), 0), Lsn(270))
    tracker.on_keepalive(Lsn(300))
    assert tracker.may_stop(Lsn(300), Lsn(200)) and tracker.open_streams == {7}
    assert tracker.flush_lsn == 195, "nothing past the durable transactions while 7 is open"


def test_toplevel_stream_abort_closes_the_stream() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_message(StreamStart(7, True), Lsn(120))
    tracker.on_message(StreamStop(), Lsn(140))
    tracker.on_message(StreamAbort(7, 7), Lsn(0))
    assert tracker.idle
    tracker.on_keepalive(Lsn(200))
    assert tracker.flush_lsn == 200


def test_prepared_transaction_and_nontransactional_message() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_message(BeginPrepare(Lsn(200), Lsn(210), 0, 5, "g"), Lsn(150))
    tracker.on_keepalive(Lsn(160))
    assert tracker.flush_lsn == 100
    tracker.on_message(Prepare(Lsn(200), Lsn(210), 0, 5, "g"), Lsn(210))
    tracker.on_message(Message(0, Lsn(220), "p", b"x"), Lsn(220))
    tracker.on_keepalive(Lsn(230))
    tracker.confirm(Lsn(210))
    assert tracker.flush_lsn == 210, "the message at 220 is not confirmed yet"
    tracker.confirm(Lsn(220))
    assert tracker.flush_lsn == 220, "the message starts at 220: it ends after"
    tracker.confirm(Lsn(221))
    assert tracker.flush_lsn == 230


def test_cannot_confirm_beyond_what_the_server_sent() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    with pytest.raises(ValueError, match="sent nothing beyond"):
        tracker.confirm(Lsn(101))


def test_zero_header_lsns_do_not_move_received() -> None:
    tracker = Acknowledgement(start=Lsn(100))
    tracker.on_message(Begin(Lsn(300), 0, 1), Lsn(0))
    assert tracker.write_lsn == 100


def test_a_message_its_phase_does_not_allow_is_refused_with_its_lsn() -> None:
    acks = Acknowledgement(start=Lsn(100))
    with pytest.raises(UnexpectedMessage, match="Commit cannot come between transactions"):
        acks.on_message(Commit(Lsn(200), Lsn(210), 0), Lsn(0x1_0000_0010))
    acks.on_message(Begin(Lsn(300), 0, 1), Lsn(250))
    assert acks.phase is Phase.IN_TRANSACTION
    for message in (Begin(Lsn(400), 0, 2), StreamStart(7, True), StreamStop()):
        with pytest.raises(UnexpectedMessage, match="cannot come in a transaction"):
            acks.on_message(message, Lsn(260))
    acks.on_message(Commit(Lsn(300), Lsn(310), 0), Lsn(310))
    acks.on_message(StreamStart(7, True), Lsn(320))
    with pytest.raises(UnexpectedMessage, match="StreamCommit cannot come in a stream block"):
        acks.on_message(StreamCommit(7, Lsn(330), Lsn(340), 0), Lsn(340))
    with pytest.raises(
        UnexpectedMessage, match=r"Insert cannot come between transactions \(byte 0, LSN 1/10\)"
    ):
        Acknowledgement().on_message(Insert(1, ROW), Lsn(0x1_0000_0010))


def test_a_held_prepared_transaction_caps_the_flush_until_released() -> None:
    acks = Acknowledgement(start=Lsn(100))
    txn(acks, 200, 210)
    acks.on_message(BeginPrepare(Lsn(300), Lsn(310), 0, 5, "g"), Lsn(250))
    acks.on_message(Prepare(Lsn(300), Lsn(310), 0, 5, "g"), Lsn(310))
    acks.hold("g", Lsn(300))
    txn(acks, 400, 410)
    acks.confirm(Lsn(410))
    assert acks.flush_lsn == 100, "not past what was handled when the prepare came"
    acks.on_keepalive(Lsn(500))
    assert acks.flush_lsn == 100, "no keepalive advance while something is held"
    assert acks.release("g") and not acks.release("g")
    assert acks.flush_lsn == 500


def test_after_a_reconnect_handled_transactions_are_already_delivered() -> None:
    acks = Acknowledgement(start=Lsn(100))
    txn(acks, 200, 210)
    acks.handled_upto(Lsn(210))
    acks.on_message(BeginPrepare(Lsn(300), Lsn(310), 0, 5, "held"), Lsn(250))
    acks.on_message(Prepare(Lsn(300), Lsn(310), 0, 5, "held"), Lsn(310))
    acks.hold("held", Lsn(300))
    acks.handled_upto(Lsn(310))
    acks.on_message(Begin(Lsn(400), 0, 1), Lsn(350))  # cut off by the lost connection
    acks.session_started()
    assert acks.phase is Phase.BETWEEN and acks.resume == 310
    assert acks.already_delivered(Begin(Lsn(200), 0, 1))
    assert not acks.already_delivered(Begin(Lsn(400), 0, 1)), "interrupted: comes again"
    assert not acks.already_delivered(BeginPrepare(Lsn(300), Lsn(310), 0, 5, "held"))
    assert acks.already_delivered(BeginPrepare(Lsn(300), Lsn(310), 0, 6, "other"))
    assert acks.already_delivered(StreamCommit(9, Lsn(205), Lsn(206), 0))
    assert not acks.already_delivered(StreamCommit(9, Lsn(405), Lsn(406), 0))


def test_a_transaction_already_delivered_leaves_its_relation_and_type_messages() -> None:
    """The server describes a table once per session: the description it sent inside a
    transaction the client drops is the one the next changes are bound to."""
    acks = Acknowledgement(start=Lsn(100))
    txn(acks, 200, 210)
    acks.handled_upto(Lsn(210))
    acks.session_started()
    described = Relation(1, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "n", 23, -1)))
    typed = Type(16500, "public", "mood")
    resent = [
        Begin(Lsn(200), 0, 1),
        typed,
        described,
        Insert(1, ROW),
        Commit(Lsn(200), Lsn(210), 0),
        Begin(Lsn(300), 0, 2),
        Insert(1, ROW),
        Commit(Lsn(300), Lsn(310), 0),
    ]
    passed = [m for _, m in acks.skip_delivered((None, m) for m in resent)]
    assert passed == [typed, described, *resent[5:]]
    # a prepared transaction handed over before: the same
    acks.on_message(BeginPrepare(Lsn(400), Lsn(410), 0, 7, "g"), Lsn(350))
    acks.on_message(Prepare(Lsn(400), Lsn(410), 0, 7, "g"), Lsn(410))
    acks.handled_upto(Lsn(410))
    acks.session_started()
    again = [BeginPrepare(Lsn(400), Lsn(410), 0, 7, "g"), described, Insert(1, ROW)]
    again.append(Prepare(Lsn(400), Lsn(410), 0, 7, "g"))
    assert [m for _, m in acks.skip_delivered((None, m) for m in again)] == [described]


def test_a_message_outside_transactions_already_delivered() -> None:
    """Handled, a message outside any transaction is not handed over again; one that starts
    where the transaction handled last ends is another."""
    acks = Acknowledgement(start=Lsn(100))
    txn(acks, 200, 210)
    acks.handled_upto(Lsn(210))
    message = Message(0, Lsn(220), "p", b"x")
    end = acks.on_message(message, Lsn(220))
    assert end == 221
    acks.handled_upto(end)
    acks.session_started()
    assert acks.already_delivered(message)
    assert not acks.already_delivered(Message(0, Lsn(221), "p", b"next"))
    fresh = Acknowledgement(start=Lsn(100))
    txn(fresh, 200, 210)
    fresh.handled_upto(Lsn(210))
    fresh.session_started()
    assert not fresh.already_delivered(Message(0, Lsn(210), "p", b"right after the commit"))
    assert fresh.already_delivered(Message(0, Lsn(150), "p", b"before it"))
