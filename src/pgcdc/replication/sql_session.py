"""An ordinary (not a replication) connection to the source that outlives the server's restarts.

The replication session reconnects when the server restarts or fails over; every other
connection a long-running consumer keeps (catalog lookups, values read per key, slot status)
must too, or the first query after a restart ends the pipeline with the server's
``terminating connection due to administrator command``. `SqlSession.run` gives a callable a
live connection and, when the connection is lost (or cannot be made) while it runs, connects
again with exponential backoff and runs it again, for at most `reconnect_timeout` seconds. The
callables are read-only, so running one twice is harmless. Errors the server reports about the
query itself (a missing table, a syntax error) are not connection losses and pass through.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from pgcdc.errors import ConnectionFailed, ConnectionLost, InvalidConninfo, first_line
from pgcdc.replication.slots import connect_sql

__all__ = ["SqlSession"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: SQLSTATE classes of a connection that is gone or not yet accepting: 08 connection
#: exception, 57P0x admin shutdown / crash shutdown / cannot connect now.
_LOST_STATES = ("08", "57P01", "57P02", "57P03")


def _lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection (not the query) failed; a connection string that
    cannot be parsed never connects (it is said at once, not retried)."""
    if isinstance(exc, InvalidConninfo):
        return False
    if isinstance(exc, psycopg.InterfaceError | ConnectionFailed):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = getattr(exc, "sqlstate", None)
        return state is None or state.startswith(_LOST_STATES)
    return False


class SqlSession:
    """A read-only source connection, opened on first use and made again when lost."""

    def __init__(
        self,
        conninfo: str,
        *,
        pinned_settings: bool = False,
        reconnect_timeout: float = 300.0,
        max_backoff: float = 10.0,
    ) -> None:
        self.conninfo = conninfo
        self.pinned_settings = pinned_settings
        self.reconnect_timeout = reconnect_timeout
        self.max_backoff = max_backoff
        self._conn: psycopg.Connection | None = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = connect_sql(self.conninfo, pinned_settings=self.pinned_settings)
            conn.execute("SET default_transaction_read_only = on")
            self._conn = conn
        return self._conn

    def run(self, work: Callable[[psycopg.Connection], T]) -> T:
        """`work(connection)`, run again on a new connection while the server is away."""
        lost_since: float | None = None
        backoff = 0.2
        while True:
            try:
                result = work(self._connection())
            except Exception as exc:
                if not _lost(exc):
                    raise
                self.close()
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    log.warning("source connection lost, connecting again: %s", first_line(exc))
                if now - lost_since >= self.reconnect_timeout:
                    raise ConnectionLost(
                        f"gave up connecting to the source again after "
                        f"{now - lost_since:.0f} s: {first_line(exc)}"
                    ) from None
                time.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            if lost_since is not None:
                log.info("source connection back after %.0f s", time.monotonic() - lost_since)
            return result

    def query(self, sql: Any, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of a read-only query."""
        return self.run(lambda conn: conn.execute(sql, params or None).fetchall())

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a connection already broken
                self._conn.close()
            self._conn = None

    def __enter__(self) -> SqlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
