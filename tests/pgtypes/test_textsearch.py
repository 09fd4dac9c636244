"""tsvector and tsquery: the text rebuilt from the binary form is exactly the server's output,
for edge values streamed through pgoutput and for random queries."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types.textsearch import tsquery_binary, tsquery_text, tsvector_binary, tsvector_text

from .helpers import stream_both

TSVECTORS = [
    "''",
    "'a fat cat sat on a mat and ate a fat rat'",
    "'a:1 fat:2,11 cat:3A sat:4B,5C,6D on:16383 huge:20000'",
    "$$'don''t' 'back\\\\slash' 'ünï🐘':1A 'x y':2$$",
    "setweight(to_tsvector('english', 'The quick brown foxes jumped'), 'B')",
    "to_tsvector('simple', repeat('word ', 300))",
]
TSQUERIES = [
    "''",
    "'fat & rat'",
    "'fat & (rat | cat)'",
    "'(fat | rat) & cat'",
    "'!cat'",
    "'!(a & b)'",
    "'!!a'",
    "'!(a <-> b)'",
    "'a & !b | c'",
    "'a <-> b'",
    "'a <3> b'",
    "'a <0> b'",
    "'a <-> (b <-> c)'",
    "'(a <-> b) <-> c'",
    "'(a | b) <-> (c & d)'",
    "'super:*'",
    "'a:AB'",
    "'a:*BD & b:C | c:*ABCD'",
    "$$'don''t' & 'back\\\\slash' | 'ünï🐘':*A$$",
    "to_tsquery('english', 'The & quick & !brown <-> foxes')",
    "phraseto_tsquery('english', 'the quick brown fox jumped')",
    "websearch_to_tsquery('english', '\"sad cat\" or \"fat rat\" -dog')",
]


def test_values_equal_the_servers(pg: Database) -> None:
    count = max(len(TSVECTORS), len(TSQUERIES))
    rows = [
        f"{TSVECTORS[i] if i < len(TSVECTORS) else 'null'}::tsvector, {TSQUERIES[i]}::tsquery"
        for i in range(count)
    ]
    rows.append("null, null")
    text, binary = stream_both(pg, "tv tsvector, tq tsquery", rows)
    with pg.connect() as conn:
        server = conn.execute("SELECT tv::text, tq::text FROM src ORDER BY id").fetchall()
    assert text == binary == server
    assert text[2][0] == "'a':1 'cat':3A 'fat':2,11 'huge':16383 'on':16383 'sat':4B,5C,6"
    assert text[3][0] == "'back\\\\slash' 'don''t' 'x y':2 'ünï🐘':1A"
    assert text[7][1] == "!( 'a' <-> 'b' )" and text[12][1] == "'a' <-> ( 'b' <-> 'c' )"
    assert text[17][1] == "'a':*BD & 'b':C | 'c':*ABCD"


def test_parsers() -> None:
    assert tsvector_text(b"'a':1") == "'a':1" and tsquery_text(b"'a'") == "'a'"
    assert tsvector_binary(b"\x00\x00\x00\x00") == "" and tsquery_binary(b"\x00\x00\x00\x00") == ""
    one = struct.pack(">i", 1) + b"a\0" + struct.pack(">H3H", 3, 1 | 3 << 14, 2, 3 | 1 << 14)
    assert tsvector_binary(one) == "'a':1A,2,3C"


_VALUE = b"\x01\x00\x00a\x00"
_AND = b"\x02\x02"


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (tsvector_text, b"'\xff'", "tsvector is not valid UTF-8"),
        (tsvector_binary, b"\x00\x00", "tsvector binary is truncated"),
        (tsvector_binary, b"\xff\xff\xff\xff", "negative lexeme count"),
        (tsvector_binary, b"\x00\x00\x00\x01a", "tsvector binary is truncated"),
        (tsvector_binary, b"\x00\x00\x00\x01a\x00\x00\x02\x00\x01", "truncated"),
        (tsvector_binary, b"\x00\x00\x00\x01a\x00\x00\x00\x00", "1 bytes after its end"),
        (tsvector_binary, b"\x00\x00\x00\x01\xff\x00\x00\x00", "lexeme is not valid UTF-8"),
        (tsquery_binary, b"\x00\x00\x00", "tsquery binary is truncated"),
        (tsquery_binary, b"\x80\x00\x00\x00", "negative item count"),
        (tsquery_binary, b"\x00\x00\x00\x01\x03", "unknown item type 3"),
        (tsquery_binary, b"\x00\x00\x00\x01\x02\x09", "unknown operator 9"),
        (tsquery_binary, b"\x00\x00\x00\x01\x01\x10\x00a\x00", "weight bitmap 16"),
        (tsquery_binary, b"\x00\x00\x00\x01\x01\x00\x00a", "truncated"),
        (tsquery_binary, b"\x00\x00\x00\x02" + _AND + _VALUE, "without two operands"),
        (tsquery_binary, b"\x00\x00\x00\x01\x02\x01", "! operator without an operand"),
        (tsquery_binary, b"\x00\x00\x00\x02" + _VALUE * 2, "leaves 2 operands"),
        (tsquery_binary, b"\x00\x00\x00\x01" + _VALUE + b"x", "1 bytes after its end"),
        (tsquery_binary, b"\x00\x00\x00\x01\x02\x04\x00", "truncated"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)


def _quote(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


_words = st.sampled_from(["a", "fat", "don't", "back\\slash", "ünï🐘", "x y", "b", "c"])
_operands = st.builds(
    lambda word, prefix, weights: (
        _quote(word)
        + (":" if prefix or weights else "")
        + ("*" if prefix else "")
        + "".join(weights)
    ),
    _words,
    st.booleans(),
    st.lists(st.sampled_from("ABCD"), unique=True, max_size=4),
)
_operators = st.sampled_from(["&", "|", "<->", "<2>", "<0>", "<16384>"])
_queries = st.recursive(
    _operands,
    lambda sub: st.one_of(
        st.builds(lambda q: f"!({q})", sub),
        st.builds(lambda left, op, right: f"({left}) {op} ({right})", sub, _operators, sub),
    ),
    max_leaves=12,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=_queries)
def test_random_queries_print_as_the_server_does(pg: Database, query: str) -> None:
    """Fully parenthesised random queries: the server drops the parentheses its priorities make
    redundant, and the text rebuilt from tsquerysend must match to the byte."""
    shown, sent = pg.execute(
        "SELECT q::text, tsquerysend(q) FROM (SELECT %s::tsquery q) s", [query]
    )[0]
    assert tsquery_binary(sent) == shown


_lexemes = st.lists(
    st.tuples(
        st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=6),
        st.lists(st.tuples(st.integers(1, 16383), st.sampled_from(["", "A", "B", "C", "D"]))),
    ),
    max_size=8,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lexemes=_lexemes)
def test_random_tsvectors_print_as_the_server_does(pg: Database, lexemes: list) -> None:
    words = []
    for word, positions in lexemes:
        spots = ",".join(f"{p}{w}" for p, w in positions)
        words.append(_quote(word) + (f":{spots}" if spots else ""))
    row = pg.execute(
        "SELECT v::text, tsvectorsend(v) FROM (SELECT %s::tsvector v) s", [" ".join(words)]
    )
    shown, sent = row[0]
    assert tsvector_binary(sent) == shown
