"""The SQL transport returns the walsender's message stream, bounded, without consuming."""

from __future__ import annotations

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import SlotNotFound
from pgcdc.protocol import Begin, Commit, Insert, Relation, StreamingMode
from pgcdc.replication import ReplicationConnection, StreamOptions
from pgcdc.replication.slots import get_slot
from pgcdc.replication.sql_transport import SqlTransport


def setup(pg: Database, transactions: int) -> None:
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t")
    with ReplicationConnection.connect(pg.dsn) as conn:
        conn.create_slot("s")
    with pg.connect() as conn:
        for i in range(transactions):
            conn.execute(
                "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                (i * 10 + 1, i * 10 + 10),
            )


def test_peek_bounds_and_advance(pg: Database) -> None:
    setup(pg, transactions=5)
    with SqlTransport(pg.dsn, "s", StreamOptions(("pub",))) as sql:
        everything = list(sql.changes())
        inserts = [c.message for c in everything if isinstance(c.message, Insert)]
        assert [int(m.new.values[0]) for m in inserts] == list(range(1, 51))
        assert isinstance(everything[1].message, Relation)
        # peeking again returns the same messages: nothing was consumed
        assert [c.message for c in sql.changes()] == [c.message for c in everything]
        commits = [c for c in everything if isinstance(c.message, Commit)]
        assert len(commits) == 5
        # upto_nchanges ends on a transaction boundary
        first = list(sql.changes(upto_nchanges=3))
        assert isinstance(first[-1].message, Commit)
        assert sum(isinstance(c.message, Insert) for c in first) == 10
        # upto_lsn: transactions committing up to the second commit
        second_end = commits[1].message.end_lsn
        bounded = list(sql.changes(upto_lsn=second_end))
        assert sum(isinstance(c.message, Begin) for c in bounded) == 2
        # advance to the second commit's end: the next peek starts with the third
        assert sql.advance(second_end) == second_end
        assert get_slot(pg.dsn, "s").confirmed_flush_lsn == second_end
        rest = [c.message for c in sql.changes() if isinstance(c.message, Insert)]
        assert [int(m.new.values[0]) for m in rest] == list(range(21, 51))
        # consume: the get function moves the slot past what it returned
        consumed = list(sql.changes(consume=True))
        assert consumed and list(sql.changes()) == []


def test_binary_and_streaming_options(pg: Database) -> None:
    setup(pg, transactions=1)
    options = StreamOptions(("pub",), binary=True, streaming=StreamingMode.ON)
    with SqlTransport(pg.dsn, "s", options) as sql:
        inserts = [c.message for c in sql.changes() if isinstance(c.message, Insert)]
        assert inserts[0].new.kinds == b"bb"
        assert inserts[0].new.values[0] == (1).to_bytes(4, "big")


def test_missing_slot(pg: Database) -> None:
    setup(pg, transactions=0)
    with (
        SqlTransport(pg.dsn, "nope", StreamOptions(("pub",))) as sql,
        pytest.raises(SlotNotFound, match='"nope" does not exist'),
    ):
        list(sql.changes())
