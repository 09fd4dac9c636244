"""A replication client that survives dropped connections and server restarts.

Each session is a `LogicalStream`. When one breaks, the client reconnects with exponential
backoff and resumes from the last position it reported as flushed: the server then sends
everything after it again, and the client skips the transactions the consumer already handled
(`Acknowledgement.already_delivered`), so the consumer sees each committed transaction once.
One `Acknowledgement` spans all the sessions of a client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from pgcdc.errors import ConnectionFailed, ConnectionLost, SlotInUse
from pgcdc.protocol import (
    INVALID_LSN,
    Lsn,
    PgoutputMessage,
    XLogData,
)
from pgcdc.replication.acknowledgement import Acknowledgement
from pgcdc.replication.connection import ReplicationConnection
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.stream import LogicalStream

__all__ = ["ReplicationClient"]

log = logging.getLogger("pgcdc.replication")


class ReplicationClient:
    """Iterate to get ``(XLogData, message)`` pairs; call `confirm(end_lsn)` once durable.

    Use it as a context manager: leaving it sends the final status update and ends the session.
    `acknowledge=False` never moves the slot (a peek). `reconnect_timeout` bounds how long the
    client keeps retrying after a connection was lost (None: forever). Errors on the first
    connection are raised at once: a wrong password or a missing slot does not get better by
    waiting.
    """

    def __init__(
        self,
        conninfo: str,
        slot: str,
        options: StreamOptions,
        *,
        start_lsn: Lsn = INVALID_LSN,
        endpos: Lsn | None = None,
        until_idle: bool = False,
        status_interval: float = 10.0,
        reconnect: bool = True,
        reconnect_timeout: float | None = 300.0,
        max_backoff: float = 10.0,
        on_frame: Callable[[bytes], None] | None = None,
        on_session: Callable[[LogicalStream], None] | None = None,
        acknowledge: bool = True,
    ) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.options = options
        self.acks = Acknowledgement(start=Lsn(start_lsn))
        self.endpos = endpos
        self.until_idle = until_idle
        self.status_interval = status_interval
        self.reconnect = reconnect
        self.reconnect_timeout = reconnect_timeout
        self.max_backoff = max_backoff
        self.on_frame = on_frame
        self.on_session = on_session
        self.acknowledge = acknowledge
        self.stream: LogicalStream | None = None
        self.sessions = 0
        self._stop = False

    def confirm(self, lsn: Lsn) -> None:
        """Everything up to `lsn` is durably handled downstream; the slot may move there
        (at the next status update, also of a session opened later)."""
        self.acks.confirm(lsn)

    def stop(self) -> None:
        """End iteration after the current message, or within a second when idle.

        Safe to call from another thread or a signal handler; leaving the client's context
        then reports the final position.
        """
        self._stop = True
        if self.stream is not None:
            self.stream.stop_requested = True

    def _open(self) -> LogicalStream:
        conn = ReplicationConnection.connect(self.conninfo)
        try:
            stream = LogicalStream(
                conn,
                self.slot,
                self.options,
                self.acks.flush_lsn,
                status_interval=self.status_interval,
                endpos=self.endpos,
                until_idle=self.until_idle and self.sessions == 0,
                on_frame=self.on_frame,
                acknowledge=self.acknowledge,
                acks=self.acks,
            )
            stream.start()
        except BaseException:
            conn.close()
            raise
        if self.until_idle and self.endpos is None:
            self.endpos = stream.endpos
        self.sessions += 1
        if self.on_session is not None:
            self.on_session(stream)
        return stream

    def close(self) -> None:
        """Send the final status (with every confirm so far) and end the session cleanly."""
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            stream.stop()
        except ConnectionLost:
            pass  # nothing more can be reported; the slot keeps what it had
        finally:
            stream.conn.close()

    def __enter__(self) -> ReplicationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[XLogData, PgoutputMessage]]:
        """Messages until endpos, `stop()` or an error; the session stays open for `close()`."""
        lost_since: float | None = None
        backoff = 0.2
        while not self._stop:
            try:
                self.stream = stream = self._open()
            except (ConnectionFailed, ConnectionLost, SlotInUse) as exc:
                if lost_since is None or not self._may_retry(lost_since):
                    raise
                log.warning("reconnecting in %.1fs: %s", backoff, exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            lost_since, backoff = None, 0.2
            try:
                yield from self._deliver(stream)
                return
            except ConnectionLost as exc:
                self.stream = None
                stream.conn.close()
                if not self.reconnect:
                    raise
                lost_since = time.monotonic()
                log.warning(
                    "replication connection lost at %s, resuming: %s", self.acks.flush_lsn, exc
                )

    def _may_retry(self, lost_since: float) -> bool:
        return self.reconnect and (
            self.reconnect_timeout is None or time.monotonic() - lost_since < self.reconnect_timeout
        )

    def _deliver(self, stream: LogicalStream) -> Iterator[tuple[XLogData, PgoutputMessage]]:
        """The stream's messages minus what the consumer already handled."""
        for item in self.acks.skip_delivered(stream):
            yield item
            if self._stop:
                return
