"""Arrays: streamed text and binary values equal the server's.

Three oracles: psycopg's own lists (int and text arrays with lower bound 1); the server's
elements one by one (``unnest`` with ordinality, each read with the element codec, shaped by
``array_dims``), for any element type; and the server's ``::text``, which our value rendered
the way ``array_out`` does must reproduce exactly (quoting, escaping, ``[lo:hi]=`` prefixes).
Random nested text arrays go through ``array_in``/``array_out``/``array_send`` with Hypothesis.
"""

from __future__ import annotations

import re
from math import prod
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY, Multirange, PgArray, Range, TypeCodec, TypeRegistry
from pgcdc.types.arrays import array_codec, parse_array_binary, parse_array_text

from .helpers import kinds_sent, stream_inserts

# --- rendering values the way the server's output functions do (the oracle for ::text) -------

#: C isspace() in the server's output functions: ASCII white space only.
SPACE = frozenset(" \t\n\r\v\f")


def _quoted(text: str, specials: str, escape: str) -> str:
    """`text` double-quoted if empty or holding a special character or white space; inside,
    quotes and backslashes escaped with `escape` (a backslash, or the character doubled)."""
    if text and not any(c in specials or c in SPACE for c in text):
        return text
    out = text.replace("\\", escape + "\\" if escape == "\\" else "\\\\")
    out = out.replace('"', escape + '"' if escape == "\\" else '""')
    return f'"{out}"'


def render(value: Any, delim: str = ",") -> str:
    """`value` (as decoded) in the server's text form: str, int, bool, float, list/PgArray
    (array_out), dict (record_out), Range (range_out), Multirange."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):  # float8out's shortest form, for the values tests use
        text = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(repr(value), repr(value))
        return text.removesuffix(".0")
    if isinstance(value, list | PgArray):
        return render_array(value, delim)
    if isinstance(value, dict):
        fields = ("" if v is None else _quoted(render(v), '"\\(),', '"') for v in value.values())
        return "(" + ",".join(fields) + ")"
    if isinstance(value, Range):
        if value.empty:
            return "empty"
        lo = "" if value.lower is None else _quoted(render(value.lower), '"\\()[],', '"')
        hi = "" if value.upper is None else _quoted(render(value.upper), '"\\()[],', '"')
        return f"{value.bounds[0]}{lo},{hi}{value.bounds[1]}"
    if isinstance(value, Multirange):
        return "{" + ",".join(render(r) for r in value.ranges) + "}"
    return str(value)


def render_array(value: list[Any] | PgArray, delim: str = ",") -> str:
    """``array_out``: NULL, or quoted when empty, spelling NULL, or holding ``"\\{}``, the
    delimiter or white space; backslash escapes inside quotes."""
    prefix = ""
    if isinstance(value, PgArray):
        dims = shape(value.values)
        bounds = zip(value.lower_bounds, dims, strict=True)
        prefix = "".join(f"[{lo}:{lo + n - 1}]" for lo, n in bounds) + "="
        value = value.values
    if not value:
        return "{}"
    depth = len(shape(value))

    def element(v: Any) -> str:
        if v is None:
            return "NULL"
        text = render(v)
        if text.isascii() and text.upper() == "NULL":
            return f'"{text}"'
        return _quoted(text, '"\\{}' + delim, "\\")

    def level(v: list[Any], d: int) -> str:
        parts = (level(x, d + 1) if d < depth else element(x) for x in v)
        return "{" + delim.join(parts) + "}"

    return prefix + level(value, 1)


def shape(value: list[Any]) -> list[int]:
    dims = []
    while isinstance(value, list):
        dims.append(len(value))
        if not value:
            break
        value = value[0]
    return dims


def nest(flat: list[Any], dims: list[int]) -> list[Any]:
    for size in reversed(dims[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


# --- the server's elements, one by one ----------------------------------------------------

DIMS = re.compile(r"\[(-?\d+):(-?\d+)\]")


def server_arrays(pg: Database, table: str, column: str, element_oid: int) -> list[Any]:
    """Each row's `column` (ordered by id) rebuilt from ``unnest`` and ``array_dims``, each
    element read from its output text with the registry's element codec."""
    parse = DEFAULT_REGISTRY.get(element_oid).from_text
    # format('%s') calls the element's output function (bool::text would say "true").
    rows = pg.execute(
        f"SELECT array_dims({column}), {column} IS NULL, ARRAY(SELECT CASE WHEN e IS NOT NULL "
        f"THEN format('%s', e) END FROM unnest({column}) WITH ORDINALITY AS u(e, n) "
        f"ORDER BY n) FROM {table} ORDER BY id"
    )
    out: list[Any] = []
    for dims_text, null, elements in rows:
        if null:
            out.append(None)
            continue
        flat = [None if e is None else parse(e.encode()) for e in elements]
        if dims_text is None:
            out.append([])
            continue
        bounds = [(int(lo), int(hi)) for lo, hi in DIMS.findall(dims_text)]
        value = nest(flat, [hi - lo + 1 for lo, hi in bounds])
        lowers = tuple(lo for lo, _ in bounds)
        out.append(PgArray(value, lowers) if any(lo != 1 for lo in lowers) else value)
    return out


