"""A consumer that holds the transactions up to a point and knows nothing of the columns
(the Spark source restarted from its checkpoint): the slot may send older transactions again,
from before DDL the consumer has seen."""

from __future__ import annotations

import contextlib

import pytest

from pgcdc.decoding.catalog import Catalog
from pgcdc.embedded import Database
from pgcdc.pipeline._columns import ColumnIdentities
from pgcdc.protocol import Column, Relation

pytestmark = pytest.mark.server


def _relation(relid: int, *names: str) -> Relation:
    return Relation(relid, "public", "s", "d", tuple(Column(0, n, 23, -1) for n in names))


def test_messages_older_than_the_hold_do_not_lead_the_later_ones(pg_one: Database) -> None:
    """Two names swapped, then a column added: the message of a held transaction from
    before the swap, read against the catalog, takes the names' attnums of now; read on
    from it, the first message after the hold came out swapped, (1, 3, 2). Read against
    the catalog alone, it is right."""
    pg_one.execute("CREATE TABLE s (id int, a int, b int)")
    relid = pg_one.execute("SELECT 's'::regclass::oid")[0][0]
    before = _relation(relid, "id", "a", "b")  # what the server sent before the DDL
    pg_one.execute(
        "ALTER TABLE s RENAME a TO t; ALTER TABLE s RENAME b TO a; ALTER TABLE s RENAME t TO b"
    )
    after = _relation(relid, "id", "b", "a")  # a transaction after the swap
    pg_one.execute("ALTER TABLE s ADD COLUMN c int")  # and the catalog is further still
    with contextlib.closing(Catalog(pg_one.dsn)) as catalog:
        identities = ColumnIdentities(catalog)
        identities.hold(200)
        assert identities(before, None, 100) == (1, 3, 2)  # the catalog's guess, held
        assert identities.rereads(relid, 300)  # the message in force is read again
        assert not identities.rereads(relid, 150)
        assert identities(after, None, 300) == (1, 2, 3)
        assert not identities.rereads(relid, 400)


@pytest.mark.parametrize(
    ("ddl", "after", "expected"),
    [
        # a column dropped and added again under its name (same type): a new attnum
        ("ALTER TABLE s DROP b; ALTER TABLE s ADD b int", ("id", "a", "b"), (1, 2, 4)),
        # a column renamed, another added under its old name
        (
            "ALTER TABLE s RENAME a TO x; ALTER TABLE s ADD a int",
            ("id", "x", "b", "a"),
            (1, 2, 3, 4),
        ),
        # a column dropped, another renamed to its name
        ("ALTER TABLE s DROP a; ALTER TABLE s RENAME b TO a", ("id", "a"), (1, 3)),
    ],
)
def test_the_first_message_after_the_hold_is_right_whatever_the_ddl_before_it(
    pg_one: Database, ddl: str, after: tuple[str, ...], expected: tuple[int, ...]
) -> None:
    """The class beside the swap: other DDL between a held message and the first one after
    the hold, with the catalog further still (a column added)."""
    pg_one.execute("CREATE TABLE s (id int, a int, b int)")
    relid = pg_one.execute("SELECT 's'::regclass::oid")[0][0]
    pg_one.execute(ddl)
    pg_one.execute("ALTER TABLE s ADD COLUMN c int")
    with contextlib.closing(Catalog(pg_one.dsn)) as catalog:
        identities = ColumnIdentities(catalog)
        identities.hold(200)
        identities(_relation(relid, "id", "a", "b"), None, 100)
        assert identities(_relation(relid, *after), None, 300) == expected


def test_a_point_seeded_without_columns_holds_that_relation_only(pg_one: Database) -> None:
    """A table whose consumers recorded no columns (its targets emptied for a copy, its
    pending change log holding changes to a point) is seeded with the point alone: as a
    hold, for that table."""
    pg_one.execute("CREATE TABLE s (id int, a int, b int); CREATE TABLE u (x int)")
    relid, other = (pg_one.execute(f"SELECT '{t}'::regclass::oid")[0][0] for t in ("s", "u"))
    before = _relation(relid, "id", "a", "b")
    pg_one.execute(
        "ALTER TABLE s RENAME a TO t; ALTER TABLE s RENAME b TO a; ALTER TABLE s RENAME t TO b"
    )
    after = _relation(relid, "id", "b", "a")
    pg_one.execute("ALTER TABLE s ADD COLUMN c int")
    with contextlib.closing(Catalog(pg_one.dsn)) as catalog:
        identities = ColumnIdentities(catalog)
        identities.seed(relid, [], 200)
        identities(before, None, 100)
        assert identities.rereads(relid, 300) and not identities.rereads(other, 300)
        assert identities(after, None, 300) == (1, 2, 3)
