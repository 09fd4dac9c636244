"""What a logical replication consumer may acknowledge, and when: one sans-I/O state machine.

The slot's ``confirmed_flush_lsn`` is the only durable record of what a consumer holds: the
server frees WAL before it and, after a reconnect or a restart, sends only the transactions
that end after it. The flush position of a standby status update must therefore never pass a
transaction that is not durably handled downstream (reference §8). Every rule that decides
it lives here, and the walsender loop, the reconnecting client, the transaction assembler,
the plugin runner and the Spark pipeline consult this object instead of keeping positions of
their own.

The session's *phase* is explicit, and `_TRANSITIONS` is the one place that says which message
may come in which phase (anything else is an `UnexpectedMessage` naming the LSN):

=================  ===============================================  ===================
phase              messages                                          next phase
=================  ===============================================  ===================
BETWEEN            Begin, Begin Prepare                              IN_TRANSACTION
BETWEEN            Stream Start                                      IN_STREAM_BLOCK
BETWEEN            Stream Commit / Abort / Prepare, Commit /         BETWEEN
                   Rollback Prepared, a non-transactional Message
IN_TRANSACTION     Relation, Type, Origin, changes, Truncate,        IN_TRANSACTION
                   Message
IN_TRANSACTION     Commit, Prepare                                   BETWEEN
IN_STREAM_BLOCK    Relation, Type, Origin, changes, Truncate,        IN_STREAM_BLOCK
                   Message
IN_STREAM_BLOCK    Stream Stop                                       BETWEEN
=================  ===============================================  ===================

Relation and Type messages are also accepted BETWEEN transactions. Streamed transactions
stay open across phases (`open_streams`) until their Stream Commit, Stream Prepare or
top-level Stream Abort.

Positions, each only ever moving forward:

* ``received``: the highest position the server has sent (keepalive walEnd, XLogData start);
* ``sent``: the end LSN of the last transaction the server finished sending;
* ``handled``: the end LSN of the last transaction handed over to the consumer *and
  processed by it* (marked by whoever drives the consumer, once its callback returned);
* ``durable``: what the consumer says it made durable (`confirm`);
* ``holds``: per prepared transaction the consumer keeps until its COMMIT/ROLLBACK PREPARED
  (`hold`), a floor nothing past which may be confirmed: confirming up to the prepare record
  would stop the server from sending it again after a restart.

``flush_lsn`` (what the slot may move to) is ``durable`` capped by every hold; when the
session is BETWEEN transactions with no streamed transaction open and everything the server
finished sending is durable, it moves up to the last keepalive's walEnd, so that WAL with
nothing published in it does not pile up behind the slot.

A consumer that stops at an end position (``--until-idle``, ``--endpos``) stops once the
server has sent everything before it and no transaction or stream block is in progress
(`may_stop`). A streamed transaction still open then does not hold it up: all of its chunks
so far were sent, and nothing more comes until it ends, after that position. It is not
confirmed (``flush_lsn`` stays at ``durable`` while one is open), so the slot sends it again,
from its start, once it has committed.

After a reconnect the server sends everything after the slot's position again;
`already_delivered` tells which of those transactions the consumer had already handled in
this process (by their commit or prepare LSN against ``resume``; a message outside any
transaction by its own), so that it sees each once. The Relation and Type messages of those
it drops still pass: the server does not describe those tables again in the session.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, TypeVar

from pgcdc.errors import UnexpectedMessage
from pgcdc.protocol import (
    INVALID_LSN,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
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
    Type,
    UndecodedChange,
    UndecodedChanges,
    Update,
)

__all__ = ["Acknowledgement", "Phase", "end_lsn_of"]

F = TypeVar("F")


class Phase(enum.Enum):
    """Where a walsender session is in its message sequence."""

    BETWEEN = "between transactions"
    IN_TRANSACTION = "in a transaction"
    IN_STREAM_BLOCK = "in a stream block"


_B, _T, _S = Phase.BETWEEN, Phase.IN_TRANSACTION, Phase.IN_STREAM_BLOCK
_CONTENT = (
    Relation,
    Type,
    Origin,
    Insert,
    Update,
    Delete,
    UndecodedChange,
    UndecodedChanges,
    Truncate,
    Message,
)

#: (phase, message type) -> the phase after it. The only place that says what is legal.
_TRANSITIONS: dict[tuple[Phase, type], Phase] = {
    (_B, Begin): _T,
    (_B, BeginPrepare): _T,
    (_B, StreamStart): _S,
    (_B, StreamCommit): _B,
    (_B, StreamAbort): _B,
    (_B, StreamPrepare): _B,
    (_B, CommitPrepared): _B,
    (_B, RollbackPrepared): _B,
    (_B, Message): _B,
    (_B, Relation): _B,
    (_B, Type): _B,
    (_T, Commit): _B,
    (_T, Prepare): _B,
    (_S, StreamStop): _B,
    **{(_T, kind): _T for kind in _CONTENT},
    **{(_S, kind): _S for kind in _CONTENT},
}


def _stream_abort_end(message: StreamAbort) -> Lsn | None:
    return (message.abort_lsn or None) if message.is_toplevel else None


def _message_end(message: Message) -> Lsn | None:
    """A message outside any transaction is a unit of its own: handled, everything before the
    byte after its start is. (Its own LSN would not do: the server sends again a message at
    the position it restarts from, and a transaction may end exactly where the message
    starts.)"""
    return None if message.transactional else Lsn(message.lsn + 1)


#: Per message type: the position to acknowledge once its transaction is durably handled.
_END_LSN: dict[type, Callable[[Any], Lsn | None]] = {
    Commit: attrgetter("end_lsn"),
    StreamCommit: attrgetter("end_lsn"),
    Prepare: attrgetter("end_lsn"),
    CommitPrepared: attrgetter("end_lsn"),
    StreamPrepare: attrgetter("end_lsn"),
    RollbackPrepared: attrgetter("rollback_end_lsn"),
    StreamAbort: _stream_abort_end,
    Message: _message_end,
}


def end_lsn_of(message: PgoutputMessage) -> Lsn | None:
    """The position to acknowledge once `message`'s transaction is durably handled, if any:
    the end of a transaction, of a prepared one's outcome, of a top-level stream abort, or
    the byte after a non-transactional message's start."""
    end = _END_LSN.get(type(message))
    return None if end is None else end(message)