# --- streamed arrays of the scalar types ---------------------------------------------------

TABLE = """CREATE TABLE a (id int, i int4[], l int8[], s int2[], t text[], f float8[],
 r float4[], b bool[], v varchar(5)[], c char(3)[], n name[], o oid[], ch "char"[])"""
ROWS = r"""INSERT INTO a VALUES
 (1, '{1,2,3}', '{-9223372036854775808,9223372036854775807}', '{-32768,32767}',
  ARRAY['a,b', 'a"b', 'NULL', NULL, '', '{x}', 'back\slash', ' lead', 'ünï 🐘', 'null',
        E'tab\there', E'new\nline', 'a;b', 'x}y', '"', '\', 'Null '],
  '{1.5,-0,NaN,Infinity,-Infinity,1e-300}', '{1.1,3.4028235e38}', '{t,f,NULL}',
  '{ab,"a b"}', '{ab,a}', '{pg_class,"a b"}', '{0,4294967295}', '{a,"\""}'),
 (2, '{{1,2,3},{4,5,6}}', '[0:1]={1,2}', '[-3:-2][5:6]={{1,2},{3,4}}',
  '{{{a,b},{c,NULL}},{{"{","}"},{",",""}}}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}'),
 (3, '{NULL}', '{NULL,NULL}', '{{NULL}}', '{NULL,"NULL"}', '{NULL}', '{NULL}', '{NULL}',
  '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}'),
 (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (5, array_fill(7, ARRAY[2,3,4]), ARRAY(SELECT g FROM generate_series(1, 2000) g),
  '[2:3]={1,2}', ARRAY(SELECT repeat('x', g % 7) || g FROM generate_series(1, 500) g),
  '{{1,2},{3,4}}', '{}', '{{t},{f}}', '[0:0]={a}', '{}', '{}', '{}', '{}')"""
COLUMNS = [("i", 23), ("l", 20), ("s", 21), ("t", 25), ("f", 701), ("r", 700), ("b", 16)]
COLUMNS += [("v", 1043), ("c", 1042), ("n", 19), ("o", 26), ("ch", 18)]


def same(got: Any, want: Any) -> bool:
    """Equality with NaN equal to itself and -0.0 told from 0.0."""
    if isinstance(want, float) and isinstance(got, float):
        if want != want:
            return got != got
        return got == want and str(got)[0] == str(want)[0]
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, PgArray) and isinstance(got, PgArray):
        return got.lower_bounds == want.lower_bounds and same(got.values, want.values)
    return type(got) is type(want) and got == want


Streamed = tuple[Database, list[tuple[Any, ...]], list[tuple[Any, ...]]]


@pytest.fixture
def streamed(pg: Database) -> Streamed:
    """ROWS streamed in text mode, then again (the table emptied first) in binary mode."""
    pg.execute(TABLE)
    text = stream_inserts(pg, "a", binary=False, insert=ROWS)
    binary = stream_inserts(pg, "a", binary=True, insert=f"TRUNCATE a; {ROWS}")
    return pg, text, binary


def test_streamed_arrays_equal_the_servers(streamed: Streamed) -> None:
    pg, text, binary = streamed
    assert len(text) == len(binary) == 5
    for index, (column, element_oid) in enumerate(COLUMNS, start=1):
        want = server_arrays(pg, "a", column, element_oid)
        for mode, rows in (("text", text), ("binary", binary)):
            got = [row[index] for row in rows]
            assert all(map(same, got, want)), (column, mode, got, want)


def test_arrays_equal_psycopgs_and_render_as_the_server(streamed: Streamed) -> None:
    pg, text, binary = streamed
    server = pg.execute(
        "SELECT id, i, l, s, t, i::text, l::text, s::text, t::text FROM a ORDER BY id"
    )
    for (rid, *values), row_t, row_b in zip(server, text, binary, strict=True):
        assert row_t[0] == row_b[0] == rid
        loaded, texts = values[:4], values[4:]
        for k, (want, want_text) in enumerate(zip(loaded, texts, strict=True), start=1):
            for got in (row_t[k], row_b[k]):
                if want is None:
                    assert got is None
                    continue
                if not isinstance(got, PgArray):  # psycopg drops lower bounds
                    assert got == want
                assert render_array(got) == want_text


