"""json, jsonb and xml: streamed text and binary values are the server's text, and each other."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types.documents import json_text, jsonb_binary, jsonb_text, xml_text

from .helpers import stream_both

JSON = [
    "'{}'",
    "'[]'",
    "'null'",
    "'\"\"'",
    # unicode, escapes (kept as written by json, decoded by jsonb), whitespace, duplicate keys
    """'{"b": 1, "a": [1, 2.50, 1e3, -0], "é": "ünï 🐘 \\u00e9 \\"q\\" \\\\ \\n\\t", "b": 2}'""",
    """'  {"zz": {"y": true, "x": false}, "a": null, "aaa": "\\ud83d\\ude00"}  '""",
    "'123456789012345678901234567890.5'",
    "(repeat('[', 500) || repeat(']', 500))::json",
]
XML = [
    "'<a/>'",
    '\'<?xml version="1.0" encoding="UTF-8"?><doc x="1">é &amp; 🐘</doc>\'',
    '\'<?xml version="1.0" standalone="yes"?>\n<r/>\'',
    "'text <b>and</b> markup'",  # content, not a document
    "''",
]


def test_json_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, "j json, jb jsonb", [f"{j}::json, {j}::jsonb" for j in JSON])
    with pg.connect() as conn:
        rows = conn.execute("SELECT j, jb, j::text, jb::text FROM src ORDER BY id").fetchall()
    assert text == binary
    for (j, jb), (j_obj, jb_obj, j_shown, jb_shown) in zip(text, rows, strict=True):
        assert isinstance(j, str) and isinstance(jb, str)
        assert (j, jb) == (j_shown, jb_shown)
        assert json.loads(j) == j_obj and json.loads(jb) == jb_obj
    assert text[4][0].count('"b"') == 2 and "\\u00e9" in text[4][0]  # json keeps the input
    assert text[4][1].count('"b"') == 1 and '"a": [1, 2.50, 1e3' not in text[4][1]
    assert text[5][1].startswith('{"a": null, "zz"') and "😀" in text[5][1]  # jsonb reorders


def test_xml_values_equal_the_servers(pg: Database) -> None:
    try:
        pg.execute("SELECT '<a/>'::xml")
    except psycopg.errors.FeatureNotSupported:
        pytest.skip(f"PostgreSQL {pg.server.version} here is built without libxml")
    text, binary = stream_both(pg, "x xml", XML)
    with pg.connect() as conn:
        # xml_out's text (x::text would be the stored text, declaration and all)
        shown = conn.execute("SELECT x FROM src ORDER BY id").fetchall()
    assert text == binary == shown
    assert text[1][0] == '<doc x="1">é &amp; 🐘</doc>'  # the encoding declaration is dropped
    assert text[2][0].startswith('<?xml version="1.0" standalone="yes"?>')


def test_jsonb_binary_version() -> None:
    assert jsonb_binary(b'\x01{"a": 1}') == '{"a": 1}'
    assert json_text("é".encode()) == "é" and jsonb_text(b"[]") == "[]"


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (jsonb_binary, b"", "jsonb binary is empty"),
        (jsonb_binary, b"\x02{}", "unsupported format version 2"),
        (jsonb_binary, b"\x01\xff", "jsonb is not valid UTF-8"),
        (json_text, b'"\xc3"', "json is not valid UTF-8 at byte 1"),
        (xml_text, b"<a>\xff</a>", "xml is not valid UTF-8"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)
