"""Relation changes between a target's batches and inside one: the policy of
`pgcdc.targets.delta` (added columns appear, dropped ones stay, lossless widening rewrites,
anything else is refused before writing)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.errors import SchemaChangeError, TargetError
from pgcdc.protocol import Lsn
from pgcdc.targets import DeltaTarget
from pgcdc.targets._merge import Writer
from pgcdc.targets.added_columns import ColumnFill, added_columns
from pgcdc.types.mapping import MappingOptions

from .envelopes import (
    INT4,
    INT8,
    NUMERIC,
    TEXT,
    UNCHANGED,
    delete,
    envelope,
    insert,
    numeric,
    relation,
    rows,
    truncate,
    txn,
    update,
)

V1 = relation(("id", INT4, True), ("name", TEXT))
V2 = relation(("id", INT4, True), ("name", TEXT), ("score", INT4))  # ADD COLUMN score
APP = "pgcdc:test"
#: Every test both ways a batch is written (deletion vectors, copy-on-write MERGE).
pytestmark = pytest.mark.usefixtures("write_path")


def target(tmp_path: Path, mode: str = "mirror", **kwargs: Any) -> DeltaTarget:
    return DeltaTarget(str(tmp_path / mode), mode, app_id=APP, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_added_column_in_the_middle_of_a_batch(tmp_path: Path, mode: str) -> None:
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(V1, id=1, name="a"))))
    t.apply(
        envelope(
            txn(0x200, insert(V1, id=2, name="b"), update(V1, {"id": 1, "name": "a2"})),
            txn(0x300, insert(V2, id=3, name="c", score=7), update(V2, {"id": 2, "score": 5})),
        )
    )
    data = t.to_arrow()
    assert data.schema.field("score").type == pa.int32()
    assert "_pgcdc_action" not in data.schema.names
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    assert rows(current, "id", "name", "score") == [(1, "a2", None), (2, None, 5), (3, "c", 7)]


def test_added_column_on_a_new_table_and_toast_across_it(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.apply(
        envelope(
            txn(0x100, insert(V1, id=1, name="long")),
            txn(0x200, update(V2, {"id": 1, "name": UNCHANGED, "score": 3})),
        )
    )
    assert rows(t.to_arrow()) == [(1, "long", 3)]


def test_unchanged_toast_in_a_column_the_batch_adds(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.apply(envelope(txn(0x100, insert(V1, id=1, name="a"))))
    t.apply(envelope(txn(0x200, update(V2, {"id": 1, "name": UNCHANGED, "score": UNCHANGED}))))
    assert rows(t.to_arrow()) == [(1, "a", None)]


def test_dropped_column_stays_and_is_null_afterwards(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.apply(envelope(txn(0x100, insert(V2, id=1, name="a", score=1), insert(V2, id=2, score=2))))
    t.apply(envelope(txn(0x200, update(V1, {"id": 1, "name": "a2"}), insert(V1, id=3))))
    assert t.to_arrow().schema.names == ["id", "name", "score"]
    assert rows(t.to_arrow()) == [(1, "a2", None), (2, None, 2), (3, None, None)]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_widening_int4_to_int8_rewrites_the_table(tmp_path: Path, mode: str) -> None:
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=2_000_000_000))))
    wide = relation(("id", INT4, True), ("name", TEXT), ("score", INT8))
    narrow_again = V2
    t.apply(
        envelope(
            txn(0x200, insert(wide, id=2, score=8_000_000_000)),
            txn(0x300, insert(narrow_again, id=3, score=3)),  # an int4 fits the int8 column
        )
    )
    data = t.to_arrow()
    assert data.schema.field("score").type == pa.int64()
    assert rows(data, "id", "score") == [(1, 2_000_000_000), (2, 8_000_000_000), (3, 3)]
    assert DeltaTable(t.path).metadata().configuration["pgcdc.mode"] == mode


def test_widening_a_decimal(tmp_path: Path) -> None:
    t = target(tmp_path)
    rel = relation(("id", INT4, True), ("amount", NUMERIC, False, numeric(5, 2)))
    wider = relation(("id", INT4, True), ("amount", NUMERIC, False, numeric(12, 2)))
    t.apply(envelope(txn(0x100, insert(rel, id=1, amount="123.45"))))
    t.apply(envelope(txn(0x200, insert(wider, id=2, amount="1234567890.12"))))
    data = t.to_arrow()
    assert data.schema.field("amount").type == pa.decimal128(12, 2)
    assert [str(v) for _, v in rows(data)] == ["123.45", "1234567890.12"]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_incompatible_type_change_is_refused_and_writes_nothing(tmp_path: Path, mode: str) -> None:
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1))))
    version, before = DeltaTable(t.path).version(), rows(t.to_arrow(), "id", "score")
    as_text = relation(("id", INT4, True), ("name", TEXT), ("score", TEXT))
    change = insert(as_text, id=3, score="high")
    with pytest.raises(SchemaChangeError) as caught:
        t.apply(envelope(txn(0x200, insert(V2, id=2, score=2)), txn(0x300, change)))
    error = caught.value
    assert (error.table, error.column, error.lsn) == ("public.items", "score", change.lsn)
    assert str(Lsn(change.lsn)) in str(error) and "public.items.score" in str(error)
    assert "int32" in str(error) and "string (text)" in str(error)
    assert DeltaTable(t.path).version() == version and t.watermark == 0x100
    assert rows(t.to_arrow(), "id", "score") == before


# --- a type changed beyond a widening (ALTER COLUMN ... TYPE ... USING) --------------------

AS_TEXT = relation(("id", INT4, True), ("name", TEXT), ("score", TEXT))  # score int4 -> text


def source_now(**values: str | None) -> Any:
    """A fill source answering, per key, what the source table holds now (the column as
    the server prints it under its new type)."""
    asked: list[tuple[str, bool]] = []

    def fills(shape: Any, column: str, *, appended: bool) -> ColumnFill:
        asked.append((column, appended))
        ids = list(values)
        return ColumnFill(rows=pa.table({"id": ids, "value": [values[i] for i in ids]}))

    fills.asked = asked  # type: ignore[attr-defined]
    return fills


@pytest.mark.parametrize("mode", ["mirror", "history"])
@pytest.mark.parametrize("batches", ["one batch", "two batches"])
def test_a_type_change_takes_the_sources_values(tmp_path: Path, mode: str, batches: str) -> None:
    """int to text (any USING): every row holds the value the source holds now, read by
    key, the batch's own rows from before the change too; rows changed after hold their own
    value; a history's ended versions keep theirs, cast to the new type."""
    fills = source_now(**{"1": "one", "2": "two", "3": "three"})
    t = target(tmp_path, mode, fills=fills)
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1), insert(V2, id=2, score=2))))
    t.apply(envelope(txn(0x180, update(V2, {"id": 2, "score": 20}))))
    before = [txn(0x200, insert(V2, id=3, score=3))]
    after = [txn(0x300, update(AS_TEXT, {"id": 2, "score": "TWO"}), insert(AS_TEXT, id=4))]
    if batches == "one batch":
        t.apply(envelope(*before, *after))
    else:
        t.apply(envelope(*before))
        t.apply(envelope(*after))
    assert fills.asked == [("score", False)]
    data = t.to_arrow()
    assert data.schema.field("score").type == pa.string()
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    assert rows(current, "id", "score") == [(1, "one"), (2, "TWO"), (3, "three"), (4, None)]
    if mode == "history":
        ended = data.filter(data.column("__END_AT").is_valid())
        # 2 (cast to text) ended at 0x180; "two" (the source's value, current until the
        # update) at 0x300
        assert sorted(rows(ended, "id", "score")) == [(2, "2"), (2, "two")]
    t.apply(envelope(txn(0x400, insert(AS_TEXT, id=5, score="five"))))  # no longer changed
    assert fills.asked == [("score", False)]


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_type_changed_and_back_in_one_batch(tmp_path: Path, mode: str) -> None:
    """int to text to int (each with USING) in one batch: the shape before and after is the
    same, yet the rows made before the last change hold what the server rewrote them to;
    rows made after it hold their own value."""
    fills = source_now(**{"1": "2", "2": "2", "3": "1"})
    t = target(tmp_path, mode, fills=fills)
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1))))
    t.apply(
        envelope(
            txn(0x200, insert(V2, id=2, score=2)),
            txn(0x300, update(AS_TEXT, {"id": 1, "score": "r1"})),
            txn(0x400, insert(V2, id=3, score=7)),
        )
    )
    assert fills.asked == [("score", False)]
    data = t.to_arrow()
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    assert rows(current, "id", "score") == [(1, 2), (2, 2), (3, 7)]


