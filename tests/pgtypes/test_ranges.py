"""Range and multirange types: streamed text and binary values equal the server's.

The oracle is the server's range functions: ``isempty``, ``lower_inc``, ``lower_inf``, ... and
each bound as the subtype's output text (read with the subtype's codec, for text mode) and
send bytes (``int4send(lower(r))``, ..., for binary mode); multiranges and arrays of ranges
are taken apart with ``unnest``. Integer ranges are also compared with psycopg's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from psycopg.types.multirange import Multirange as PsycopgMultirange

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY, EMPTY_RANGE, Multirange, Range, UnknownBinary
from pgcdc.types.ranges import multirange_codec, range_codec

from .helpers import stream_inserts

TABLE = """CREATE TABLE r (id int, i4 int4range, i8 int8range, n numrange, ts tsrange,
 tz tstzrange, d daterange, m4 int4multirange, m8 int8multirange, nm nummultirange,
 tsm tsmultirange, tzm tstzmultirange, dm datemultirange, ra int4range[], ma int4multirange[])"""
ROWS = """INSERT INTO r VALUES
 (1, '[1,5)', '(,10]', '[1.5,2.25]', '["2020-01-01 00:00","2020-01-02 12:30:00.5")',
  '[2020-01-01 00:00+00,)', '[2020-01-01,2020-02-01)', '{[1,3),[5,7)}', '{(,0),[10,)}',
  '{[1.5,2),(3,4]}', '{["2020-01-01","2020-01-02")}', '{(,"2020-01-01 00:00+00")}',
  '{[2020-01-01,2020-01-05),[2020-02-01,)}', ARRAY['[1,2)'::int4range, 'empty', NULL, '(,)'],
  ARRAY['{[1,2),(5,)}'::int4multirange, '{}', NULL]),
 (2, 'empty', 'empty', 'empty', 'empty', 'empty', 'empty', '{}', '{}', '{}', '{}', '{}', '{}',
  '{}', '{}'),
 (3, '(,)', '(,)', '(,)', '(,)', '(,)', '(,)', '{(,)}', '{(,)}', '{(,)}', '{(,)}', '{(,)}',
  '{(,)}', '{"(,)"}', '{"{(,)}"}'),
 (4, '[-2147483648,2147483646]', '[-9223372036854775808,9223372036854775806]',
  '[-5.000,-5]', '[-infinity,infinity]', '(-infinity,infinity)', '[-infinity,infinity)',
  '{[-3,-1],[1,1]}', '{[0,0]}', '{[0.1,0.2),[0.2,0.3)}', '{[-infinity,"2000-01-01")}',
  '{("1999-12-31 23:00-01",infinity]}', '{[-infinity,infinity)}', '{"[3,3]"}', NULL),
 (5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"""
RANGES = [("i4", 23), ("i8", 20), ("n", 1700), ("ts", 1114), ("tz", 1184), ("d", 1082)]
MULTIRANGES = [("m4", 23), ("m8", 20), ("nm", 1700), ("tsm", 1114), ("tzm", 1184), ("dm", 1082)]
COLUMNS = ["id"] + [c for c, _ in RANGES + MULTIRANGES] + ["ra", "ma"]


def range_fields(expr: str, send: str) -> str:
    return (
        f"{expr} IS NULL, isempty({expr}), lower_inc({expr}), upper_inc({expr}), "
        f"lower_inf({expr}), upper_inf({expr}), lower({expr})::text, upper({expr})::text, "
        f"{send}(lower({expr})), {send}(upper({expr}))"
    )


def make_range(fields: tuple[Any, ...], subtype: int, binary: bool) -> Range | None:
    null, empty, lower_inc, upper_inc, lower_inf, upper_inf, *bounds = fields
    if null:
        return None
    if empty:
        return EMPTY_RANGE
    codec = DEFAULT_REGISTRY.get(subtype)

    def bound(text: str, sent: bytes) -> Any:
        if not binary:
            return codec.from_text(text.encode())
        if codec.from_binary is None:
            return UnknownBinary(subtype, bytes(sent))
        return codec.from_binary(bytes(sent))

    lower = None if lower_inf else bound(bounds[0], bounds[2])
    upper = None if upper_inf else bound(bounds[1], bounds[3])
    return Range(lower, upper, ("[" if lower_inc else "(") + ("]" if upper_inc else ")"))


def server_values(pg: Database, binary: bool) -> dict[str, list[Any]]:
    """Each column's values, by id, rebuilt from the range functions; the arrays of
    multiranges element by element from each one's output text or send bytes."""
    pg.execute("SET TimeZone = 'UTC'")
    ids = [row[0] for row in pg.execute("SELECT id FROM r ORDER BY id")]
    out: dict[str, list[Any]] = {}
    for column, subtype in [*RANGES, *MULTIRANGES, ("ra", 23)]:
        send = pg.execute("SELECT typsend::text FROM pg_type WHERE oid = %s", (subtype,))[0][0]
        if column in dict(RANGES):
            rows = pg.execute(f"SELECT {range_fields(column, send)} FROM r ORDER BY id")
            out[column] = [make_range(row, subtype, binary) for row in rows]
            continue
        nulls = dict(pg.execute(f"SELECT id, {column} IS NULL FROM r"))
        parts: dict[int, list[Any]] = defaultdict(list)
        sql = (
            f"SELECT r.id, {range_fields('u.x', send)} FROM r, "
            f"unnest(r.{column}) WITH ORDINALITY u(x, n) ORDER BY r.id, u.n"
        )
        for rid, *fields in pg.execute(sql):
            parts[rid].append(make_range(tuple(fields), subtype, binary))
        if column == "ra":
            out[column] = [None if nulls[i] else parts[i] for i in ids]
        else:
            out[column] = [None if nulls[i] else Multirange(tuple(parts[i])) for i in ids]
    codec = DEFAULT_REGISTRY.get(4451)
    elements = pg.execute(
        "SELECT r.ma IS NULL, "
        "ARRAY(SELECT u.x::text FROM unnest(r.ma) WITH ORDINALITY u(x, n) ORDER BY u.n), "
        "ARRAY(SELECT multirange_send(u.x) FROM unnest(r.ma) WITH ORDINALITY u(x, n) "
        "ORDER BY u.n) FROM r ORDER BY id"
    )
    out["ma"] = []
    for null, texts, sent in elements:
        if null:
            out["ma"].append(None)
        elif binary:
            out["ma"].append([None if b is None else codec.from_binary(bytes(b)) for b in sent])
        else:
            out["ma"].append([None if t is None else codec.from_text(t.encode()) for t in texts])
    return out


def from_psycopg(value: Any) -> Any:
    """psycopg's Range/Multirange as ours."""
    if value is None:
        return None
    if isinstance(value, PsycopgMultirange):
        return Multirange(tuple(from_psycopg(r) for r in value))
    if value.isempty:
        return EMPTY_RANGE
    return Range(value.lower, value.upper, value.bounds)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_streamed_ranges_equal_the_servers(pg: Database, binary: bool) -> None:
    pg.execute(TABLE)
    streamed = stream_inserts(pg, "r", binary=binary, insert=ROWS)
    assert [row[0] for row in streamed] == [1, 2, 3, 4, 5]
    want = server_values(pg, binary)
    for index, column in enumerate(COLUMNS[1:], start=1):
        got = [row[index] for row in streamed]
        assert got == want[column], column
    # Integer ranges, multiranges and arrays of them equal psycopg's.
    loaded = pg.execute("SELECT i4, i8, m4, m8, ra FROM r ORDER BY id")
    for row, server_row in zip(streamed, loaded, strict=True):
        got = [row[COLUMNS.index(c)] for c in ("i4", "i8", "m4", "m8")]
        assert got == [from_psycopg(v) for v in server_row[:4]]
        ra = server_row[4]
        assert row[COLUMNS.index("ra")] == (None if ra is None else [from_psycopg(v) for v in ra])


def test_range_shapes() -> None:
    """What the streamed values look like (checked above against the server)."""
    i4 = DEFAULT_REGISTRY.get(3904)
    assert i4.from_text(b"[1,5)") == Range(1, 5, "[)")
    assert i4.from_text(b"(,5)") == Range(None, 5, "()")
    assert i4.from_text(b"empty") is EMPTY_RANGE
    assert Range(1, 2, empty=True) == EMPTY_RANGE == Range(empty=True)
    assert Range(None, 3).lower_inf and not Range(None, 3).upper_inf
    assert DEFAULT_REGISTRY.get(4451).from_text(b"{}") == Multirange()
    assert DEFAULT_REGISTRY.get(3905).from_text(b'{"[1,2)",empty,NULL}') == [
        Range(1, 2),
        EMPTY_RANGE,
        None,
    ]


def test_quoted_bounds_are_unescaped() -> None:
    """range_out doubles quotes and backslashes inside quotes; range_in also takes \\x."""
    text = range_codec(1, "textrange", 25)
    assert text.from_text(b'["a""b","c\\\\d")') == Range('a"b', "c\\d")
    assert text.from_text(b'("",",")') == Range("", ",", "()")
    assert text.from_text(b'["\\"x",y]') == Range('"x', "y", "[]")
    multi = multirange_codec(2, "textmultirange", 25, 1)
    assert multi.from_text(b'{["a,b","c)"),["x y",z]}') == Multirange(
        (Range("a,b", "c)"), Range("x y", "z", "[]"))
    )


def test_unregistered_subtypes_come_as_text_and_unknown_binary() -> None:
    codec = range_codec(1, "thing", 987654)
    assert codec.from_text(b"[a,b)") == Range("a", "b")
    got = codec.from_binary(b"\x02\0\0\0\1a\0\0\0\1b")
    assert got == Range(UnknownBinary(987654, b"a"), UnknownBinary(987654, b"b"))


@pytest.mark.parametrize(
    "data", [b"", b"[1,5", b"[1;5)", b"(1,5)x", b"<1,5)", b"[1,5>", b'["1,5)', b"emptyx"]
)
def test_malformed_range_text_is_a_value_decode_error(data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        DEFAULT_REGISTRY.get(3904).from_text(data)


@pytest.mark.parametrize(
    "data", [b"", b"\x01\0", b"\x02\0\0\0\4\0\0\0\1", b"\x18\0", b"\x02\0\0\0\4\0\0\0\1\0\0\0"]
)
def test_malformed_range_binary_is_a_value_decode_error(data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        DEFAULT_REGISTRY.get(3904).from_binary(data)


@pytest.mark.parametrize("data", [b"", b"{", b"{[1,2)", b"{[1,2)x}", b"{[1,2),}", b"[1,2)"])
def test_malformed_multirange_text_is_a_value_decode_error(data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        DEFAULT_REGISTRY.get(4451).from_text(data)


def test_malformed_multirange_binary_is_a_value_decode_error() -> None:
    codec = DEFAULT_REGISTRY.get(4451)
    assert codec.from_binary(b"\0\0\0\1\0\0\0\1\x01") == Multirange((EMPTY_RANGE,))
    for data in (b"", b"\0\0\0\1", b"\0\0\0\1\0\0\0\5\x01", b"\0\0\0\0\0"):
        with pytest.raises(ValueDecodeError):
            codec.from_binary(data)
