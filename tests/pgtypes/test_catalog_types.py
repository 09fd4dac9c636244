"""Types only the catalog knows (enums, domains, composites, user range types, arrays of them,
types nobody registered): resolved from ``pg_type``, streamed values equal the server's.

The oracle is the server's ``::text`` of each column, which our decoded value, rendered the way
the output functions write it (``record_out``, ``array_out``, ``range_out``), must reproduce
exactly; binary mode must decode to the same values as text mode, and a type nobody knows to
`UnknownBinary` holding the bytes of the type's send function.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.decoding.catalog import Catalog
from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY, Multirange, Range, TypeRegistry, UnknownBinary, resolve
from pgcdc.types.catalog import TypeCatalog, composite_codec

from .helpers import stream_inserts
from .test_arrays import render

SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'a b', 'quo"te', 'NULL', 'ünï');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN dd AS posint;
CREATE DOMAIN tags AS text[];
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TYPE textrange AS RANGE (subtype = text);
CREATE TYPE inner_t AS (x int, gone int, label text);
ALTER TYPE inner_t DROP ATTRIBUTE gone;
CREATE TYPE outer_t AS (id int, name text, nested inner_t, nums int[], r int4range, m mood,
    tags tags, inners inner_t[], fr floatrange, p posint);
CREATE TABLE c (id int, m mood, ms mood[], p posint, ps posint[], d dd, tg tags, o outer_t,
    os outer_t[], fr floatrange, frs floatrange[], fmr floatmultirange, tr textrange,
    snap pg_snapshot, snaps pg_snapshot[], acl aclitem, rc regclass, tx txid_snapshot);
"""
ROWS = r"""INSERT INTO c VALUES
 (1, 'happy', ARRAY['sad', 'a b', 'quo"te', 'NULL', NULL, 'ünï']::mood[], 5, '{1,NULL,3}', 7,
  ARRAY['x', 'y z', '', 'NULL', '\', '"'],
  ROW(1, 'a b', ROW(2, 'in"ner')::inner_t, '{1,2}', '[1,5)', 'ok', '{t1,"t 2"}',
      ARRAY[ROW(3, 'x')::inner_t, NULL, ROW(NULL, '')::inner_t, ROW(4, '(,)')::inner_t],
      '[1.5,2.5)', 9)::outer_t,
  ARRAY[ROW(2, 'b', NULL, '{}', 'empty', 'a b', '{}', '{}', '(,)', NULL)::outer_t, NULL],
  '[1.5,2.5)', ARRAY['[1,2)'::floatrange, 'empty', NULL], '{[1,2),[3,4)}',
  '["a b","c,d\\\""]', '10:20:10,14,15', ARRAY['10:20:10,14,15'::pg_snapshot, NULL],
  (acldefault('r', (SELECT oid FROM pg_roles WHERE rolname = current_user)))[1],
  'pg_class', '10:20:10,14,15'),
 (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL),
 (3, 'NULL', '{}', 1, '{}', 1, '{}', ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL)::outer_t, '{}', 'empty', '{}', '{}', 'empty', NULL, '{}', NULL, NULL, NULL),
 (4, 'a b', '{ünï}', 2147483647, '{{1,2},{3,4}}', 2, '[0:1]={a,b}',
  ROW(0, '', ROW(NULL, NULL)::inner_t, '[0:0]={0}', '(,)', 'quo"te', '{}', '{}', 'empty', 1)
  ::outer_t, ARRAY[NULL::outer_t], '(,)', '{}', '{(,)}', '("",)', NULL, NULL, NULL, NULL, NULL)
"""
COLUMNS = ["id", "m", "ms", "p", "ps", "d", "tg", "o", "os", "fr", "frs", "fmr", "tr"]
COLUMNS += ["snap", "snaps", "acl", "rc", "tx"]
#: Types nobody registered (as this was written): column -> type name. (pg_snapshot and
#: txid_snapshot, in the table too, have codecs now: they must equal the server's as well.)
UNKNOWN = {"acl": "aclitem", "rc": "regclass"}


class CountingCatalog(Catalog):
    """A Catalog that counts its queries."""

    queries = 0

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        self.queries += 1
        return super().query(sql, params)