def test_a_crash_after_the_retype_before_the_batch_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the rewrite with the new type and the batch's commit: the batch again
    (its older images of the old type included) gives the same table."""
    t = target(tmp_path, fills=source_now(**{"1": "one", "2": "two"}))
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1))))
    batch = envelope(txn(0x200, insert(V2, id=2, score=2)), txn(0x300, insert(AS_TEXT, id=3)))
    killed_before_the_commit(t, batch, monkeypatch)
    assert rows(t.to_arrow(), "id", "score") == [(1, "one")] and t.watermark == 0x100
    t.apply(batch)
    assert rows(t.to_arrow(), "id", "score") == [(1, "one"), (2, "two"), (3, None)]


def test_a_crash_after_the_retype_then_the_batch_in_pieces_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the rewrite; after the restart the batch comes again in two (the first
    with only changes made before the type change): the table, ahead of the first piece,
    takes its rows with the column null, and the second piece's type change fills them."""
    t = target(tmp_path, fills=source_now(**{"1": "one", "2": "two"}))
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1))))
    older, newer = txn(0x200, insert(V2, id=2, score=2)), txn(0x300, insert(AS_TEXT, id=3))
    killed_before_the_commit(t, envelope(older, newer), monkeypatch)
    t.apply(envelope(older))
    assert rows(t.to_arrow(), "id", "score") == [(1, "one"), (2, None)]
    t.apply(envelope(newer))
    assert rows(t.to_arrow(), "id", "score") == [(1, "one"), (2, "two"), (3, None)]


