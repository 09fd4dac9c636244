"""The replication session behind a Spark stream: a background thread that fills the spool.

It runs the output plugin machinery (`PluginRunner`, so streamed transactions, subtransaction
aborts and prepared transactions are assembled exactly as for any plugin) with `SpoolWriter`,
which writes each committed transaction to the `Spool`. Nothing is confirmed to the server
until Spark has committed a batch (`confirm`): a crash anywhere loses nothing, the slot sends
the rest again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pgcdc.decoding import Change, DecodingContext, OutputPlugin, Transaction, Truncation
from pgcdc.decoding.runner import PluginRunner
from pgcdc.errors import SourceError
from pgcdc.protocol import Lsn, Message, Relation, StreamingMode, Truncate, UndecodedChanges
from pgcdc.protocol.messages import TRUNCATE_CASCADE, TRUNCATE_RESTART_IDENTITY
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.stream import LogicalStream
from pgcdc.spool._spool import Spool

__all__ = ["HOLD_COMMITS_SECONDS", "SpoolWriter", "Spooler"]

#: How long a committed transaction may wait in the spool before planning sees it: under a
#: steady load of small transactions, one flush and one wake-up per group of them instead
#: of per transaction, for at most this much freshness.
HOLD_COMMITS_SECONDS = 0.02
#: How long a trickle of messages may gather in the socket before the session reads it
#: (`ReplicationConnection.gather_seconds`): at 5,000 changes/s this took a fifth to a
#: quarter off the session thread's CPU; at 10,000/s the thread is rarely caught up.
GATHER_SECONDS = 0.01

log = logging.getLogger(__name__)


class SpoolWriter(OutputPlugin):
    """An output plugin whose output is the spool: committed transactions, their changes as
    the server sent them (`undecoded_rows`: nothing is decoded on the driver)."""

    undecoded_rows = True
    spool: Spool

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        self.spool.begin(txn.xid, txn.final_lsn)

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: Relation, change: Change
    ) -> None:
        assert change.raw is not None, "the spool's session decodes no rows"
        self.spool.change(relation, change.lsn, change.raw)

    def undecoded_changes(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relation_of: Callable[[int], Relation],
        changes: UndecodedChanges,
    ) -> None:
        self.spool.changes(relation_of, changes)

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: list[Relation],
        change: Truncation,
    ) -> None:
        options = (TRUNCATE_CASCADE if change.cascade else 0) | (
            TRUNCATE_RESTART_IDENTITY if change.restart_seqs else 0
        )
        relids = change.relids or tuple(r.relid for r in relations)
        self.spool.truncate(relations, Truncate(options, relids), change.lsn)

    def message(
        self,
        ctx: DecodingContext,
        txn: Transaction | None,
        lsn: Lsn,
        transactional: bool,
        prefix: str,
        content: bytes,
    ) -> None:
        message = Message(int(transactional), lsn, prefix, content)
        if txn is not None and transactional:
            self.spool.message(message)
            return
        # A message outside any transaction is a unit of its own, ordered by its position.
        self.spool.begin()
        self.spool.message(message)
        self.spool.commit(lsn, Lsn(lsn + 1), None, None, None)

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        assert txn.end_lsn is not None
        self.spool.commit(commit_lsn, txn.end_lsn, txn.xid, txn.commit_ts, txn.origin)


class Spooler:
    """Owns the replication session of one stream; `error` is set if the session died."""

    def __init__(
        self,
        conninfo: str,
        slot: str,
        options: StreamOptions,
        spool: Spool,
        *,
        streaming: StreamingMode | None = None,
        status_interval: float = 10.0,
        on_session: Callable[[LogicalStream], None] | None = None,
        hold_commits: float = HOLD_COMMITS_SECONDS,
    ) -> None:
        self.spool = spool
        spool.hold_seconds = hold_commits  # published by each session's `on_wait`
        #: Called with each new session once it streams (after a reconnect too).
        self.on_session = on_session
        self.runner = PluginRunner(
            conninfo,
            slot,
            SpoolWriter,
            options,
            auto_confirm=False,
            streaming=streaming,
            status_interval=status_interval,
            on_session=self._on_session,
        )
        self.runner.plugin.spool = spool  # type: ignore[attr-defined]
        self.error: BaseException | None = None
        #: The session thread's CPU seconds, once it ended (receiving, decoding the message
        #: headers, assembling transactions, writing the spool).
        self.cpu_seconds = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"pgcdc-spooler-{slot}", daemon=True)

    def _on_session(self, stream: LogicalStream) -> None:
        stream.ping_when_idle = True
        stream.on_wait = self.spool.publish_due
        stream.conn.gather_seconds = GATHER_SECONDS
        if self.on_session is not None:
            self.on_session(stream)

    def start(self) -> Spooler:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as exc:  # reported to the pipeline's thread by `check`
            self.error = exc
            log.debug("replication session ended", exc_info=True)
        finally:
            self.cpu_seconds = time.thread_time()
            with self.spool.changed:
                self.spool.changed.notify_all()

    def check(self) -> None:
        """Raise the session's error, if it died."""
        if self.error is not None:
            raise SourceError(
                f"the replication session of slot {self.runner.slot!r} failed: {self.error}"
            ) from self.error
        if not self._thread.is_alive() and not self._stopping and self._thread.ident is not None:
            raise SourceError(f"the replication session of slot {self.runner.slot!r} ended")

    @property
    def server_position(self) -> Lsn:
        """How far the server has sent (a keepalive's walEnd when idle): every transaction
        that committed before it is in the spool, published (0 when that cannot be said: in
        the middle of a transaction, or while commits wait to be published)."""
        client = self.runner.client
        if client is None or client.stream is None:
            return Lsn(0)
        wal_end = client.acks.keepalive_wal_end  # read first: what came before it is spooled
        if not client.acks.at_boundary or self.spool.holding:
            return Lsn(0)
        return max(wal_end, self.spool.last_lsn or Lsn(0))

    def wait_for(self, lsn: Lsn, timeout: float, *, after: Lsn | None = None) -> bool:
        """Wait until the spool holds everything up to `lsn` (or, given `after`, anything
        past it); False on timeout."""
        deadline = time.monotonic() + timeout
        with self.spool.changed:
            while True:
                self.check()
                last = self.spool.last_lsn
                if last is not None and (last >= lsn or (after is not None and last > after)):
                    return True
                if self.server_position >= lsn:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.spool.changed.wait(min(remaining, 0.2))

    def reached(self, lsn: Lsn, *, after: Lsn) -> bool:
        """Whether everything that committed up to `lsn` has been spooled (and nothing
        spooled after `after` waits): the session is idle past it, or has spooled past it."""
        last = self.spool.last_lsn
        if last is not None and last > after and last <= lsn:
            return False
        return (last is not None and last >= lsn) or self.server_position >= lsn

    def wait_for_more(self, after: Lsn, timeout: float) -> None:
        """Wait until something past `after` is spooled, or `timeout`."""
        deadline = time.monotonic() + timeout
        with self.spool.changed:
            while (self.spool.last_lsn or Lsn(0)) <= after:
                self.check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self.spool.changed.wait(min(remaining, 0.2))

    def confirm(self, lsn: Lsn) -> None:
        """Spark committed everything up to `lsn`: the slot may move there."""
        self.runner.confirm(lsn)
        self.spool.release(lsn)

    def stop(self) -> None:
        self._stopping = True
        self.runner.stop()
        self._thread.join(timeout=30)
        self.spool.close()
