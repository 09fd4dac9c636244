"""Turns the pgoutput message stream into output plugin callbacks (sans-I/O but for spill files).

Feed it every decoded message with its XLogData position; it calls the plugin and answers,
after the callback that finished a transaction has returned, that transaction's end LSN. What
may then be confirmed is the `Acknowledgement` state machine's to say (the assembler holds
prepared transactions there).

What it does beyond a one-to-one mapping:
- delays begin (and stream_start) until the Origin that may follow is known, so that
  filter_by_origin (and only-local on servers without ``origin 'none'``) can skip the whole
  transaction, as the server does;
- for a plugin without the streaming callbacks, buffers each streamed transaction by xid
  (bounded memory, spilling to disk) and delivers it at Stream Commit as an ordinary one;
  drops it at a top-level Stream Abort and drops only a subtransaction's changes at a
  subtransaction's Stream Abort;
- for prepared transactions the plugin does not take at PREPARE (no two-phase callbacks, or
  filter_prepare said so), buffers them by gid and delivers them at COMMIT PREPARED, dropping
  them at ROLLBACK PREPARED; until then they are held (`Acknowledgement.hold`): no position
  past their prepare is confirmed, so after a restart the server sends them again;
- COMMIT/ROLLBACK PREPARED for a gid it never saw go to the two-phase callbacks (the prepare
  predates two-phase on the slot, or was empty), or are only acknowledged without them;
- after a reconnect, a streamed transaction the plugin already had is dropped at its Stream
  Commit (the client skips ordinary ones before they reach the assembler).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pgcdc.decoding.context import DecodingContext
from pgcdc.decoding.model import Change, ChangeAction, Transaction, Truncation
from pgcdc.decoding.plugin import OutputPlugin, PluginCapabilities, capabilities
from pgcdc.decoding.spill import SpillBuffer, SpillPool
from pgcdc.errors import UnexpectedMessage, UnknownRelation
from pgcdc.protocol import (
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
from pgcdc.protocol.messages import fast_constructor
from pgcdc.replication.acknowledgement import Acknowledgement, end_lsn_of

__all__ = ["Fate", "TransactionAssembler"]

log = logging.getLogger("pgcdc.decoding")

_make_change = fast_constructor(Change)
_ACTIONS = {
    ord("I"): ChangeAction.INSERT,
    ord("U"): ChangeAction.UPDATE,
    ord("D"): ChangeAction.DELETE,
}
# Entries of a buffered transaction.
_CHANGE, _TRUNCATE, _MESSAGE = "change", "truncate", "message"


class Fate(enum.Enum):
    """What happens to an open transaction's changes."""

    #: Not decided yet: the Origin that may follow Begin is not known before the first change.
    PENDING = "pending"
    #: Passed to the plugin as they come.
    DELIVER = "deliver"
    #: Dropped (filtered by origin).
    SKIP = "skip"
    #: Kept until COMMIT/ROLLBACK PREPARED (a prepared transaction the plugin does not take
    #: at PREPARE).
    HOLD = "hold"


@dataclass(slots=True)
class _Open:
    """The transaction between Begin/Begin Prepare and Commit/Prepare."""

    txn: Transaction
    prepared: bool
    fate: Fate = Fate.PENDING
    held: SpillBuffer | None = None


@dataclass(slots=True)
class _Stream:
    """A streamed transaction: passed through, buffered, or skipped by origin."""

    txn: Transaction
    buffer: SpillBuffer | None = None
    skip: bool = False
    decided: bool = False
    #: stream_start was called for the current Stream Start ... Stop block.
    block_started: bool = False


@dataclass(slots=True)
class _Held:
    """A prepared transaction kept until COMMIT/ROLLBACK PREPARED.

    `buffer` is None for a transaction already streamed to a streaming plugin: only its
    outcome is left to deliver (stream_commit or stream_abort).
    """

    txn: Transaction
    buffer: SpillBuffer | None


@dataclass(slots=True)
class AssemblerStats:
    transactions: int = 0
    changes: int = 0
    streamed_buffered: int = 0
    skipped_by_origin: int = 0