def test_binary_mode_really_sends_binary(pg: Database) -> None:
    pg.execute("CREATE TABLE b (id int, t text[])")
    insert = "INSERT INTO b VALUES (1, '{a}')"
    assert kinds_sent(pg, "b", insert, binary=True) == {"b"}


@pytest.mark.skipif(603 not in DEFAULT_REGISTRY, reason="box is not registered")
def test_box_arrays_use_the_semicolon_delimiter(pg: Database) -> None:
    pg.execute("CREATE TABLE bx (id int, b box[])")
    insert = "INSERT INTO bx VALUES (1, '{(1,1),(0,0);(3,4),(-1,2.5);NULL}'), (2, '{}')"
    for binary in (False, True):
        got = [row[1] for row in stream_inserts(pg, "bx", binary=binary, insert=insert)]
        assert got == server_arrays(pg, "bx", "b", 603)
        assert len(got[0]) == 3 and got[0][2] is None and got[1] == []
        pg.execute("TRUNCATE bx")


# --- Hypothesis: random nested text arrays through array_in, array_out and array_send ------

ODD = ["NULL", "null", "", '"', "\\", "{", "}", ",", ";", " ", "a b", "Ünï🐘", "[1:2]=", "\t"]
ELEMENTS = st.one_of(
    st.none(),
    st.sampled_from(ODD),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=6),
)


@st.composite
def text_arrays(draw: st.DrawFn) -> list[Any] | PgArray:
    dims = draw(st.lists(st.integers(1, 3), min_size=0, max_size=3))
    if not dims:
        return []
    flat = draw(st.lists(ELEMENTS, min_size=prod(dims), max_size=prod(dims)))
    value = nest(flat, dims)
    lowers = draw(st.one_of(st.none(), st.lists(st.integers(-3, 3), min_size=len(dims))))
    if lowers is None or all(lb == 1 for lb in lowers[: len(dims)]):
        return value
    return PgArray(value, tuple(lowers[: len(dims)]))


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=text_arrays())
def test_random_text_arrays_round_trip(pg: Database, value: list[Any] | PgArray) -> None:
    literal = render_array(value)
    out, sent = pg.execute("SELECT %s::text[]::text, array_send(%s::text[])", (literal, literal))[0]
    assert out == literal
    codec = DEFAULT_REGISTRY.get(1009)
    assert codec.from_text(out.encode()) == value
    assert codec.from_binary(bytes(sent)) == value


# --- without a server ---------------------------------------------------------------------


def test_array_codecs_come_from_the_element_codec() -> None:
    registry = TypeRegistry()
    assert 1007 not in registry
    registry.add(DEFAULT_REGISTRY.get(23))
    assert 1007 in registry
    codec = registry.get(1007)
    assert codec.name == "int4[]" and codec.element_oid == 23
    assert codec.decode(ord("t"), b"{{1,NULL},{3,4}}") == [[1, None], [3, 4]]
    assert registry.get(1007) is codec  # built once
    assert registry.get(424242).name == "unknown type 424242"
    box_like = array_codec(TypeCodec(9, "x", bytes.decode, None, 10, ";"))
    assert box_like.from_text(b'{a,b;"c;d";NULL}') == ["a,b", "c;d", None]
    assert (
        box_like.from_binary(b"\0\0\0\1\0\0\0\0\0\0\0\x09\0\0\0\1\0\0\0\1\0\0\0\1z")[0].data == b"z"
    )


@pytest.mark.parametrize(
    "data",
    [
        *(b"", b"{", b"1,2", b'{"a}', b"{{1,2},{3}}", b"[1:3]={1,2}", b"[x]={1}", b"{{1},2}"),
        *(b"{1,}", b"{{1},{2}", b'{{1},"2"}', b"{1,{2}}", b'{{"a"}}}', b"{{1}{2}}"),
    ],
)
def test_malformed_array_text_is_a_value_decode_error(data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        parse_array_text(data, int)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0\0\0\1\0\0\0\0\0\0\0\x17",  # no dimensions
        b"\0\0\0\1\0\0\0\0\0\0\0\x17\0\0\0\2\0\0\0\1\0\0\0\4\0\0\0\1",  # one element of two
        b"\0\0\0\1\0\0\0\0\0\0\0\x17\0\0\0\1\0\0\0\1\0\0\0\4\0\0\0\1\0",  # a byte too many
        b"\0\0\0\1\0\0\0\7\0\0\0\x17\0\0\0\1\0\0\0\1\0\0\0\4\0\0\0\1",  # bad flags
    ],
)
def test_malformed_array_binary_is_a_value_decode_error(data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        parse_array_binary(data, lambda b: int.from_bytes(b, "big", signed=True), ("i", 4))
    with pytest.raises(ValueDecodeError):
        parse_array_binary(data, lambda b: int.from_bytes(b, "big", signed=True))
