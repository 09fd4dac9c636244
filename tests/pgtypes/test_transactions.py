"""xid, cid, xid8, pg_snapshot and txid_snapshot (and their arrays): streamed text and binary
values equal each other and the server's own."""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY, PgSnapshot
from pgcdc.types.transactions import snapshot_binary, snapshot_text

from .helpers import stream_both

COLUMNS = (
    "x xid, c cid, x8 xid8, s pg_snapshot, ts txid_snapshot, xa xid[], x8a xid8[], "
    "sa pg_snapshot[], tsa txid_snapshot[]"
)
TOP = 2**64 - 1
ROWS = [
    "'0', '0', '0', '1:1:', '1:1:', '{}', '{}', '{}', '{}'",
    f"'4294967295', '4294967295', '{TOP}', '1:{TOP}:5,6,{TOP - 1}', '10:20:10,14,15', "
    f"'{{1,NULL,4294967295}}', '{{0,NULL,{TOP}}}', "
    f"ARRAY['10:20:10,14,15'::pg_snapshot, NULL, '3:3:'], ARRAY['7:9:8'::txid_snapshot]",
    "pg_current_xact_id()::xid, '7', pg_current_xact_id(), pg_current_snapshot(), "
    "txid_current_snapshot(), ARRAY[pg_current_xact_id()::xid], ARRAY[pg_current_xact_id()], "
    "ARRAY[pg_current_snapshot()], ARRAY[txid_current_snapshot()]",
    "null, null, null, null, null, null, null, null, null",
]


def server_values(pg: Database) -> list[tuple[Any, ...]]:
    """The server's values, by routes that never print the types: xid, cid and xid8 as
    numbers, a snapshot as the numbers pg_snapshot_xmin, _xmax and _xip give (an array of
    them, or its text inside arrays)."""

    def snapshot(expr: str) -> str:
        return (
            f"CASE WHEN {expr} IS NOT NULL THEN ARRAY[pg_snapshot_xmin({expr})::text::numeric, "
            f"pg_snapshot_xmax({expr})::text::numeric] || ARRAY(SELECT x::text::numeric "
            f"FROM pg_snapshot_xip({expr}) x ORDER BY x) END"
        )

    def each(array: str, element: str) -> str:
        return (
            f"ARRAY(SELECT ({snapshot(element)})::text "
            f"FROM unnest({array}) WITH ORDINALITY u(e, n) ORDER BY n)"
        )

    return pg.execute(
        "SELECT x::text::int8, c::text::int8, x8::text::numeric, "
        f"{snapshot('s')}, {snapshot('ts::text::pg_snapshot')}, "
        "xa::text::int8[], x8a::text::numeric[], "
        f"{each('sa', 'e')}, {each('tsa', 'e::text::pg_snapshot')} "
        "FROM src ORDER BY id"
    )


def as_snapshot(numbers: Any) -> PgSnapshot | None:
    """[xmin, xmax, xip...] as the server gave them (numeric, or its array text) to a
    PgSnapshot."""
    if numbers is None:
        return None
    if isinstance(numbers, str):  # '{10,20,10,14,15}'
        numbers = numbers.strip("{}").split(",")
    xmin, xmax, *xip = (int(n) for n in numbers)
    return PgSnapshot(xmin, xmax, tuple(xip))


def test_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, COLUMNS, ROWS)
    assert text == binary
    server = server_values(pg)
    for got, want in zip(text, server, strict=True):
        x, c, x8, s, ts, xa, x8a, sa, tsa = want
        if s is None and x is None:  # the row of NULLs (NULL arrays become empty ones)
            assert got == (None,) * 9
            continue
        assert got[:3] == (x, c, None if x8 is None else int(x8))
        assert got[3:5] == (as_snapshot(s), as_snapshot(ts))
        assert got[5:7] == (xa, [None if v is None else int(v) for v in x8a])
        assert got[7] == [None if e is None else as_snapshot(e) for e in sa]
        assert got[8] == [as_snapshot(e) for e in tsa]
    assert text[1][2] == TOP and text[1][3] == PgSnapshot(1, TOP, (5, 6, TOP - 1))
    assert str(text[1][4]) == "10:20:10,14,15" and str(text[0][3]) == "1:1:"


def test_the_servers_text() -> None:
    """Decoded values print as the output functions print them."""
    for text in (b"1:1:", b"10:20:10,14,15", f"1:{TOP}:{TOP - 1}".encode()):
        assert str(snapshot_text(text)).encode() == text
    assert DEFAULT_REGISTRY.get(5069).decode(0x74, str(TOP).encode()) == TOP
    assert DEFAULT_REGISTRY.get(28).decode(0x62, b"\xff\xff\xff\xff") == 2**32 - 1
    assert snapshot_binary(bytes.fromhex("00000000" + "0000000000000003" * 2)) == PgSnapshot(3, 3)


TEXT, BINARY = 0x74, 0x62


@pytest.mark.parametrize(
    ("oid", "kind", "data", "message"),
    [
        (5069, TEXT, b"-1", "xid8 text"),
        (5069, TEXT, str(2**64).encode(), "xid8 text"),
        (5069, TEXT, b" 1", "xid8 text"),
        (28, TEXT, b"4294967296", "xid text"),
        (29, TEXT, b"+1", "cid text"),
        (5069, BINARY, b"\x00" * 7, "xid8 binary needs 8 bytes"),
        (28, BINARY, b"\x00" * 8, "xid binary needs 4 bytes"),
        (5038, TEXT, b"1:2", "pg_snapshot text"),
        (5038, TEXT, b"1:2:3:4", "pg_snapshot text"),
        (5038, TEXT, b"1:2:3,", "pg_snapshot text"),
        (5038, TEXT, b"a:2:", "pg_snapshot text"),
        (2970, BINARY, b"\x00" * 19, "at least 20 bytes"),
        (2970, BINARY, b"\x00\x00\x00\x01" + b"\x00" * 16, "cannot hold 1 transaction ids"),
        (5038, BINARY, b"\xff\xff\xff\xff" + b"\x00" * 16, "cannot hold -1 transaction ids"),
    ],
)
def test_bad_bytes_raise(oid: int, kind: int, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        DEFAULT_REGISTRY.get(oid).decode(kind, data)
