"""The pgoutput stream through SQL functions, over an ordinary connection.

``pg_logical_slot_peek_binary_changes`` returns the same messages the walsender would send,
without consuming them; after the consumer has made a batch durable it moves the slot with
``pg_replication_slot_advance``. This is how Spark micro-batches read (peek a bounded range on
one side, advance after the batch committed), and the way in where replication connections are
not allowed. Each call is a fresh decoding session, so Relation messages come again every time.

It also drains a backlog faster than the walsender (no per-message send), which makes it the
better way to catch up.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from pgcdc.errors import ReplicationError
from pgcdc.protocol import Decoder, Lsn, PgoutputMessage
from pgcdc.replication.connection import DEFAULT_SESSION_SETTINGS, sql_error
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.slots import connect_sql

__all__ = ["SqlChange", "SqlTransport"]


@dataclass(frozen=True, slots=True)
class SqlChange:
    """One message as the SQL functions return it: its LSN, its transaction id, the message."""

    lsn: Lsn
    xid: int
    message: PgoutputMessage


class SqlTransport:
    """Reads a slot through SQL. Not thread-safe; one instance per connection."""

    def __init__(self, conninfo: str, slot: str, options: StreamOptions) -> None:
        self.slot = slot
        self.conn = connect_sql(conninfo)
        self.options = options.negotiate(self.conn.info.server_version)
        assert self.options.proto_version is not None
        for name, value in (DEFAULT_SESSION_SETTINGS | self.options.settings).items():
            self._run("SELECT set_config(%s, %s, false)", (name, value), f"setting {name}")
        self._args = [item for pair in self.options.option_pairs() for item in pair]

    def _run(self, query: str, params: tuple, doing: str) -> list[tuple]:
        try:
            with self.conn.cursor(binary=True) as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise sql_error(exc, doing) from None

    def changes(
        self,
        *,
        upto_lsn: Lsn | None = None,
        upto_nchanges: int | None = None,
        consume: bool = False,
        undecoded_rows: bool = False,
    ) -> Iterator[SqlChange]:
        """Decoded messages of complete transactions, up to the bounds.

        `upto_nchanges` stops after the transaction in which the count was reached (whole
        transactions only). With `consume` the slot moves past what was returned (the
        ``get`` function); otherwise nothing moves until `advance`. `undecoded_rows`: row
        changes come as `pgcdc.protocol.UndecodedChange`.
        """
        function = "get" if consume else "peek"
        query = (
            # pg_lsn and xid have no binary loaders in psycopg: send them as int8
            "SELECT (lsn - '0/0'::pg_lsn)::int8, xid::text::int8, data "
            f"FROM pg_logical_slot_{function}_binary_changes("
            "%s, %s::pg_lsn, %s, VARIADIC %s::text[])"
        )
        params = (
            self.slot,
            None if upto_lsn is None else str(Lsn(upto_lsn)),
            upto_nchanges,
            self._args,
        )
        rows = self._run(query, params, f"reading slot {self.slot!r}")
        decoder = Decoder(
            self.options.proto_version or 1, self.options.streaming, undecoded_rows=undecoded_rows
        )
        decode = decoder.decode
        for lsn, xid, data in rows:
            message = decode(data, lsn)
            if message is not None:
                yield SqlChange(Lsn(lsn), xid, message)

    def advance(self, lsn: Lsn) -> Lsn:
        """Move the slot's confirmed position to `lsn` (never backwards); returns where it is."""
        rows = self._run(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
            (self.slot, str(Lsn(lsn))),
            f"advancing slot {self.slot!r} to {Lsn(lsn)}",
        )
        if not rows:
            raise ReplicationError(f"advancing slot {self.slot!r}: no result")
        return Lsn.parse(rows[0][0])

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SqlTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
