"""`resolve_attnums`: what each column of a Relation message is, from the catalog of now and
the relation's previous version (no server: the catalog as data); `seed_point`: where a new
process starts reading them from."""

from __future__ import annotations

from pgcdc.pipeline._columns import Attribute, resolve_attnums, seed_point

INT, TEXT, BIGINT = 23, 25, 20


def att(
    attnum: int, name: str, type_oid: int = INT, *, dropped: bool = False, xmin: int = 0
) -> Attribute:
    if dropped:
        return Attribute(
            attnum, f"........pg.dropped.{attnum}........", 0, -1, dropped=True, xmin=xmin
        )
    return Attribute(attnum, name, type_oid, -1, xmin=xmin)


def msg(*columns: tuple[str, int]) -> list[tuple[str, int, int]]:
    return [(name, type_oid, -1) for name, type_oid in columns]


def test_the_catalog_of_now_is_the_messages() -> None:
    # two names swapped (a -> tmp, b -> a, tmp -> b): the message lists them in attnum order
    catalog = [att(1, "id"), att(2, "b"), att(3, "a")]
    assert resolve_attnums(msg(("id", INT), ("b", INT), ("a", INT)), catalog) == (1, 2, 3)
    # DROP c; ADD c bigint: the same name, another column
    catalog = [att(1, "id"), att(2, "b"), att(3, "", dropped=True), att(4, "c", BIGINT)]
    assert resolve_attnums(msg(("id", INT), ("b", INT), ("c", BIGINT)), catalog) == (1, 2, 4)
    # DROP a; RENAME b TO a
    catalog = [att(1, "id"), att(2, "", dropped=True), att(3, "a")]
    assert resolve_attnums(msg(("id", INT), ("a", INT)), catalog) == (1, 3)


def test_a_catalog_ahead_of_the_message_is_read_from_the_previous_version() -> None:
    previous = [(1, ("id", INT, -1)), (2, ("a", INT, -1)), (3, ("b", TEXT, -1))]
    # the message: b dropped, c added; since then: a renamed to z, c dropped, d added
    catalog = [att(1, "id"), att(2, "z"), att(3, "", dropped=True), att(4, "", dropped=True)]
    catalog.append(att(5, "d"))
    assert resolve_attnums(msg(("id", INT), ("a", INT), ("c", INT)), catalog, previous) == (
        1,
        2,
        4,
    )
    # the message: only a rename of a (to x), a later one to z: same columns
    assert resolve_attnums(msg(("id", INT), ("x", INT), ("b", TEXT)), catalog, previous) == (
        1,
        2,
        3,
    )
    # the same names and types as before, the catalog since DROP c; ADD c; ADD later: the
    # message may have come before the DDL or after it; the likelier story is the one with
    # the fewest changes (a message sent again after the DDL while the catalog was still the
    # message's is resolved by the catalog: the first test)
    previous = [(1, ("id", INT, -1)), (2, ("c", INT, -1))]
    catalog = [att(1, "id"), att(2, "", dropped=True), att(3, "c"), att(4, "later")]
    assert resolve_attnums(msg(("id", INT), ("c", INT)), catalog, previous) == (1, 2)
    # a column renamed and retyped is the likelier story only when nothing else fits
    previous = [(1, ("id", INT, -1)), (2, ("v", TEXT, -1))]
    catalog = [att(1, "id"), att(2, "", dropped=True), att(3, "", dropped=True)]
    assert resolve_attnums(msg(("id", INT), ("w", INT)), catalog, previous) == (1, 3)


def test_a_relation_seen_first_with_a_catalog_ahead_is_matched_by_name() -> None:
    catalog = [att(1, "id"), att(2, "w"), att(3, "v", TEXT)]
    assert resolve_attnums(msg(("id", INT), ("v", INT)), catalog) == (1, 3)
    assert resolve_attnums(msg(("id", INT), ("gone", INT)), catalog) == (1, 0)