def column_types(pg: Database, table: str) -> dict[str, int]:
    """What the Relation message would say: each column's type OID."""
    rows = pg.execute(
        "SELECT attname, atttypid::int8 FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    )
    return dict(rows)


@pytest.fixture
def resolved(pg: Database) -> tuple[Database, TypeRegistry, dict[str, int]]:
    pg.execute(SETUP)
    types = column_types(pg, "c")
    registry = DEFAULT_REGISTRY.copy()
    catalog = CountingCatalog(pg.dsn)
    try:
        resolve(registry, catalog, types.values())
        assert catalog.queries == 1
        resolve(registry, catalog, types.values())  # nothing left to look up
        assert catalog.queries == 1
    finally:
        catalog.close()
    return pg, registry, types


def server_texts(pg: Database) -> list[tuple[Any, ...]]:
    columns = ", ".join(f"{c}::text" for c in COLUMNS[1:])
    return pg.execute(f"SELECT id, {columns} FROM c ORDER BY id")


def unknown_columns(types: dict[str, int], registry: TypeRegistry) -> dict[str, int]:
    """The UNKNOWN columns whose type is unregistered in DEFAULT_REGISTRY, with their type
    OID (an array's element type) as `registry` resolved it."""
    out = {}
    for column in UNKNOWN:
        codec = registry.get(types[column])
        element = codec.element_oid if codec.element_oid is not None else types[column]
        if element not in DEFAULT_REGISTRY:
            out[column] = element
    return out


def test_resolved_types_equal_the_servers(
    resolved: tuple[Database, TypeRegistry, dict[str, int]],
) -> None:
    pg, registry, _ = resolved
    text = stream_inserts(pg, "c", binary=False, insert=ROWS, registry=registry)
    expected = server_texts(pg)
    assert len(text) == len(expected) == 4
    for got_row, want_row in zip(text, expected, strict=True):
        for column, got, want in zip(COLUMNS, got_row, want_row, strict=True):
            if column == "id":
                assert got == want
            elif want is None:
                assert got is None, column
            else:
                assert render(got) == want, (column, got)
    pg.execute("TRUNCATE c")
    binary = stream_inserts(pg, "c", binary=True, insert=ROWS, registry=registry)
    for got_row, text_row in zip(binary, text, strict=True):
        for column, got, want in zip(COLUMNS, got_row, text_row, strict=True):
            if column not in UNKNOWN:  # (regclass: a name as text, an OID in binary)
                assert got == want, column


def test_value_shapes(resolved: tuple[Database, TypeRegistry, dict[str, int]]) -> None:
    pg, registry, _ = resolved
    for binary in (False, True):
        row = stream_inserts(pg, "c", binary=binary, insert=ROWS, registry=registry)[0]
        value = dict(zip(COLUMNS, row, strict=True))
        assert value["m"] == "happy"
        assert value["ms"] == ["sad", "a b", 'quo"te', "NULL", None, "ünï"]
        assert value["p"] == 5 and value["d"] == 7 and value["ps"] == [1, None, 3]
        assert value["tg"] == ["x", "y z", "", "NULL", "\\", '"']
        outer = value["o"]
        assert list(outer) == [
            "id",
            "name",
            "nested",
            "nums",
            "r",
            "m",
            "tags",
            "inners",
            "fr",
            "p",
        ]
        assert outer["nested"] == {"x": 2, "label": 'in"ner'}
        assert outer["inners"] == [
            {"x": 3, "label": "x"},
            None,
            {"x": None, "label": ""},
            {"x": 4, "label": "(,)"},
        ]
        assert outer["r"] == Range(1, 5) and outer["fr"] == Range(1.5, 2.5)
        assert value["os"][0]["r"].empty and value["os"][1] is None
        assert value["fmr"] == Multirange((Range(1.0, 2.0), Range(3.0, 4.0)))
        assert value["tr"] == Range("a b", 'c,d\\"', "[]")
        pg.execute("TRUNCATE c")


def test_types_nobody_knows_are_text_or_unknown_binary(
    resolved: tuple[Database, TypeRegistry, dict[str, int]],
) -> None:
    pg, registry, types = resolved
    unknown = unknown_columns(types, registry)
    if not unknown:
        pytest.skip("every type in UNKNOWN has been registered")
    for column, element in unknown.items():
        assert registry.get(types[column]).name.startswith(UNKNOWN[column].split("[")[0])
        assert registry.get(element).from_binary is None
    text_row = stream_inserts(pg, "c", binary=False, insert=ROWS, registry=registry)[0]
    server = dict(zip(COLUMNS, server_texts(pg)[0], strict=True))
    pg.execute("TRUNCATE c")
    binary_row = stream_inserts(pg, "c", binary=True, insert=ROWS, registry=registry)[0]
    for column, element in unknown.items():
        index = COLUMNS.index(column)
        got_text, got_binary = text_row[index], binary_row[index]
        assert render(got_text) == server[column]
        if column == "acl":  # no send function: pgoutput sends text even in binary mode
            assert got_binary == got_text
            continue
        send = pg.execute("SELECT typsend::text FROM pg_type WHERE oid = %s", (element,))[0][0]
        sent = pg.execute(f"SELECT {send}({column}) FROM c")[0][0]
        assert got_binary == UnknownBinary(element, bytes(sent))


def test_unresolved_types_come_through_as_text(pg: Database) -> None:
    """Without `resolve` an enum, a domain, a composite or a user range is its text, or
    UnknownBinary in binary mode; nothing fails."""
    pg.execute(SETUP)
    types = column_types(pg, "c")
    text = stream_inserts(pg, "c", binary=False, insert=ROWS)
    expected = server_texts(pg)
    for got_row, want_row in zip(text, expected, strict=True):
        for column, got, want in zip(COLUMNS, got_row, want_row, strict=True):
            if column in ("m", "p", "d", "o", "fr", "tr"):
                assert got == want, column
    pg.execute("TRUNCATE c")
    row = stream_inserts(pg, "c", binary=True, insert=ROWS)[0]
    assert row[COLUMNS.index("m")] == UnknownBinary(types["m"], b"happy")
    assert isinstance(row[COLUMNS.index("fr")], UnknownBinary)
    assert row[COLUMNS.index("p")] == UnknownBinary(types["p"], b"\0\0\0\5")


def test_composite_text_and_binary_forms() -> None:
    registry = DEFAULT_REGISTRY.copy()
    codec = composite_codec(1, "pair", [("a", registry.get(23)), ("b", registry.get(25))], registry)
    assert codec.from_text(b'(1,"x ""y"" \\\\z")') == {"a": 1, "b": 'x "y" \\z'}
    assert codec.from_text(b"(,)") == {"a": None, "b": None}
    assert codec.from_text(b'(,"")') == {"a": None, "b": ""}
    binary = b"\0\0\0\2\0\0\0\x17\0\0\0\4\0\0\0\7\0\0\0\x19\xff\xff\xff\xff"
    assert codec.from_binary(binary) == {"a": 7, "b": None}
    # A field sent with another type than the catalog said: read by the OID sent.
    retyped = b"\0\0\0\2\0\0\0\x14\0\0\0\x08" + (7).to_bytes(8, "big") + b"\0\0\0\x19\0\0\0\0"
    assert codec.from_binary(retyped) == {"a": 7, "b": ""}
    for bad in (b"", b"(1,a,b)", b"(1,a", b'(1,"a)', b"1,a"):
        with pytest.raises(ValueDecodeError):
            codec.from_text(bad)
    for bad in (b"", binary[:-1], binary + b"\0"):
        with pytest.raises(ValueDecodeError):
            codec.from_binary(bad)
    # a value printed before an attribute was added has fewer fields: the rest are NULL
    assert codec.from_text(b"(1)") == {"a": 1, "b": None}
    assert codec.from_binary(b"\0\0\0\1\0\0\0\x17\0\0\0\4\0\0\0\7") == {"a": 7, "b": None}


#: Types with an array type of their own, and a value of that array (text form).
ELEMENTS = {
    "enum": ("CREATE TYPE later AS ENUM ('x', 'y z')", b'{x,"y z",NULL}', ["x", "y z", None]),
    "composite": ("CREATE TYPE later AS (l text, n int)", b'{"(a,1)"}', [{"l": "a", "n": 1}]),
    "domain": ("CREATE DOMAIN later AS int CHECK (VALUE > 0)", b"{1,2}", [1, 2]),
    "range": (
        "CREATE TYPE later AS RANGE (subtype = float8)",
        b'{"[1.5,2)",empty}',
        [Range(1.5, 2.0, "[)"), Range(empty=True)],
    ),
    "domain over an array": ("CREATE DOMAIN later AS text[]", b'{"{a,b}"}', [["a", "b"]]),
}


@pytest.mark.parametrize("kind", ELEMENTS)
def test_an_array_met_after_its_element_is_described(pg: Database, kind: str) -> None:
    """A `TypeCatalog` that has described a type (one table's column) and is then asked for
    the type's array (another table's, typed apart): the descriptions it gives hold the array,
    so a registry built from them alone types its values as an array, not as text."""
    setup, text, value = ELEMENTS[kind]
    pg.execute(setup)
    ((element, array),) = pg.execute(
        "SELECT oid::int8, typarray::int8 FROM pg_type WHERE typname = 'later'"
    )
    catalog = Catalog(pg.dsn)
    try:
        types = TypeCatalog(catalog)
        assert element in types.describe([element])
        described = types.describe([array])
    finally:
        catalog.close()
    assert array in described and element in described
    codec = described.registry().get(array)
    assert (codec.structure, codec.element_oid) == ("array", element)
    assert codec.from_text(text) == value