class TransactionAssembler:
    """Drives one plugin instance from the messages of a replication session."""

    def __init__(
        self,
        plugin: OutputPlugin,
        ctx: DecodingContext,
        *,
        pool: SpillPool | None = None,
        only_local: bool = False,
        acks: Acknowledgement | None = None,
    ) -> None:
        self.plugin = plugin
        self.ctx = ctx
        self.caps: PluginCapabilities = capabilities(type(plugin))
        #: The plugin's `undecoded_changes`, when it takes runs of row changes at once.
        self._undecoded_changes = (
            plugin.undecoded_changes
            if plugin.undecoded_rows
            and type(plugin).undecoded_changes is not OutputPlugin.undecoded_changes
            else None
        )
        self.pool = pool or SpillPool()
        #: The consumer's acknowledgement state (the replication client's, when there is one).
        self.acks = acks if acks is not None else Acknowledgement()
        #: Skip transactions that carry an Origin (only-local, when the server does not).
        self.only_local = only_local
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self.stats = AssemblerStats()
        self._open: _Open | None = None
        self._streams: dict[int, _Stream] = {}
        self._in_block: _Stream | None = None
        self._held: dict[str, _Held] = {}

    def _done(self, end_lsn: Lsn) -> Lsn:
        """The plugin is through with the transaction ending at `end_lsn`."""
        self.acks.handled_upto(end_lsn)
        return end_lsn

    def reset(self) -> None:
        """A new session starts: the server resends whatever was in flight (and possibly
        transactions the plugin already finished: `Acknowledgement.already_delivered`)."""
        self._drop_open()
        for stream in self._streams.values():
            if stream.buffer is not None:
                stream.buffer.close()
        self._streams.clear()
        self._in_block = None
        # Held prepared transactions are complete; the server sends them again (nothing past
        # them was confirmed) and the copy received then replaces the one kept here.

    def close(self) -> None:
        self.reset()
        for gid, held in self._held.items():
            self.acks.release(gid)
            if held.buffer is not None:
                held.buffer.close()
        self._held.clear()
        self.pool.close()

    # -- the entry point -------------------------------------------------------------------

    def feed(self, message: PgoutputMessage, lsn: Lsn | None = None) -> Lsn | None:
        """Handle one message; the LSN now safe to confirm when a transaction ended."""
        self.ctx.write_location = lsn or None
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise TypeError(f"not a pgoutput message: {message!r}")
        return handler(self, message, lsn)

    # -- schema ----------------------------------------------------------------------------

    def _relation(self, message: Relation, lsn: Lsn | None) -> None:
        self.relations[message.relid] = message

    def _type(self, message: Type, lsn: Lsn | None) -> None:
        self.types[message.type_oid] = message

    def _relation_of(self, relid: int) -> Relation:
        relation = self.relations.get(relid)
        if relation is None:  # the decoder refuses such changes; a guard for hand-fed input
            raise UnknownRelation(
                f"relation id {relid} was never described by a Relation message",
                lsn=self.ctx.write_location,
            )
        return relation

    # -- ordinary and prepared transactions ------------------------------------------------

    def _begin(self, message: Begin, lsn: Lsn | None) -> None:
        txn = Transaction(message.xid, final_lsn=message.final_lsn, commit_ts=message.commit_ts)
        self._open = _Open(txn, prepared=False)

    def _begin_prepare(self, message: BeginPrepare, lsn: Lsn | None) -> None:
        txn = Transaction(
            message.xid,
            final_lsn=message.prepare_lsn,
            gid=message.gid,
            prepare_lsn=message.prepare_lsn,
            prepare_end_lsn=message.end_lsn,
            prepare_ts=message.prepare_ts,
        )
        self._open = _Open(txn, prepared=True)

    def _origin(self, message: Origin, lsn: Lsn | None) -> None:
        target = self._in_block.txn if self._in_block is not None else None
        if target is None and self._open is not None:
            target = self._open.txn
        if target is not None:
            target.origin = message.origin_name
            target.origin_lsn = message.origin_lsn

    def _skips_origin(self, txn: Transaction) -> bool:
        if txn.origin is None:
            return False
        if self.only_local:
            return True
        return self.caps.has("filter_by_origin") and bool(
            self.plugin.filter_by_origin(self.ctx, txn.origin)
        )

    def _started(self) -> _Open:
        """The open transaction, with its begin callback run (or its fate decided)."""
        opened = self._open
        if opened is None:
            raise UnexpectedMessage(
                "a change or end of transaction outside a transaction (no Begin before it)",
                lsn=self.ctx.write_location,
            )
        if opened.fate is not Fate.PENDING:
            return opened
        txn = opened.txn
        self.ctx.write_xid = txn.xid
        if self._skips_origin(txn):
            opened.fate = Fate.SKIP
            self.stats.skipped_by_origin += 1
        elif opened.prepared and not self._takes_prepare(txn):
            opened.fate = Fate.HOLD
            opened.held = self.pool.buffer(f"gid-{txn.xid}")
        else:
            opened.fate = Fate.DELIVER
            if opened.prepared:
                self.plugin.begin_prepare(self.ctx, txn)
            else:
                self.plugin.begin(self.ctx, txn)
        return opened

    def _takes_prepare(self, txn: Transaction) -> bool:
        """Decode this prepared transaction at PREPARE (else at COMMIT PREPARED)."""
        if not (self.caps.two_phase and self.ctx.two_phase):
            return False
        assert txn.gid is not None
        if self.caps.has("filter_prepare"):
            return not self.plugin.filter_prepare(self.ctx, txn.xid, txn.gid)
        return True

    def _commit(self, message: Commit, lsn: Lsn | None) -> Lsn | None:
        opened = self._started()
        self._open = None
        txn = opened.txn
        txn.final_lsn, txn.end_lsn, txn.commit_ts = (
            message.commit_lsn,
            message.end_lsn,
            message.commit_ts,
        )
        if opened.fate is Fate.DELIVER:
            self.ctx.write_location = message.commit_lsn
            self.plugin.commit(self.ctx, txn, message.commit_lsn)
            self.stats.transactions += 1
        return self._done(message.end_lsn)

    def _prepare(self, message: Prepare, lsn: Lsn | None) -> Lsn | None:
        opened = self._started()
        self._open = None
        txn = opened.txn
        if opened.fate is Fate.DELIVER:
            self.ctx.write_location = message.prepare_lsn
            self.plugin.prepare(self.ctx, txn, message.prepare_lsn)
            return self._done(message.end_lsn)
        if opened.fate is Fate.HOLD:
            assert opened.held is not None and txn.gid is not None
            self._hold(txn, opened.held)
            return None
        return self._done(message.end_lsn)  # skipped by origin

    def _hold(self, txn: Transaction, buffer: SpillBuffer | None) -> None:
        assert txn.gid is not None
        previous = self._held.pop(txn.gid, None)
        if previous is not None and previous.buffer is not None:
            previous.buffer.close()
        assert txn.prepare_lsn is not None
        self.acks.hold(txn.gid, txn.prepare_lsn)
        self._held[txn.gid] = _Held(txn, buffer)

    def _commit_prepared(self, message: CommitPrepared, lsn: Lsn | None) -> Lsn | None:
        held = self._held.pop(message.gid, None)
        self.acks.release(message.gid)
        txn = held.txn if held is not None else Transaction(message.xid, gid=message.gid)
        txn.final_lsn, txn.end_lsn, txn.commit_ts = (
            message.commit_lsn,
            message.end_lsn,
            message.commit_ts,
        )
        self.ctx.write_xid = txn.xid
        self.ctx.write_location = message.commit_lsn
        if held is not None and held.buffer is None:
            self.plugin.stream_commit(self.ctx, txn, message.commit_lsn)
            self.stats.transactions += 1
        elif held is not None:
            buffer = cast(SpillBuffer, held.buffer)
            try:
                self._replay(txn, buffer, prepared=False)
            finally:
                buffer.close()
            self.plugin.commit(self.ctx, txn, message.commit_lsn)
            self.stats.transactions += 1
        elif self.caps.two_phase and self.ctx.two_phase:
            self.plugin.commit_prepared(self.ctx, txn, message.commit_lsn)
        else:
            log.warning(
                "COMMIT PREPARED %r (xid %d) at %s: its PREPARE was never received, "
                "nothing to deliver",
                message.gid,
                message.xid,
                message.commit_lsn,
            )
        return self._done(message.end_lsn)

    def _rollback_prepared(self, message: RollbackPrepared, lsn: Lsn | None) -> Lsn | None:
        held = self._held.pop(message.gid, None)
        self.acks.release(message.gid)
        if held is not None and held.buffer is None:
            self.ctx.write_xid = held.txn.xid
            self.plugin.stream_abort(self.ctx, held.txn, None)
        elif held is not None:
            cast(SpillBuffer, held.buffer).close()
        elif self.caps.two_phase and self.ctx.two_phase:
            txn = Transaction(
                message.xid,
                gid=message.gid,
                prepare_end_lsn=message.prepare_end_lsn,
                prepare_ts=message.prepare_ts,
                end_lsn=message.rollback_end_lsn,
                commit_ts=message.rollback_ts,
            )
            self.ctx.write_xid = txn.xid
            self.plugin.rollback_prepared(
                self.ctx, txn, message.prepare_end_lsn, message.prepare_ts
            )
        return self._done(message.rollback_end_lsn)

    # -- changes, truncate, messages ---------------------------------------------------------

    def _change(self, message: Insert | Update | Delete | UndecodedChange, lsn: Lsn | None) -> None:
        relation = self._relation_of(message.relid)
        if type(message) is UndecodedChange:
            raw = message.message
            action = _ACTIONS[message.code]
            change = _make_change(action, relation, None, None, None, lsn, message.xid, raw)
        elif type(message) is Insert:
            change = Change(ChangeAction.INSERT, relation, message.new, lsn=lsn, subxid=message.xid)
        elif type(message) is Update:
            change = Change(
                ChangeAction.UPDATE,
                relation,
                message.new,
                message.old,
                message.old_kind,
                lsn,
                message.xid,
            )
        else:
            delete = cast(Delete, message)
            change = Change(
                ChangeAction.DELETE,
                relation,
                None,
                delete.old,
                delete.old_kind,
                lsn,
                delete.xid,
            )
        opened = self._open
        if self._in_block is None and opened is not None and opened.fate is Fate.DELIVER:
            # the hot path: a change of a transaction whose begin callback ran
            self._deliver_change(opened.txn, change, streamed=False)
        else:
            self._entry(_CHANGE, change, message.xid, _change_size(message))

    def _changes(self, message: UndecodedChanges, lsn: Lsn | None) -> None:
        take = self._undecoded_changes
        if (
            take is not None
            and self._in_block is None
            and self._open is not None
            and (opened := self._started()).fate is Fate.DELIVER
        ):  # the hot path: all at once, to a transaction whose begin callback ran
            txn = opened.txn
            count = len(message.frames)
            txn.nentries += count
            self.stats.changes += count
            self.ctx.write_xid = txn.xid
            take(self.ctx, txn, self._relation_of, message)
            return
        for start, change in message.changes():
            self.ctx.write_location = start
            self._change(change, start)

    def _truncate(self, message: Truncate, lsn: Lsn | None) -> None:
        truncation = Truncation(
            message.cascade, message.restart_identity, lsn, message.xid, message.relids
        )
        self._entry(_TRUNCATE, truncation, message.xid, 64 + 8 * len(message.relids))

    def _message(self, message: Message, lsn: Lsn | None) -> Lsn | None:
        if not message.transactional:
            if self.caps.has("message"):
                self.ctx.write_xid = None
                self.plugin.message(
                    self.ctx, None, message.lsn, False, message.prefix, message.content
                )
            end = end_lsn_of(message)
            return self._done(end) if self._idle and end is not None else None
        self._entry(_MESSAGE, message, message.xid, 64 + len(message.content))
        return None

    @property
    def _idle(self) -> bool:
        return self._open is None and self._in_block is None

    def _entry(self, kind: str, entry: object, subxid: int | None, size: int) -> None:
        """Route a change, truncate or transactional message to its transaction."""
        if self._in_block is not None:
            stream = self._in_block
            self._decide_stream(stream)
            if stream.skip:
                return
            if stream.buffer is not None:
                stream.buffer.append(size, subxid, (kind, entry))
                return
            self._stream_block_begin(stream)
            self._deliver(stream.txn, kind, entry, streamed=True)
            return
        opened = self._started()
        if opened.fate is Fate.DELIVER:
            self._deliver(opened.txn, kind, entry, streamed=False)
        elif opened.fate is Fate.HOLD:
            assert opened.held is not None
            opened.held.append(size, None, (kind, entry))

    def _deliver(self, txn: Transaction, kind: str, entry: object, streamed: bool) -> None:
        """Call the plugin for one entry of `txn`."""
        if kind == _CHANGE:
            assert isinstance(entry, Change)
            self._deliver_change(txn, entry, streamed)
            return
        plugin, ctx = self.plugin, self.ctx
        ctx.write_xid = txn.xid
        if kind == _TRUNCATE:
            assert isinstance(entry, Truncation)
            name = "stream_truncate" if streamed else "truncate"
            if not self.caps.has(name):
                return  # truncates are ignored without a truncate callback
            ctx.write_location = entry.lsn
            txn.nentries += 1
            relations = [self._relation_of(relid) for relid in entry.relids]
            getattr(plugin, name)(ctx, txn, relations, entry)
        else:
            assert isinstance(entry, Message)
            name = "stream_message" if streamed else "message"
            if self.caps.has(name):
                ctx.write_location = entry.lsn
                getattr(plugin, name)(ctx, txn, entry.lsn, True, entry.prefix, entry.content)

    def _deliver_change(self, txn: Transaction, change: Change, streamed: bool) -> None:
        ctx = self.ctx
        ctx.write_xid = txn.xid
        ctx.write_location = change.lsn
        txn.nentries += 1
        self.stats.changes += 1
        if streamed:
            self.plugin.stream_change(ctx, txn, change.relation, change)
        else:
            self.plugin.change(ctx, txn, change.relation, change)

    def _replay(self, txn: Transaction, buffer: SpillBuffer, prepared: bool) -> None:
        """Deliver a buffered transaction as an ordinary (or prepared) one, up to its end."""
        if prepared:
            self.plugin.begin_prepare(self.ctx, txn)
        else:
            self.plugin.begin(self.ctx, txn)
        for kind, entry in buffer:
            self._deliver(txn, kind, entry, streamed=False)

    # -- streamed transactions ---------------------------------------------------------------

    def _stream_start(self, message: StreamStart, lsn: Lsn | None) -> None:
        stream = self._streams.get(message.xid)
        if stream is None:
            txn = Transaction(message.xid, streamed=self._passes_streams)
            stream = self._streams[message.xid] = _Stream(txn)
        stream.block_started = False
        self._in_block = stream

    @property
    def _passes_streams(self) -> bool:
        return self.caps.streaming and self.ctx.streaming

    def _decide_stream(self, stream: _Stream) -> None:
        """Once per streamed transaction, when its Origin (sent after Stream Start) is known."""
        if stream.decided:
            return
        stream.decided = True
        if self._skips_origin(stream.txn):
            stream.skip = True
            self.stats.skipped_by_origin += 1
        elif not self._passes_streams:
            stream.buffer = self.pool.buffer(f"xid-{stream.txn.xid}")
            self.stats.streamed_buffered += 1

    def _stream_block_begin(self, stream: _Stream) -> None:
        if not stream.block_started:
            stream.block_started = True
            self.ctx.write_xid = stream.txn.xid
            self.plugin.stream_start(self.ctx, stream.txn)

    def _stream_stop(self, message: StreamStop, lsn: Lsn | None) -> None:
        stream = self._in_block
        self._in_block = None
        if stream is None:
            return
        self._decide_stream(stream)
        if stream.skip or stream.buffer is not None:
            return
        self._stream_block_begin(stream)
        self.ctx.write_xid = stream.txn.xid
        self.plugin.stream_stop(self.ctx, stream.txn)

    def _stream_commit(self, message: StreamCommit, lsn: Lsn | None) -> Lsn | None:
        stream = self._streams.pop(message.xid, None)
        txn = stream.txn if stream is not None else Transaction(message.xid)
        txn.final_lsn, txn.end_lsn, txn.commit_ts = (
            message.commit_lsn,
            message.end_lsn,
            message.commit_ts,
        )
        self.ctx.write_xid = txn.xid
        if stream is None or stream.skip or self.acks.already_delivered(message):
            if stream is not None and stream.buffer is not None:
                stream.buffer.close()
            return self._done(message.end_lsn)
        if stream.buffer is not None:
            try:
                self._replay(txn, stream.buffer, prepared=False)
            finally:
                stream.buffer.close()
            self.ctx.write_location = message.commit_lsn
            self.plugin.commit(self.ctx, txn, message.commit_lsn)
        else:
            self.ctx.write_location = message.commit_lsn
            self.plugin.stream_commit(self.ctx, txn, message.commit_lsn)
        self.stats.transactions += 1
        return self._done(message.end_lsn)

    def _stream_abort(self, message: StreamAbort, lsn: Lsn | None) -> Lsn | None:
        stream = self._streams.get(message.xid)
        if stream is None:
            return None  # aborted before anything of it reached us
        if not message.is_toplevel:
            if stream.buffer is not None:
                stream.buffer.discard_tag(message.subxid)
            elif not stream.skip:
                self.ctx.write_xid = message.subxid
                sub = Transaction(message.subxid, streamed=True, toptxn=stream.txn)
                self.plugin.stream_abort(self.ctx, sub, message.abort_lsn)
            return None
        del self._streams[message.xid]
        if stream.buffer is not None:
            stream.buffer.close()
        elif not stream.skip:
            self.ctx.write_xid = message.xid
            self.plugin.stream_abort(self.ctx, stream.txn, message.abort_lsn)
        return self._done(message.abort_lsn) if message.abort_lsn else None

    def _stream_prepare(self, message: StreamPrepare, lsn: Lsn | None) -> Lsn | None:
        stream = self._streams.pop(message.xid, None)
        txn = stream.txn if stream is not None else Transaction(message.xid)
        txn.gid = message.gid
        txn.final_lsn = txn.prepare_lsn = message.prepare_lsn
        txn.prepare_end_lsn = message.end_lsn
        txn.prepare_ts = message.prepare_ts
        self.ctx.write_xid = txn.xid
        self.ctx.write_location = message.prepare_lsn
        if stream is None or stream.skip:
            return self._done(message.end_lsn)
        if stream.buffer is None:
            if self._takes_prepare(txn):
                self.plugin.stream_prepare(self.ctx, txn, message.prepare_lsn)
                return self._done(message.end_lsn)
            self._hold(txn, None)  # the server would decide at COMMIT/ROLLBACK PREPARED
            return None
        if self._takes_prepare(txn):
            try:
                self._replay(txn, stream.buffer, prepared=True)
            finally:
                stream.buffer.close()
            self.plugin.prepare(self.ctx, txn, message.prepare_lsn)
            return self._done(message.end_lsn)
        self._hold(txn, stream.buffer)
        return None

    def _drop_open(self) -> None:
        if self._open is not None and self._open.held is not None:
            self._open.held.close()
        self._open = None


