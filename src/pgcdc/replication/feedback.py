"""What a logical replication client may acknowledge, and when (sans-I/O).

The rules (reference §8): the *flush* position of a standby status update moves the slot's
confirmed_flush_lsn, so it must never pass data that was not durably handled downstream. The
consumer confirms transaction end LSNs; when no transaction is open and everything delivered
has been confirmed, the position may also move up to the latest keepalive's walEnd, so that WAL
with nothing published in it (or an idle database) does not pile up behind the slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pgcdc.protocol import (
    INVALID_LSN,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Lsn,
    Message,
    PgoutputMessage,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
)

__all__ = ["AckTracker", "end_lsn_of"]

_OPENS, _CLOSES, _STREAM_START, _STREAM_END, _ENDS = range(5)
_ROLES: dict[type, int] = {
    Begin: _OPENS,
    BeginPrepare: _OPENS,
    Commit: _CLOSES,
    Prepare: _CLOSES,
    StreamStart: _STREAM_START,
    StreamCommit: _STREAM_END,
    StreamPrepare: _STREAM_END,
    StreamAbort: _STREAM_END,
    CommitPrepared: _ENDS,
    RollbackPrepared: _ENDS,
    Message: _ENDS,
}


def end_lsn_of(message: PgoutputMessage) -> Lsn | None:
    """The position to acknowledge once `message`'s transaction is durably handled, if any."""
    if isinstance(message, Commit | StreamCommit | Prepare | CommitPrepared | StreamPrepare):
        return message.end_lsn
    if isinstance(message, RollbackPrepared):
        return message.rollback_end_lsn
    if isinstance(message, StreamAbort) and message.is_toplevel:
        return message.abort_lsn
    if isinstance(message, Message) and not message.transactional:
        return message.lsn
    return None


@dataclass(slots=True)
class AckTracker:
    """Tracks received, delivered and confirmed positions of one replication session.

    Feed it every frame (`on_keepalive`, `on_message`); the consumer calls `confirm` with an end
    LSN it has made durable; `write_lsn` and `flush_lsn` are what to send in a status update.
    """

    #: The durable position the session started from (what the slot may already be at).
    confirmed: Lsn = INVALID_LSN
    #: Highest LSN the server has sent us (keepalive walEnd or non-zero XLogData dataStart).
    received: Lsn = INVALID_LSN
    #: End LSN of the last transaction handed to the consumer.
    delivered: Lsn = INVALID_LSN
    keepalive_wal_end: Lsn = INVALID_LSN
    in_transaction: bool = False
    open_streams: set[int] = field(default_factory=set)

    @property
    def idle(self) -> bool:
        """No transaction is open, so a keepalive's walEnd is a transaction boundary."""
        return not self.in_transaction and not self.open_streams

    def on_keepalive(self, wal_end: Lsn) -> None:
        if wal_end > self.received:
            self.received = wal_end
        if wal_end > self.keepalive_wal_end:
            self.keepalive_wal_end = wal_end

    def on_message(self, message: PgoutputMessage, data_start: Lsn) -> None:
        if data_start > self.received:
            self.received = data_start
        role = _ROLES.get(type(message))
        if role is None:  # a change, Relation, Type, Origin, Stream Stop
            return
        if role == _OPENS:
            self.in_transaction = True
            return
        if role == _STREAM_START:
            self.open_streams.add(message.xid)  # type: ignore[attr-defined]
            return
        if role == _STREAM_END:
            if not isinstance(message, StreamAbort) or message.is_toplevel:
                self.open_streams.discard(message.xid)  # type: ignore[attr-defined]
        elif role == _CLOSES:
            self.in_transaction = False
        end = end_lsn_of(message)
        if end is not None:
            if end > self.delivered:
                self.delivered = end
            if end > self.received:
                self.received = end

    def confirm(self, lsn: Lsn) -> None:
        """The consumer has durably handled everything up to `lsn` (a delivered end LSN)."""
        if lsn > self.received:
            raise ValueError(
                f"cannot confirm {Lsn(lsn)}: the server has sent nothing beyond {self.received}"
            )
        if lsn > self.confirmed:
            self.confirmed = Lsn(lsn)

    @property
    def write_lsn(self) -> Lsn:
        return self.received

    @property
    def flush_lsn(self) -> Lsn:
        """The confirmed position, moved up to the last keepalive when nothing is pending."""
        if (
            self.idle
            and self.confirmed >= self.delivered
            and self.keepalive_wal_end > self.confirmed
        ):
            return self.keepalive_wal_end
        return self.confirmed
