"""Read-only catalog access for output plugins, over a separate ordinary connection.

The server gives plugins the catalog as of the change being decoded (a historic snapshot);
over pgoutput we only have the current catalog. What plugins need from it (type names,
which words need quoting) rarely changes, so answers are cached for the session. The
connection is opened on first use and is read-only; it has the settings pgcdc's walsender
session pins (`DEFAULT_SESSION_SETTINGS`), so the values it prints (a column default's
``pg_get_expr``, say) read as the server's plugins print them in that session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pgcdc.replication.sql_session import SqlSession

__all__ = ["Catalog", "quote_identifier", "wait_until_visible"]


log = logging.getLogger(__name__)

#: Whether a transaction (its 32-bit xid) is in progress for a snapshot taken now: at or past
#: the snapshot's xmax (the latest completed xid + 1: a transaction still committing need not
#: be listed), or listed (xids compared modulo 2^32, as the server does).
_IN_PROGRESS = """
SELECT (%s - pg_catalog.txid_snapshot_xmax(s) %% 4294967296 + 4294967296) %% 4294967296
         < 2147483648
       OR EXISTS (SELECT FROM pg_catalog.txid_snapshot_xip(s) x WHERE x %% 4294967296 = %s)
FROM pg_catalog.txid_current_snapshot() s"""


def wait_until_visible(
    query: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]],
    xid: int,
    timeout: float = 10.0,
) -> bool:
    """Wait until transaction `xid`, whose commit the stream brought, is visible to the
    catalog reads that follow (`query`: a connection's). The walsender sends a transaction
    once its commit record is flushed; the committing backend makes it visible to other
    sessions only after that (and after a synchronous standby confirmed it): a read in the
    window sees the catalog without the transaction's DDL (a column just added is not
    there). Gives up after `timeout` seconds (a synchronous standby that waits for this
    very pipeline would never let it through); whether it became visible."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while query(_IN_PROGRESS, (xid, xid))[0][0]:
        if time.monotonic() >= deadline:
            log.warning(
                "transaction %s is still not visible %.0f s after its commit came: the "
                "catalog is read without it",
                xid,
                timeout,
            )
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    return True


class Catalog:
    """Cached catalog lookups through `conninfo` (an ordinary, not a replication, connection)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.session = SqlSession(conninfo, pinned_settings=True)
        self._type_names: dict[tuple[int, int | None], str] = {}
        self._keywords: frozenset[str] | None = None
        #: A transaction whose commit came, not yet known to be visible here.
        self._committed: int | None = None

    def committed(self, xid: int) -> None:
        """The changes that follow are of transaction `xid`, whose commit came: the next
        read (if any: cached answers need none) first waits until it is visible
        (`wait_until_visible`: a type it created must be found)."""
        self._committed = xid

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query; the rows."""
        if self._committed is not None:
            xid, self._committed = self._committed, None
            wait_until_visible(self.session.query, xid)
        return self.session.query(sql, params)

    def type_name(self, type_oid: int, type_modifier: int | None = None) -> str:
        """``format_type(oid, typmod)``: e.g. ``integer``, ``character varying(20)``.

        Without `type_modifier` it is the server's ``format_type_be`` (``character`` for
        bpchar); with one, even -1, ``format_type_with_typemod`` (``bpchar``).
        """
        key = (type_oid, type_modifier)
        name = self._type_names.get(key)
        if name is None:
            rows = self.query("SELECT pg_catalog.format_type(%s::oid, %s::int4)", key)
            name = self._type_names[key] = rows[0][0]
        return name

    def keywords(self) -> frozenset[str]:
        """SQL keywords an identifier must be quoted for (all but the unreserved ones)."""
        if self._keywords is None:
            rows = self.query("SELECT word FROM pg_catalog.pg_get_keywords() WHERE catcode <> 'U'")
            self._keywords = frozenset(row[0] for row in rows)
        return self._keywords

    def quote_identifier(self, name: str) -> str:
        """The server's ``quote_identifier``, with its keyword list."""
        return quote_identifier(name, self.keywords())

    def close(self) -> None:
        self.session.close()


def quote_identifier(name: str, keywords: frozenset[str]) -> str:
    """Quote `name` unless it is lower-case letters, digits and underscores, not starting
    with a digit, and not a keyword (the rules of the server's ``quote_identifier``)."""
    safe = bool(name) and (name[0].islower() or name[0] == "_") and name.isascii()
    if safe:
        safe = all(c.islower() or c.isdigit() or c == "_" for c in name)
    if safe and name not in keywords:
        return name
    return '"' + name.replace('"', '""') + '"'