def _change_size(message: Insert | Update | Delete | UndecodedChange) -> int:
    """Approximate memory of a buffered change: Python objects plus the values."""
    if type(message) is UndecodedChange:
        return 100 + len(message.message)
    size = 200
    for row in (getattr(message, "old", None), getattr(message, "new", None)):
        if row is not None:
            size += 120 + 40 * len(row.kinds) + sum(map(len, filter(None, row.values)))
    return size


_HANDLERS: dict[type, Callable[[TransactionAssembler, Any, Lsn | None], Lsn | None]] = {
    Begin: TransactionAssembler._begin,
    BeginPrepare: TransactionAssembler._begin_prepare,
    Origin: TransactionAssembler._origin,
    Relation: TransactionAssembler._relation,
    Type: TransactionAssembler._type,
    Insert: TransactionAssembler._change,
    Update: TransactionAssembler._change,
    Delete: TransactionAssembler._change,
    UndecodedChange: TransactionAssembler._change,
    UndecodedChanges: TransactionAssembler._changes,
    Truncate: TransactionAssembler._truncate,
    Message: TransactionAssembler._message,
    Commit: TransactionAssembler._commit,
    Prepare: TransactionAssembler._prepare,
    CommitPrepared: TransactionAssembler._commit_prepared,
    RollbackPrepared: TransactionAssembler._rollback_prepared,
    StreamStart: TransactionAssembler._stream_start,
    StreamStop: TransactionAssembler._stream_stop,
    StreamCommit: TransactionAssembler._stream_commit,
    StreamAbort: TransactionAssembler._stream_abort,
    StreamPrepare: TransactionAssembler._stream_prepare,
}
