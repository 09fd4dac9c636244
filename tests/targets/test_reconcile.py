"""`DeltaTarget.reconcile`: a target made equal to the source's rows after the slot was lost,
only what differs changing (a history gets versions for exactly those rows)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc.targets import DeltaTarget

from .envelopes import INT4, TEXT, delete, envelope, insert, relation, rows, txn

REL = relation(("id", INT4, True), ("name", TEXT))
#: Every test both ways a batch is written (deletion vectors, copy-on-write MERGE).
pytestmark = pytest.mark.usefixtures("write_path")

FULL = relation(("id", INT4), ("name", TEXT), identity="f")


def wanted(*values: tuple[int, str | None]) -> pa.Table:
    return pa.table(
        {"id": pa.array([v[0] for v in values], pa.int32()), "name": [v[1] for v in values]}
    )


def current(t: DeltaTarget) -> list[tuple[Any, ...]]:
    data = t.to_arrow()
    if t.mode == "history":
        data = data.filter(data.column("__END_AT").is_null())
    return rows(data, "id", "name")


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_keyed_target_changes_only_what_differs(tmp_path: Path, mode: str) -> None:
    t = DeltaTarget(str(tmp_path / mode), mode, app_id="x")  # type: ignore[arg-type]
    t.apply(envelope(txn(0x100, *(insert(REL, id=i, name=f"n{i}") for i in range(1, 6)))))
    # the source at 0x900: 2 changed, 4 gone, 6 new, the rest as they were
    t.reconcile(wanted((1, "n1"), (2, "changed"), (3, "n3"), (5, "n5"), (6, "new")), 0x900, ["id"])
    assert current(t) == [(1, "n1"), (2, "changed"), (3, "n3"), (5, "n5"), (6, "new")]
    assert t.watermark == 0x900 - 1  # the copy at 0x900 holds the commits before it
    if mode == "history":
        versions = sorted(
            (r["id"], r["__START_AT"]["commit_lsn"], (r["__END_AT"] or {}).get("commit_lsn"))
            for r in t.to_arrow().to_pylist()
        )
        assert versions == [
            (1, 0x100, None),
            (2, 0x100, 0x900),
            (2, 0x900, None),
            (3, 0x100, None),
            (4, 0x100, 0x900),
            (5, 0x100, None),
            (6, 0x900, None),
        ]
    version = t.state().version
    t.reconcile(wanted((1, "n1"), (2, "changed"), (3, "n3"), (5, "n5"), (6, "new")), 0xA00, ["id"])
    assert t.state().version == (version or 0) + 1 and t.watermark == 0xA00 - 1  # the watermark


@pytest.mark.parametrize("mode", ["mirror", "history"])
def test_a_target_without_a_key_is_reconciled_as_a_multiset(tmp_path: Path, mode: str) -> None:
    t = DeltaTarget(str(tmp_path / mode), mode, app_id="x")  # type: ignore[arg-type]
    t.apply(
        envelope(
            txn(0x100, *(insert(FULL, id=1, name="a") for _ in range(3)), insert(FULL, id=2)),
            txn(0x200, delete(FULL, id=2)),
        )
    )
    t.reconcile(wanted((1, "a"), (3, "c"), (3, "c")), 0x900, [])
    assert current(t) == [(1, "a"), (3, "c"), (3, "c")]
    assert t.watermark == 0x900 - 1
    if mode == "history":
        ended = [r for r in t.to_arrow().to_pylist() if r["__END_AT"] is not None]
        assert sorted((r["id"], r["__END_AT"]["commit_lsn"]) for r in ended) == [
            (1, 0x900),
            (1, 0x900),
            (2, 0x200),
        ]


@pytest.mark.parametrize("mode", ["mirror", "history"])
@pytest.mark.parametrize("keyed", [True, False])
def test_a_reconcile_adding_a_timestamp_column(tmp_path: Path, mode: str, keyed: bool) -> None:
    """The copy brings a ``timestamp`` column the target lacks (a publication's column list
    grown, or a column added while the slot was lost): the table gets Delta's timestampNtz
    feature before the MERGE adds the TIMESTAMP_NTZ column, and stays readable."""
    t = DeltaTarget(str(tmp_path / mode), mode, app_id="x")  # type: ignore[arg-type]
    rel = REL if keyed else FULL
    t.apply(envelope(txn(0x100, insert(rel, id=1, name="a"), insert(rel, id=2, name="b"))))
    stamp = datetime(2020, 1, 1, 12)
    copy = wanted((1, "a"), (2, "b2")).append_column(
        "at", pa.array([stamp, None], pa.timestamp("us"))
    )
    t.reconcile(copy, 0x900, ["id"] if keyed else [])
    protocol = DeltaTable(t.path).protocol()  # (opens only with the feature)
    assert "timestampNtz" in set(protocol.reader_features or ()) & set(
        protocol.writer_features or ()
    )
    data = DeltaTarget(t.path, mode, app_id="x").to_arrow()  # type: ignore[arg-type]
    if mode == "history":
        data = data.filter(data.column("__END_AT").is_null())
    assert data.schema.field("at").type == pa.timestamp("us")
    # (a row the reconcile left alone keeps null in the new column: a keyed one compares
    # the columns the target had; a multiset copy of it is rewritten)
    assert (2, "b2", None) in rows(data, "id", "name", "at")
    assert t.watermark == 0x900 - 1


@pytest.mark.parametrize("mode", ["mirror", "history"])
@pytest.mark.parametrize("keyed", [True, False])
def test_a_reconcile_with_a_type_the_source_changed(tmp_path: Path, mode: str, keyed: bool) -> None:
    """While the table could not be streamed (out of its publication, the slot lost), the
    source widened a column (int to bigint, a value beyond int's range written since) and
    changed another to a type its values cannot be cast to (int to text): the target takes
    the copy's types first (the reconcile cast to the target's types and failed:
    "Integer value 79884494913 not in range"), a history's ended versions keeping what can
    be cast."""
    rel = relation(("id", INT4, True), ("n", INT4), ("t", INT4), identity="d" if keyed else "f")
    t = DeltaTarget(str(tmp_path / mode), mode, app_id="x")  # type: ignore[arg-type]
    t.apply(envelope(txn(0x100, insert(rel, id=1, n=1, t=10), insert(rel, id=2, n=2, t=20))))
    t.apply(envelope(txn(0x200, delete(rel, id=1, n=1, t=10))))
    copy = pa.table(
        {
            "id": pa.array([2, 3], pa.int32()),
            "n": pa.array([2, 79884494913], pa.int64()),
            "t": pa.array(["r20", "r30"], pa.string()),
        }
    )
    t.reconcile(copy, 0x900, ["id"] if keyed else [])
    data = DeltaTarget(t.path, mode, app_id="x").to_arrow()  # type: ignore[arg-type]
    assert data.schema.field("n").type == pa.int64()
    assert data.schema.field("t").type == pa.string()
    live = data.filter(data.column("__END_AT").is_null()) if mode == "history" else data
    assert rows(live, "id", "n", "t") == [(2, 2, "r20"), (3, 79884494913, "r30")]
    if mode == "history":  # ended before: the int values as text
        ended = data.filter(data.column("__END_AT").is_valid())
        assert sorted(rows(ended, "id", "n", "t")) == [(1, 1, "10"), (2, 2, "20")]
    assert t.watermark == 0x900 - 1
