"""A replication client that survives dropped connections and server restarts.

Each session is a `LogicalStream`. When one breaks, the client reconnects with exponential
backoff and resumes from the last position it reported as flushed: the server then sends
everything after it again, and the client skips the transactions the consumer already handled
(`Acknowledgement.already_delivered`), so the consumer sees each committed transaction once.
One `Acknowledgement` spans all the sessions of a client.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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

__all__ = ["ReplicationClient", "RetryState"]

log = logging.getLogger("pgcdc.replication")


@dataclass(frozen=True, slots=True)
class RetryState:
    """Where reconnecting stands, for a display: given to `on_retry` after each failed try."""

    attempts: int
    #: Seconds since the connection was lost.
    down_for: float
    #: Seconds until the client gives up (None: it never does).
    gives_up_in: float | None
    #: Seconds until the next attempt.
    next_in: float
    error: str


def _check_seconds(name: str, value: float | None, *, positive: bool) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        least = "above 0" if positive else "0 or more"
        raise ValueError(f"{name} must be a finite number of seconds {least}, got {value}")


class ReplicationClient:
    """Iterate to get ``(XLogData, message)`` pairs; call `confirm(end_lsn)` once durable.

    Use it as a context manager: leaving it sends the final status update and ends the session.
    `acknowledge=False` never moves the slot (a peek). `reconnect_timeout` bounds how long the
    client keeps retrying after a connection was lost (None: forever); the loss is logged
    once, each failed attempt goes to `on_retry`. Errors on the first connection are raised
    at once: a wrong password or a missing slot does not get better by waiting.
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
        on_retry: Callable[[RetryState], None] | None = None,
        acknowledge: bool = True,
        before_status: Callable[[], None] | None = None,
        undecoded_rows: bool = False,
    ) -> None:
        _check_seconds("status_interval", status_interval, positive=True)
        _check_seconds("reconnect_timeout", reconnect_timeout, positive=False)
        _check_seconds("max_backoff", max_backoff, positive=True)
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
        self.on_retry = on_retry
        self.before_status = before_status
        self.acknowledge = acknowledge
        self.undecoded_rows = undecoded_rows
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

    def _open(self, time_left: float | None) -> LogicalStream:
        """A started session; a reconnect's `time_left` caps the connection attempt (to no less
        than libpq's least connect_timeout, 2 s)."""
        timeout = None if time_left is None else max(time_left, 2.0)
        conn = ReplicationConnection.connect(self.conninfo, timeout=timeout)
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
                before_status=self.before_status,
                acknowledge=self.acknowledge,
                acks=self.acks,
                undecoded_rows=self.undecoded_rows,
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
        attempts = 0
        backoff = 0.2
        while not self._stop:
            try:
                self.stream = stream = self._open(self._time_left(lost_since))
            except (ConnectionFailed, ConnectionLost, SlotInUse) as exc:
                if lost_since is None:
                    raise
                attempts += 1
                down_for = time.monotonic() - lost_since
                if not self._may_retry(lost_since):
                    raise ConnectionLost(
                        f"gave up reconnecting after {down_for:.0f} s ({attempts} attempt"
                        f"{'s' if attempts > 1 else ''}; the limit is "
                        f"{self.reconnect_timeout:.0f} s): {exc}"
                    ) from None
                left = self._time_left(lost_since)
                pause = backoff if left is None else min(backoff, left)
                if self.on_retry is not None:
                    self.on_retry(RetryState(attempts, down_for, left, pause, str(exc)))
                log.info("reconnecting in %.1fs: %s", pause, exc)
                time.sleep(pause)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            if lost_since is not None:
                log.warning(
                    "reconnected after %.0f s (%d failed attempts)",
                    time.monotonic() - lost_since,
                    attempts,
                )
            lost_since, attempts, backoff = None, 0, 0.2
            # `stop()` while the session opened; later ones set it themselves: the stream
            # ends after the message they came during
            stream.stop_requested = self._stop
            try:
                yield from self.acks.skip_delivered(stream)
                return
            except ConnectionLost as exc:
                self.stream = None
                stream.conn.close()
                if not self.reconnect:
                    raise
                lost_since = time.monotonic()
                limit = self.reconnect_timeout
                log.warning(
                    "replication connection lost at %s, reconnecting (%s): %s",
                    self.acks.flush_lsn,
                    "no time limit" if limit is None else f"giving up after {limit:.0f} s",
                    exc,
                )

    def _may_retry(self, lost_since: float) -> bool:
        left = self._time_left(lost_since)
        return self.reconnect and (left is None or left > 0)

    def _time_left(self, lost_since: float | None) -> float | None:
        """Seconds of reconnecting left (None: no limit, or not reconnecting)."""
        if lost_since is None or self.reconnect_timeout is None:
            return None
        return max(0.0, self.reconnect_timeout - (time.monotonic() - lost_since))