@dataclass(slots=True)
class Acknowledgement:
    """The acknowledgement state of one consumer of one slot, across its sessions.

    The walsender loop feeds it every frame (`on_message`, `on_keepalive`); the consumer's
    driver marks transactions handled (`handled_upto`), holds and releases prepared ones
    (`hold`, `release`) and confirms what it made durable (`confirm`); a status update reports
    `write_lsn` and `flush_lsn`. `confirm` may come from another thread.
    """

    #: The slot's confirmed position when this consumer started: durable by definition.
    start: Lsn = INVALID_LSN
    phase: Phase = Phase.BETWEEN
    open_streams: set[int] = field(default_factory=set)
    received: Lsn = INVALID_LSN
    sent: Lsn = INVALID_LSN
    handled: Lsn = INVALID_LSN
    durable: Lsn = INVALID_LSN
    keepalive_wal_end: Lsn = INVALID_LSN
    holds: dict[str, Lsn] = field(default_factory=dict)
    #: Transactions ending at or before this were handed over in an earlier session.
    resume: Lsn = INVALID_LSN

    def __post_init__(self) -> None:
        self.start = Lsn(self.start)
        self.received = max(self.received, self.start)
        self.durable = max(self.durable, self.start)
        self.resume = max(self.resume, self.start)

    # -- the session ------------------------------------------------------------------------

    def session_started(self) -> None:
        """A new walsender session starts at a transaction boundary; the server sends again
        everything after the slot's position, of which the consumer has seen up to `resume`."""
        self.resume = max(self.resume, self.handled, self.flush_lsn)
        self.phase = Phase.BETWEEN
        self.open_streams.clear()

    @property
    def idle(self) -> bool:
        """Between transactions with no streamed transaction open: a keepalive's walEnd is a
        transaction boundary."""
        return self.phase is Phase.BETWEEN and not self.open_streams

    @property
    def at_boundary(self) -> bool:
        """No transaction or stream block in progress: the server has sent everything before
        its position. Streamed transactions may be open: they end after it."""
        return self.phase is Phase.BETWEEN

    def may_stop(self, position: Lsn, endpos: Lsn | None) -> bool:
        """Whether a consumer stopping at `endpos` may stop, the server having sent
        everything up to `position` (a keepalive's walEnd, a message's start, a transaction's
        end). Open streamed transactions are left open (see the module's docstring)."""
        return endpos is not None and self.at_boundary and position >= endpos

    def on_keepalive(self, wal_end: Lsn) -> None:
        if wal_end > self.received:
            self.received = wal_end
        if wal_end > self.keepalive_wal_end:
            self.keepalive_wal_end = wal_end

    def on_message(self, message: PgoutputMessage, data_start: Lsn) -> Lsn | None:
        """Advance the phase (refusing a message its phase does not allow) and positions;
        the message's `end_lsn_of`."""
        kind = type(message)
        if (kind is UndecodedChanges or kind is UndecodedChange) and self.phase is not _B:
            # the hot path
            if data_start > self.received:
                self.received = data_start
            return None
        after = _TRANSITIONS.get((self.phase, kind))
        if after is None:
            raise UnexpectedMessage(
                f"{kind.__name__} cannot come {self.phase.value}",
                lsn=data_start or None,
            )
        self.phase = after
        if data_start > self.received:
            self.received = data_start
        if kind is StreamStart:
            self.open_streams.add(message.xid)  # type: ignore[attr-defined]
        elif (
            kind is StreamCommit
            or kind is StreamPrepare
            or (kind is StreamAbort and message.is_toplevel)  # type: ignore[attr-defined]
        ):
            self.open_streams.discard(message.xid)  # type: ignore[attr-defined]
        end = end_lsn_of(message)
        if end is not None:
            if end > self.sent:
                self.sent = end
            if end > self.received:
                self.received = end
        return end

    # -- the consumer -----------------------------------------------------------------------

    def handled_upto(self, end_lsn: Lsn) -> None:
        """The consumer has processed the transaction ending at `end_lsn` (not necessarily
        durably): after a reconnect it is not handed over again."""
        if end_lsn > self.handled:
            self.handled = Lsn(end_lsn)

    def hold(self, gid: str, prepare_lsn: Lsn) -> None:
        """Keep the prepared transaction `gid` back until its COMMIT/ROLLBACK PREPARED:
        nothing past what the consumer had handled when it came (and never past its prepare
        record) is confirmed meanwhile, so that the server sends it again after a restart."""
        floor = min(max(self.handled, self.durable), Lsn(prepare_lsn))
        self.holds[gid] = min(self.holds.get(gid, floor), floor)

    def release(self, gid: str) -> bool:
        """The held transaction's outcome arrived (or it was dropped); whether it was held."""
        return self.holds.pop(gid, None) is not None

    def is_held(self, gid: str) -> bool:
        return gid in self.holds

    def confirm(self, lsn: Lsn) -> None:
        """The consumer has durably handled everything up to `lsn` (a transaction's end)."""
        if lsn > self.received:
            raise ValueError(
                f"cannot confirm {Lsn(lsn)}: the server has sent nothing beyond {self.received}"
            )
        if lsn > self.durable:
            self.durable = Lsn(lsn)

    # -- what to report ---------------------------------------------------------------------

    @property
    def write_lsn(self) -> Lsn:
        return self.received

    @property
    def flush_lsn(self) -> Lsn:
        """What the slot may move to now."""
        if self.holds:
            return min(self.durable, *self.holds.values())
        if self.idle and self.durable >= self.sent and self.keepalive_wal_end > self.durable:
            return self.keepalive_wal_end
        return self.durable

    @property
    def pending(self) -> bool:
        """Whether something the server finished sending is not durable yet (or held)."""
        return bool(self.holds) or self.durable < self.sent

    def already_delivered(self, message: PgoutputMessage) -> bool:
        """Whether the transaction (or a prepared one's outcome) that `message` begins or
        finishes was handed over before this session: the server sends again everything after
        the slot's position. A held prepared transaction is never "delivered": its copy is
        taken again."""
        resume = self.resume
        kind = type(message)
        if kind is Begin:
            return message.final_lsn < resume  # type: ignore[attr-defined]
        if kind is BeginPrepare:
            return (
                message.prepare_lsn < resume  # type: ignore[attr-defined]
                and message.gid not in self.holds  # type: ignore[attr-defined]
            )
        if kind is StreamCommit:
            return message.commit_lsn < resume  # type: ignore[attr-defined]
        if kind is CommitPrepared:
            return message.end_lsn <= resume  # type: ignore[attr-defined]
        if kind is RollbackPrepared:
            return message.rollback_end_lsn <= resume  # type: ignore[attr-defined]
        if kind is Message and not message.transactional:  # type: ignore[attr-defined]
            return message.lsn < resume  # type: ignore[attr-defined]
        return False

    def skip_delivered(
        self, items: Iterable[tuple[F, PgoutputMessage]]
    ) -> Iterator[tuple[F, PgoutputMessage]]:
        """`(frame, message)` pairs minus the transactions and prepared transactions'
        outcomes that were `already_delivered`. Streamed transactions pass whole: whoever
        assembles them drops one already delivered at its Stream Commit.

        The Relation and Type messages of a dropped transaction pass (they then come between
        transactions): the server describes a table once per session, before its first
        change, so a change after them is bound to what they said. Without them, it would be
        bound to an older description (a streamed transaction's, or the last session's)."""
        skipping = False
        items = iter(items)
        for item in items:
            kind = type(item[1])
            if skipping:
                if kind is Relation or kind is Type:
                    yield item
                skipping = kind is not Commit and kind is not Prepare
                continue
            if kind in _BOUNDARIES:
                if self.already_delivered(item[1]):
                    skipping = kind is Begin or kind is BeginPrepare
                    continue
                if kind is Begin:
                    # a transaction committed at or past the resume point: whatever follows
                    # is decoded from further on (a held prepared one's BeginPrepare is not)
                    yield item
                    yield from items
                    return
            yield item


_BOUNDARIES = frozenset({Begin, BeginPrepare, CommitPrepared, RollbackPrepared, Message})
