"""Typed values into Delta (the mapping of `pgcdc.types`) and `read_target` through a real
local Spark session without Delta's jars."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc.spark import read_target
from pgcdc.targets import DeltaTarget
from pgcdc.types.mapping import MappingOptions

from .envelopes import (
    INT4,
    INT4_ARRAY,
    JSONB,
    NUMERIC,
    TEXT,
    TIMESTAMPTZ,
    UNCHANGED,
    delete,
    envelope,
    insert,
    numeric,
    relation,
    txn,
    update,
)

TYPED = relation(
    ("id", INT4, True),
    ("amount", NUMERIC, False, numeric(12, 2)),
    ("at", TIMESTAMPTZ),
    ("doc", JSONB),
    ("tags", INT4_ARRAY),
    ("note", TEXT),
    ("day", 1082),
    ("raw", 17),
)
VALUES = {
    "id": "1",
    "amount": "1234.50",
    "at": "2024-06-01 10:34:56.789+00",
    "doc": '{"a": [1, 2], "b": null}',
    "tags": "{1,NULL,3}",
    "note": "héllo, 'world'",
    "day": "2024-02-29",
    "raw": "\\x00ff",
}
EXPECTED = {
    "id": 1,
    "amount": Decimal("1234.50"),
    "at": datetime(2024, 6, 1, 10, 34, 56, 789000, tzinfo=UTC),
    "doc": '{"a": [1, 2], "b": null}',
    "tags": [1, None, 3],
    "note": "héllo, 'world'",
    "day": date(2024, 2, 29),
    "raw": b"\x00\xff",
}


def plain(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if out.get("at") is not None:
        out["at"] = out["at"].astimezone(UTC)
    return out


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_typed_values_round_trip(tmp_path: Path, mode: str) -> None:
    t = DeltaTarget(str(tmp_path / mode), mode, app_id="pgcdc:test")  # type: ignore[arg-type]
    t.apply(envelope(txn(0x100, insert(TYPED, **VALUES))))
    keep = {name: UNCHANGED for name in VALUES if name not in ("id", "note")}
    t.apply(envelope(txn(0x200, update(TYPED, {"id": "1", "note": "changed", **keep}))))
    data = t.to_arrow()
    assert data.schema.field("amount").type == pa.decimal128(12, 2)
    assert data.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert data.schema.field("tags").type.value_type == pa.int32()
    current = data if mode == "mirror" else data.filter(data.column("__END_AT").is_null())
    (row,) = current.select(list(VALUES)).to_pylist()
    assert plain(row) == {**EXPECTED, "note": "changed"}


def test_out_of_range_values_under_the_null_policy(tmp_path: Path) -> None:
    t = DeltaTarget(
        str(tmp_path / "t"), "mirror", app_id="a", options=MappingOptions(on_out_of_range="null")
    )
    t.apply(envelope(txn(0x100, insert(TYPED, id="1", at="infinity", note="x"))))
    (row,) = t.to_arrow().select(["id", "at", "note", "_pgcdc_out_of_range"]).to_pylist()
    assert row == {"id": 1, "at": None, "note": "x", "_pgcdc_out_of_range": ["at"]}


def test_read_target_with_spark(tmp_path: Path, spark: Any) -> None:
    small = relation(("id", INT4, True), ("name", TEXT))
    t = DeltaTarget(str(tmp_path / "h"), "history", app_id="pgcdc:test")
    t.apply(envelope(txn(0x100, insert(small, id=1, name="a"))))
    t.apply(envelope(txn(0x200, update(small, {"id": 1, "name": "b"}))))
    wider = relation(("id", INT4, True), ("name", TEXT), ("n", INT4))
    t.apply(envelope(txn(0x300, insert(wider, id=2, name="c", n=5))))  # an added column
    frame = read_target(spark, t.path)
    got = sorted(
        (r["id"], r["name"], r["n"], r["__START_AT"]["commit_lsn"], r["__END_AT"] is None)
        for r in frame.collect()
    )
    assert got == [
        (1, "a", None, 0x100, False),
        (1, "b", None, 0x200, True),
        (2, "c", 5, 0x300, True),
    ]
    assert frame.schema["__END_AT"].dataType.simpleString() == (
        "struct<commit_lsn:bigint,ordinal:bigint>"
    )

    m = DeltaTarget(str(tmp_path / "m"), "mirror", app_id="pgcdc:test")
    m.apply(envelope(txn(0x100, insert(small, id=1), delete(small, id=1))))
    empty = read_target(spark, m.path)  # a table with no data files yet
    assert empty.columns == ["id", "name"] and empty.count() == 0

    # rows that deletion vectors mark deleted are left out (pgcdc writes a local table's
    # updates and deletes so): the read equals the table as delta-rs reads it
    dv = DeltaTarget(str(tmp_path / "dv"), "mirror", app_id="pgcdc:test")
    dv.apply(envelope(txn(0x100, *(insert(small, id=i, name="v0") for i in range(40)))))
    dv.apply(
        envelope(txn(0x200, *(update(small, {"id": i, "name": "v1"}) for i in range(0, 40, 3))))
    )
    dv.apply(envelope(txn(0x300, *(delete(small, id=i) for i in range(1, 40, 4)))))
    assert "deletionVectors" in (DeltaTable(dv.path).protocol().reader_features or ())
    read = sorted((r["id"], r["name"]) for r in read_target(spark, dv.path).collect())
    assert read == sorted((r["id"], r["name"]) for r in dv.to_arrow().to_pylist())
    assert len(read) == 30 and (3, "v1") in read and (4, "v0") in read


def test_rows_as_spark_hands_them_over(tmp_path: Path, spark: Any) -> None:
    """The pipeline passes ``DataFrame.toArrow()`` of envelope rows: maps as Arrow maps."""
    from pgcdc.spark.envelope import ENVELOPE_SCHEMA

    small = relation(("id", INT4, True), ("name", TEXT), ("doc", TEXT))
    batch = envelope(
        txn(0x100, insert(small, id=1, name="a", doc="big"), insert(small, id=2)),
        txn(0x200, update(small, {"id": 1, "name": "b", "doc": UNCHANGED}), delete(small, id=2)),
    )
    handed = spark.createDataFrame(batch, ENVELOPE_SCHEMA).orderBy("lsn", ascending=False).toArrow()
    t = DeltaTarget(str(tmp_path / "m"), "mirror", app_id="pgcdc:test")
    assert t.apply(handed).watermark == 0x200
    assert t.to_arrow().to_pylist() == [{"id": 1, "name": "b", "doc": "big"}]
    log = DeltaTarget(str(tmp_path / "c"), "changelog", app_id="pgcdc:test")
    assert log.apply(handed).upserts == 4 and log.to_arrow().num_rows == 4
