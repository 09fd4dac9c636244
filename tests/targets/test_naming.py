"""`plan_naming`: target columns followed by what they are (attnums), without Delta."""

from __future__ import annotations

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.targets.naming import plan_naming


def col(name: str, attnum: int, key: bool = False) -> ColumnInfo:
    return ColumnInfo(name, 23, -1, key, attnum)


def shape(*columns: ColumnInfo) -> Shape:
    return Shape("public", "s", 1, "d", columns)


BEFORE = (col("id", 1, True), col("a", 2), col("b", 3))


def test_nothing_changed() -> None:
    naming = plan_naming(BEFORE, ["id", "a", "b"], [shape(*BEFORE)])
    assert not naming.changes_target and naming.recorded == BEFORE
    assert naming.shape(shape(*BEFORE)) == shape(*BEFORE)


def test_swapped_names_rename_the_target_columns() -> None:
    after = shape(col("id", 1, True), col("b", 2), col("a", 3))
    naming = plan_naming(BEFORE, ["id", "a", "b"], [after])
    assert naming.renames == {"a": "b", "b": "a"} and not naming.removed
    assert [(c.name, c.attnum) for c in naming.recorded or ()] == [("id", 1), ("b", 2), ("a", 3)]


def test_a_name_taken_by_a_new_column_removes_the_old_one() -> None:
    # DROP b; ADD b: attnum 3 is gone, 4 takes its name
    after = shape(col("id", 1, True), col("a", 2), col("b", 4))
    naming = plan_naming(BEFORE, ["id", "a", "b"], [after])
    assert naming.removed == {"b"} and not naming.renames
    assert [c.attnum for c in naming.recorded or ()] == [1, 2]


def test_a_name_taken_by_a_rename_removes_the_dropped_column() -> None:
    # DROP a; RENAME b TO a
    after = shape(col("id", 1, True), col("a", 3))
    naming = plan_naming(BEFORE, ["id", "a", "b"], [after])
    assert naming.removed == {"a"} and naming.renames == {"b": "a"}


def test_a_rename_within_the_batch_names_the_older_rows_by_the_new_name() -> None:
    first = shape(*BEFORE)
    second = shape(col("id", 1, True), col("x", 2), col("b", 3))
    naming = plan_naming(BEFORE, ["id", "a", "b"], [first, second])
    assert naming.renames == {"a": "x"}
    assert [c.name for c in naming.shape(first).columns] == ["id", "x", "b"]


def test_a_column_dropped_within_the_batch_whose_name_is_taken_is_left_out() -> None:
    first = shape(*BEFORE)
    second = shape(col("id", 1, True), col("a", 2), col("b", 4))  # DROP b; ADD b
    naming = plan_naming(BEFORE, ["id", "a", "b"], [first, second])
    assert naming.names[first] == {"id": "id", "a": "a", "b": None}
    assert [c.name for c in naming.shape(first).columns] == ["id", "a"]


def test_a_column_dropped_long_ago_gives_way_to_a_new_one() -> None:
    # the table kept "old" (dropped before the last batch); a new column takes its name
    after = shape(*BEFORE, col("old", 9))
    naming = plan_naming(BEFORE, ["id", "a", "b", "old"], [after])
    assert naming.removed == {"old"}


def test_without_attnums_columns_are_their_names() -> None:
    before = tuple(ColumnInfo(c.name, 23, -1, c.key) for c in BEFORE)
    after = shape(*(ColumnInfo(n, 23, -1, n == "id") for n in ("id", "b", "a")))
    naming = plan_naming(before, ["id", "a", "b"], [after])
    assert not naming.changes_target