@pytest.mark.parametrize("where", ["a key column", "a table without a key"])
def test_a_type_change_the_source_cannot_be_read_again_for_is_refused(
    tmp_path: Path, where: str
) -> None:
    fills = source_now()
    if where == "a key column":
        old, new = V2, relation(("id", TEXT, True), ("name", TEXT), ("score", INT4))
        column = "id"
    else:
        old = relation(("id", INT4), ("score", INT4), identity="f")
        new = relation(("id", INT4), ("score", TEXT), identity="f")
        column = "score"
    t = target(tmp_path, fills=fills)
    t.apply(envelope(txn(0x100, insert(old, id=1, score=1))))
    with pytest.raises(SchemaChangeError, match=rf"items\.{column}: type changed .* recopy"):
        t.apply(envelope(txn(0x200, insert(new, id=2, score=2))))
    assert fills.asked == [] and t.watermark == 0x100


def test_scale_change_is_refused(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.apply(envelope(txn(0x100, insert(relation(("n", NUMERIC, True, numeric(8, 2))), n="1.5"))))
    with pytest.raises(SchemaChangeError, match=r"decimal128\(8, 2\) to decimal128\(8, 3\)"):
        t.apply(envelope(txn(0x200, delete(relation(("n", NUMERIC, True, numeric(8, 3))), n=1))))


def test_a_type_delta_cannot_store_is_refused(tmp_path: Path) -> None:
    t = target(tmp_path, options=MappingOptions(time="time"))
    rel = relation(("id", INT4, True), ("at", 1083))
    with pytest.raises(TargetError, match=r"items\.at: Delta Lake cannot store time64"):
        t.apply(envelope(txn(0x100, insert(rel, id=1, at="10:00:00"))))
    assert t.watermark is None


def test_another_mode_or_table_is_refused(tmp_path: Path) -> None:
    t = target(tmp_path)
    t.apply(envelope(txn(0x100, insert(V1, id=1))))
    with pytest.raises(TargetError, match="is a pgcdc mirror table, not history"):
        DeltaTarget(t.path, "history", app_id=APP).apply(envelope(txn(0x200, insert(V1, id=2))))
    other = relation(("id", INT4, True), table="other")
    with pytest.raises(TargetError, match=r"created for public\.items, not public\.other"):
        t.apply(envelope(txn(0x200, insert(other, id=2))))


# --- the value of an added column in older rows (ADD COLUMN ... DEFAULT) -------------------


def killed_before_the_commit(
    t: DeltaTarget, batch: pa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`t.apply(batch)` dies after any rewrite of the table, before the batch's data commit
    (as a kill there would)."""

    def crash(*args: Any) -> bool:
        raise RuntimeError("killed before the batch's commit")

    monkeypatch.setattr(Writer, "merge_mirror", crash)
    monkeypatch.setattr(Writer, "write_mirror", crash)
    with pytest.raises(RuntimeError):
        t.apply(batch)
    monkeypatch.undo()


def constant(value: str | None) -> Any:
    """A fill source that answers one value (what the catalog's missing value gives)."""
    asked: list[tuple[str, str]] = []

    def fills(shape: Any, column: str, *, appended: bool) -> ColumnFill:
        asked.append((shape.name, column))
        return ColumnFill(text=value)

    fills.asked = asked  # type: ignore[attr-defined]
    return fills


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_an_added_column_holds_its_fill_in_every_older_row(tmp_path: Path, mode: str) -> None:
    """The target's rows before the batch and the batch's own rows made before the column
    was added hold the fill; rows made after hold their own value (case 6)."""
    fills = constant("42")
    t = target(tmp_path, mode, fills=fills)
    t.apply(envelope(txn(0x100, insert(V1, id=1, name="a"), insert(V1, id=2, name="b"))))
    t.apply(envelope(txn(0x150, update(V1, {"id": 2, "name": "b2"}))))
    t.apply(
        envelope(
            txn(0x200, insert(V1, id=3, name="c"), update(V1, {"id": 1, "name": "a2"})),
            txn(
                0x300,
                insert(V2, id=4, name="d", score=None),
                update(V2, {"id": 3, "name": "c", "score": 7}),
            ),
        )
    )
    assert fills.asked == [("public.items", "score")]
    data = t.to_arrow()
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    assert rows(current, "id", "name", "score") == [
        (1, "a2", 42),
        (2, "b2", 42),
        (3, "c", 7),
        (4, "d", None),
    ]
    if mode == "history":  # a version that had ended before the batch keeps NULL
        ended = data.filter(data.column("__END_AT").is_valid())
        assert (2, "b", None) in rows(ended, "id", "name", "score")
    t.apply(envelope(txn(0x400, insert(V2, id=5, name="e"))))  # no longer added
    assert fills.asked == [("public.items", "score")]


def test_a_fill_read_per_row_from_the_source(tmp_path: Path) -> None:
    """A volatile default: each older row's own value, by key (the source's rows)."""
    values = pa.table({"id": ["1", "2", "9"], "value": ["10", "20", "90"]})
    t = target(tmp_path, fills=lambda shape, column, appended: ColumnFill(rows=values))
    t.apply(envelope(txn(0x100, insert(V1, id=1), insert(V1, id=2), insert(V1, id=3))))
    t.apply(envelope(txn(0x200, insert(V1, id=4)), txn(0x300, insert(V2, id=5, score=50))))
    assert rows(t.to_arrow(), "id", "score") == [(1, 10), (2, 20), (3, None), (4, None), (5, 50)]


@pytest.mark.parametrize("now", ["int8", "text"])
def test_a_fill_read_in_a_type_changed_since(tmp_path: Path, now: str) -> None:
    """A column read per key after the source changed its type (renamed, then retyped, before
    the batch was applied). Widened since (int4 to int8, a change the target follows by
    keeping values): each value the int4 column can hold is taken, one that cannot is null
    (its row changed since: its change comes later), in the table's rows as in the batch's
    images from before the column. Retyped beyond that (to text): null, until the stream's
    type change rewrites the column with the source's values."""
    ids, texts = ["1", "2", "4", "5"], ["10", "5000000000", "40", "6000000000"]
    values = pa.table({"id": ids, "value": texts})
    later = (20, -1) if now == "int8" else (25, -1)

    def fills(shape: Any, column: str, *, appended: bool) -> ColumnFill:
        return ColumnFill(rows=values, later_type=later)

    t = target(tmp_path, fills=fills)
    t.apply(envelope(txn(0x100, insert(V1, id=1), insert(V1, id=2))))
    t.apply(
        envelope(
            txn(0x200, insert(V1, id=4), insert(V1, id=5)), txn(0x300, insert(V2, id=3, score=30))
        )
    )
    kept = {1: 10, 3: 30, 4: 40} if now == "int8" else {3: 30}
    expected = [(i, kept.get(i)) for i in (1, 2, 3, 4, 5)]
    assert rows(t.to_arrow(), "id", "score") == expected


@pytest.mark.parametrize("change", ["added", "retyped"])
def test_a_fill_read_per_row_into_an_empty_table(tmp_path: Path, change: str) -> None:
    """The table was emptied (a TRUNCATE) before the column came: nothing to fill."""
    values = pa.table({"id": ["7"], "value": ["70"]})
    t = target(tmp_path, fills=lambda shape, column, appended: ColumnFill(rows=values))
    first = V1 if change == "added" else V2
    t.apply(envelope(txn(0x100, insert(first, id=1)), txn(0x200, truncate(first))))
    later = V2 if change == "added" else AS_TEXT
    t.apply(envelope(txn(0x300, insert(later, id=7, score="7"))))
    assert rows(t.to_arrow(), "id", "score") == [(7, 7 if change == "added" else "7")]


def test_a_column_dropped_and_added_again_takes_its_new_fill(tmp_path: Path) -> None:
    """The target keeps a dropped column; added again (a later batch), it holds the new
    column's fill in every older row, not the old column's values."""
    t = target(tmp_path, fills=constant("0"))
    t.apply(envelope(txn(0x100, insert(V2, id=1, score=1), insert(V2, id=2, score=2))))
    t.apply(envelope(txn(0x200, update(V1, {"id": 1, "name": "dropped"}))))
    t.apply(envelope(txn(0x300, insert(V2, id=3, score=3))))
    assert rows(t.to_arrow(), "id", "score") == [(1, 0), (2, 0), (3, 3)]


def test_a_crash_after_the_fill_before_the_batch_fills_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = target(tmp_path, fills=constant("5"))
    t.apply(envelope(txn(0x100, insert(V1, id=1))))
    batch = envelope(txn(0x200, insert(V1, id=2)), txn(0x300, insert(V2, id=3, score=3)))
    killed_before_the_commit(t, batch, monkeypatch)
    assert rows(t.to_arrow(), "id", "score") == [(1, 5)] and t.watermark == 0x100
    t.apply(batch)
    assert rows(t.to_arrow(), "id", "score") == [(1, 5), (2, 5), (3, 3)]


def _shape(*names: str) -> Shape:
    return Shape("public", "t", 1, "d", tuple(ColumnInfo(n, 23, -1, n == "id") for n in names))


@pytest.mark.parametrize(
    ("prior", "shapes", "expected"),
    [
        # ADD COLUMN appends after every column the table had
        (["id", "a"], [("id", "a", "b")], {"b": True}),
        (["id", "a"], [("id", "a", "b"), ("id", "a", "b", "c")], {"b": True, "c": True}),
        # RENAME COLUMN keeps the place; the old name is gone
        (["id", "a", "b"], [("id", "x", "b")], {"x": False}),
        (["id", "a"], [("id", "x")], {"x": False}),  # the last column: not an ADD either
        # DROP, then ADD: the dropped one is missing from the prefix; read rather than guess
        (["id", "a", "b"], [("id", "b"), ("id", "b", "c")], {"c": True}),
        (["id", "a", "b"], [("id", "b", "c")], {"c": False}),
        # a new table: nothing was added
        (None, [("id", "a")], {}),
    ],
)
def test_added_columns_tell_an_add_from_a_rename(
    prior: list[str] | None, shapes: list[tuple[str, ...]], expected: dict[str, bool]
) -> None:
    added = added_columns(prior, [_shape(*s) for s in shapes])
    assert {name: found.appended for name, found in added.items()} == expected


#: timestamp (without time zone, Delta's TIMESTAMP_NTZ) and timestamp[].
TIMESTAMP, TIMESTAMP_ARRAY = 1114, 1115
NOON = "2020-01-01 12:00:00"


def _has_timestamp_ntz(path: str) -> bool:
    """Whether the table at `path` opens (delta-rs refuses a TIMESTAMP_NTZ column without the
    feature) and has the timestampNtz reader and writer feature."""
    protocol = DeltaTable(path).protocol()
    features = set(protocol.reader_features or ()) & set(protocol.writer_features or ())
    return "timestampNtz" in features


@pytest.mark.parametrize("mode", ["mirror", "history"])
@pytest.mark.parametrize("change", ["insert", "update", "delete"])
@pytest.mark.parametrize("kind", ["timestamp", "timestamp[]"])
def test_an_added_timestamp_column_gets_the_timestamp_ntz_feature(
    tmp_path: Path, mode: str, change: str, kind: str
) -> None:
    """``ADD COLUMN at timestamp`` while streaming, to a table created without a timestamp
    column: the batch that brings it adds a TIMESTAMP_NTZ column (or a list of them), and
    the table gets Delta's timestampNtz feature first; without it delta-rs's MERGE commits a
    table that no reader opens any more."""
    oid, value = (TIMESTAMP, NOON) if kind == "timestamp" else (TIMESTAMP_ARRAY, f'{{"{NOON}"}}')
    stamped = relation(("id", INT4, True), ("name", TEXT), ("at", oid))
    t = target(tmp_path, mode)
    t.apply(envelope(txn(0x100, insert(V1, id=1, name="a"), insert(V1, id=2, name="b"))))
    assert not _has_timestamp_ntz(t.path)
    later = {
        "insert": insert(stamped, id=3, name="c", at=value),
        "update": update(stamped, {"id": 1, "name": "a2", "at": value}),
        "delete": delete(stamped, id=2),
    }[change]
    t.apply(envelope(txn(0x200, later)))
    assert _has_timestamp_ntz(t.path)
    data = DeltaTarget(t.path, mode, app_id=APP).to_arrow()  # (read anew, from the log)
    assert data.schema.field("at").type.equals(
        pa.timestamp("us") if kind == "timestamp" else pa.list_(pa.timestamp("us"))
    )
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    stamp = datetime(2020, 1, 1, 12) if kind == "timestamp" else [datetime(2020, 1, 1, 12)]
    expected = {
        "insert": [(1, "a", None), (2, "b", None), (3, "c", stamp)],
        "update": [(1, "a2", stamp), (2, "b", None)],
        "delete": [(1, "a", None)],
    }[change]
    assert rows(current, "id", "name", "at") == expected
    t.apply(envelope(txn(0x300, update(stamped, {"id": 1, "name": "a3", "at": value}))))
    data = t.to_arrow()
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    assert (1, "a3", stamp) in rows(current, "id", "name", "at")


def test_a_timestamp_column_added_to_a_table_without_identity(tmp_path: Path) -> None:
    """The rows of a table without a replica identity are appended, the column with them."""
    bare = relation(("id", INT4), ("name", TEXT), identity="n")
    stamped = relation(("id", INT4), ("name", TEXT), ("at", TIMESTAMP), identity="n")
    t = target(tmp_path)
    t.apply(envelope(txn(0x100, insert(bare, id=1, name="a"))))
    t.apply(envelope(txn(0x200, insert(stamped, id=2, name="b", at=NOON))))
    assert _has_timestamp_ntz(t.path)
    assert rows(t.to_arrow(), "id", "at") == [(1, None), (2, datetime(2020, 1, 1, 12))]