def test_a_drop_and_add_of_the_same_name_and_type_is_placed_by_the_transactions() -> None:
    """``DROP n; ADD n int`` by transaction 700, read from a backlog: the messages before it
    and after it are the same names and types; a message is after the DDL when its
    transaction is the DDL's or a later one (the DDL held the table), before it otherwise."""
    previous = [(1, ("id", INT, -1)), (2, ("v", TEXT, -1)), (3, ("n", INT, -1))]
    catalog = [att(1, "id"), att(2, "v", TEXT), att(3, "", dropped=True, xmin=700)]
    catalog.append(att(4, "n", xmin=700))
    message = msg(("id", INT), ("v", TEXT), ("n", INT))
    assert resolve_attnums(message, catalog, previous, xid=699) == (1, 2, 3)
    assert resolve_attnums(message, catalog, previous, xid=700) == (1, 2, 4)
    assert resolve_attnums(message, catalog, previous, xid=701) == (1, 2, 4)
    # after the DDL's message, the next one is read from it
    after = [(1, ("id", INT, -1)), (2, ("v", TEXT, -1)), (4, ("n", INT, -1))]
    assert resolve_attnums(message, catalog, after, xid=702) == (1, 2, 4)
    # xids wrap around: 5 comes after 2**32 - 10
    wrapped = [*catalog[:2], att(3, "", dropped=True, xmin=2**32 - 10)]
    wrapped.append(att(4, "n", xmin=2**32 - 10))
    assert resolve_attnums(message, wrapped, previous, xid=5) == (1, 2, 4)
    assert resolve_attnums(message, wrapped, previous, xid=2**32 - 11) == (1, 2, 3)
    # no xid known (a catalog without them): the fewest changes, as before
    assert resolve_attnums(message, catalog, previous) == (1, 2, 3)


def test_a_column_dropped_and_added_again_in_another_type_is_placed_by_the_transactions() -> None:
    """The failed run's story (failover-18-36): ``ADD e12 int`` (attnum 10), a message with
    it (transaction 150), then ``DROP e12`` (200) and ``ADD e12 bigint`` (attnum 11, 300),
    read from a backlog with the catalog of after. Attnum 11 has the message's name (but not
    its type), attnum 10 is dropped and says nothing: the transactions must tell. Column 10's
    xmin is its drop: after the message, so the message holds it; column 11 came later."""
    previous = [(1, ("k", INT, -1)), (4, ("v", TEXT, -1)), (9, ("e10", INT, -1))]
    catalog = [att(1, "k"), att(4, "v", TEXT), att(9, "e10")]
    catalog += [att(10, "", dropped=True, xmin=200), att(11, "e12", BIGINT, xmin=300)]
    before = msg(("k", INT), ("v", TEXT), ("e10", INT), ("e12", INT))
    assert resolve_attnums(before, catalog, previous, xid=150) == (1, 4, 9, 10)
    # the message after both (its own type): the new column
    after = msg(("k", INT), ("v", TEXT), ("e10", INT), ("e12", BIGINT))
    last = [*previous, (10, ("e12", INT, -1))]
    assert resolve_attnums(after, catalog, last, xid=301) == (1, 4, 9, 11)
    assert resolve_attnums(after, catalog, previous, xid=301) == (1, 4, 9, 11)
    # with no xids known, the names decide as before (the fewest changes)
    assert resolve_attnums(before, catalog, previous) == (1, 4, 9, 11)


def test_the_seed_is_the_columns_recorded_at_the_point_every_consumer_holds() -> None:
    """Each consumer of a table's changes (its targets; its pending change log while a copy
    is under way) holds a watermark and may have recorded the columns as of it."""
    assert seed_point([]) == (None, None)
    assert seed_point([(500, "cols@500"), (500, "cols@500")]) == ("cols@500", 500)
    assert seed_point([(700, "cols@700"), (500, "cols@500")]) == ("cols@500", 500)
    # a target that recorded nothing (just marked by a copy) holds less: no columns, the point
    assert seed_point([(700, "cols@700"), (500, None)]) == (None, 500)
    # the targets of a table being copied again were emptied; its pending log holds 600
    assert seed_point([(600, None), (600, None), (600, None)]) == (None, 600)
    # one holds nothing known: no point, the columns recorded least far on
    assert seed_point([(700, "cols@700"), (None, None)]) == ("cols@700", None)
    assert seed_point([(None, None)]) == (None, None)
