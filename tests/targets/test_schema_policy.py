"""The schema policy (`pgcdc.targets.schema.plan_evolution`) on its own: Arrow schemas and
relation shapes in, the evolution out; no Delta table, no server."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from pgcdc.envelope import ColumnInfo, Shape
from pgcdc.errors import SchemaChangeError, TargetError
from pgcdc.targets._typing import BatchTyping
from pgcdc.targets.base import END_AT, SEQUENCE_TYPE, START_AT
from pgcdc.targets.fold import Change
from pgcdc.targets.schema import Evolution, plan_evolution, plan_reconcile
from pgcdc.types.mapping import DEFAULT_OPTIONS
from pgcdc.types.registry import DEFAULT_REGISTRY

INT2, INT4, INT8, TEXT, FLOAT4, FLOAT8 = 21, 23, 20, 25, 700, 701
NUMERIC = 1700


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def shape(*columns: tuple[Any, ...], identity: str = "d") -> Shape:
    """columns: (name, type OID[, key[, typmod]]), attnums in order."""
    infos = tuple(
        ColumnInfo(name, oid, rest[1] if len(rest) > 1 else -1, bool(rest and rest[0]), i + 1)
        for i, (name, oid, *rest) in enumerate(columns)
    )
    return Shape("public", "t", 16384, identity, infos)


def changes(*shapes: Shape) -> list[Change]:
    return [
        Change((0x100, i + 1), "insert", s, None, None, {}, (), 0x100 + i)
        for i, s in enumerate(shapes)
    ]


def plan(
    current: pa.Schema | None,
    recorded: Shape | None,
    *shapes: Shape,
    mode: str = "mirror",
    storable: Any = None,
) -> Evolution:
    typing = BatchTyping(DEFAULT_REGISTRY, DEFAULT_OPTIONS, mode, _never)  # type: ignore[arg-type]
    return plan_evolution(
        current,
        None if recorded is None else recorded.columns,
        changes(*shapes),
        "public.t",
        mode,  # type: ignore[arg-type]
        typing,
        storable or (lambda source, field: None),
    )


def _never(*args: Any, **kwargs: Any) -> Any:
    """A source of values read per key (which a retyped column needs), never asked by the
    planner: it only says which columns need them."""
    raise AssertionError("the planner reads no values")


BASE = shape(("id", INT4, True), ("a", INT4))
BASE_SCHEMA = pa.schema([("id", pa.int32()), ("a", pa.int32())])


def test_a_new_table_takes_the_batch_columns_and_a_history_its_version_columns() -> None:
    mirror = plan(None, None, BASE)
    assert mirror.schema == BASE_SCHEMA and mirror.prior is None
    assert (mirror.widened, mirror.retyped) == (set(), {})
    history = plan(None, None, BASE, mode="history")
    assert history.schema == pa.schema(
        [*BASE_SCHEMA, pa.field(START_AT, SEQUENCE_TYPE), pa.field(END_AT, SEQUENCE_TYPE)]
    )


def test_an_added_column_is_added_and_says_how_it_came() -> None:
    appended = shape(("id", INT4, True), ("a", INT4), ("b", TEXT))
    evolution = plan(BASE_SCHEMA, BASE, appended)
    assert evolution.schema.names == ["id", "a", "b"]
    assert evolution.schema.field("b").type == pa.string()
    assert evolution.prior == ["id", "a"]
    assert set(evolution.added) == {"b"} and evolution.added["b"].appended
    # a column that appears before the last one was not ADDed: renamed, or newly published
    placed = shape(("id", INT4, True), ("b", TEXT), ("a", INT4))
    assert not plan(BASE_SCHEMA, BASE, placed).added["b"].appended


def test_a_dropped_column_stays() -> None:
    evolution = plan(BASE_SCHEMA, BASE, shape(("id", INT4, True)))
    assert evolution.schema == BASE_SCHEMA
    assert (evolution.added, evolution.widened, evolution.retyped) == ({}, set(), {})


@pytest.mark.parametrize(
    ("old", "new", "arrow"),
    [
        ((INT2, -1), (INT4, -1), pa.int32()),
        ((INT4, -1), (INT8, -1), pa.int64()),
        ((FLOAT4, -1), (FLOAT8, -1), pa.float64()),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(14, 2)), pa.decimal128(14, 2)),
    ],
)
def test_a_lossless_widening_rewrites_the_column(
    old: tuple[int, int], new: tuple[int, int], arrow: pa.DataType
) -> None:
    before = shape(("id", INT4, True), ("a", old[0], False, old[1]))
    after = shape(("id", INT4, True), ("a", new[0], False, new[1]))
    current = plan(None, None, before).schema
    evolution = plan(current, before, after)
    assert evolution.widened == {"a"} and evolution.retyped == {}
    assert evolution.schema.field("a").type == arrow
    # and back to the narrower type: the wider column stays as it is
    back = plan(evolution.schema, after, before)
    assert back.schema == evolution.schema and back.widened == set()


def test_a_type_change_the_values_cannot_follow_is_retyped() -> None:
    to_text = shape(("id", INT4, True), ("a", TEXT))
    evolution = plan(BASE_SCHEMA, BASE, to_text)
    assert set(evolution.retyped) == {"a"} and evolution.widened == set()
    assert evolution.schema.field("a").type == pa.string()
    assert evolution.retyped["a"].shape == to_text  # the change it came with


def test_a_key_type_change_or_one_without_a_key_stops_with_a_line() -> None:
    """Values read again per key need a key that is not the changed column."""
    key_to_text = shape(("id", TEXT, True), ("a", INT4))
    with pytest.raises(SchemaChangeError, match=r"public\.t.*id") as raised:
        plan(BASE_SCHEMA, BASE, key_to_text)
    assert "LSN 0/100" in str(raised.value)
    keyless = shape(("id", INT4), ("a", INT4))
    with pytest.raises(SchemaChangeError, match=r"\ba\b"):
        plan(BASE_SCHEMA, keyless, shape(("id", INT4), ("a", TEXT)))


def test_a_table_ahead_of_its_batch_is_left_as_it_is() -> None:
    """A crash after a rewrite for a later type change and before the batch's commit: the
    replayed batch still describes the old type; the table keeps the new one."""
    ahead = pa.schema([("id", pa.int32()), ("a", pa.string())])
    evolution = plan(ahead, BASE, BASE)
    assert evolution.schema == ahead
    assert (evolution.widened, evolution.retyped) == (set(), {})


def test_history_column_names_and_types_the_table_format_refuses() -> None:
    clash = shape(("id", INT4, True), (START_AT, INT4))
    with pytest.raises(TargetError, match="the name of a history column"):
        plan(None, None, clash, mode="history")

    def refuse(source: str, field: pa.Field) -> None:
        if field.name == "b":
            raise TargetError(f"{source}.{field.name}: cannot store")

    with pytest.raises(TargetError, match=r"public\.t\.b: cannot store"):
        plan(
            BASE_SCHEMA, BASE, shape(("id", INT4, True), ("a", INT4), ("b", TEXT)), storable=refuse
        )


def test_each_run_of_a_shape_counts() -> None:
    """A type changed and changed back within a batch: both changes are steps."""
    to_text = shape(("id", INT4, True), ("a", TEXT))
    evolution = plan(BASE_SCHEMA, BASE, to_text, BASE)
    assert set(evolution.retyped) == {"a"}
    assert evolution.retyped["a"].shape == BASE  # its last type change: back to int


def test_a_reconcile_takes_the_copys_types_and_keeps_what_is_wider() -> None:
    """`plan_reconcile`: the target's columns in its order, each in the copy's type where the
    source changed it (widened, a composite reshaped, retyped), a column the target holds
    wider left as it is, a column the copy no longer has kept, the copy's new ones after."""
    pair = pa.struct([("k", pa.string()), ("v", pa.string())])
    current = pa.schema(
        [
            ("id", pa.int32()),
            ("n", pa.int32()),
            ("t", pa.int32()),
            ("p", pair),
            ("wide", pa.int64()),
            ("gone", pa.string()),
        ]
    )
    reshaped = pa.struct([("k", pa.string()), ("v", pa.string()), ("x", pa.int32())])
    copied = pa.schema(
        [
            ("id", pa.int32()),
            ("n", pa.int64()),
            ("t", pa.string()),
            ("p", reshaped),
            ("wide", pa.int32()),
            ("new", pa.bool_()),
        ]
    )
    schema, changed = plan_reconcile(current, copied)
    assert schema == pa.schema(
        [
            ("id", pa.int32()),
            ("n", pa.int64()),
            ("t", pa.string()),
            ("p", reshaped),
            ("wide", pa.int64()),
            ("gone", pa.string()),
            ("new", pa.bool_()),
        ]
    )
    assert changed == {"n", "t", "p"}
    assert plan_reconcile(current, current) == (current, set())
