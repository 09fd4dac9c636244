"""`pgcdc.snapshot.copy`: a table chunk read with COPY into typed Arrow batches that equal what
the stream path builds from the same rows.

* equivalence: for a table with a column of nearly every type filled with random values and
  edge cases, the batches of `read_copy` equal `ArrowBatchBuilder`'s built from the same rows
  streamed through pgoutput (text mode), in schema and value by value (floats bit for bit),
  under each mapping option set and for small and large batches; the fast paths are the ones
  claimed, and a registry's own text parser turns its column's fast path off;
* block (ctid) ranges: chunks cover a table exactly once;
* the out-of-range policy: "error" raises naming table, column and value; "null" nulls and
  marks; the connection stays usable;
* a TOASTed 1 MB value round-trips; edge shapes: one column of NULLs and empty strings, no
  columns, no rows, early close, session settings.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pgcdc.decoding.catalog import Catalog  # noqa: E402
from pgcdc.embedded import Database  # noqa: E402
from pgcdc.errors import ValueOutOfRange  # noqa: E402
from pgcdc.protocol import Column, Insert, Relation, TupleData  # noqa: E402
from pgcdc.replication import ReplicationClient, StreamOptions  # noqa: E402
from pgcdc.replication.connection import DEFAULT_SESSION_SETTINGS  # noqa: E402
from pgcdc.snapshot import copy as copy_module  # noqa: E402
from pgcdc.snapshot.copy import copy_query, copy_schema, read_copy  # noqa: E402
from pgcdc.types import DEFAULT_REGISTRY, TypeRegistry, resolve  # noqa: E402
from pgcdc.types import columns as columns_module  # noqa: E402
from pgcdc.types.arrow import (  # noqa: E402
    OUT_OF_RANGE_COLUMN,
    UNCHANGED_TOAST_COLUMN,
    ArrowBatchBuilder,
)
from pgcdc.types.mapping import MappingOptions, type_mapping  # noqa: E402
from replication.helpers import unique  # noqa: E402

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True, params=["C text", "CSV"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with both ways of reading the COPY: the C extension's text format and
    pyarrow's CSV (the fallback)."""
    if request.param == "CSV":
        monkeypatch.setattr(copy_module, "_copytext", lambda: None)
    elif copy_module._copytext() is None:
        pytest.skip("the C extension _copytext is not built or not bound to libpq")
    return str(request.param)


OPTION_SETS = {
    "default": MappingOptions(),
    "null": MappingOptions(on_out_of_range="null"),
    "alternatives": MappingOptions(
        arrays="string",
        unbounded_numeric_scale=4,
        interval="day_time",
        json="variant",
        time="time",
        on_out_of_range="null",
    ),
}

# --- servers, relations, comparison -----------------------------------------------------


def session(pg: Database) -> psycopg.Connection[Any]:
    """An autocommit connection with pgcdc's session settings, as the snapshot's are."""
    conn = pg.connect()
    for name, value in DEFAULT_SESSION_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    return conn


def registry_for(pg: Database, relation: Relation) -> TypeRegistry:
    """The built-in types plus the relation's enums, composites and domains (`resolve`)."""
    registry = DEFAULT_REGISTRY.copy()
    catalog = Catalog(pg.dsn)
    try:
        resolve(registry, catalog, [c.type_oid for c in relation.columns])
    finally:
        catalog.close()
    return registry


def catalog_relation(conn: psycopg.Connection[Any], table: str) -> Relation:
    """`table` as a Relation message describes it (column types and typmods)."""
    rows = conn.execute(
        "SELECT attname, atttypid::int8, atttypmod FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    schema, _, name = table.rpartition(".")
    columns = tuple(Column(0, n, int(oid), int(mod)) for n, oid, mod in rows)
    return Relation(1, schema or "public", name, "d", columns)


def streamed_rows(pg: Database, table: str, fill: str) -> tuple[Relation, list[TupleData]]:
    """Run `fill` (SQL inserting into `table`) with a slot and publication in place and
    return the Relation and the rows pgoutput sends for it, in text mode."""
    pub, slot = unique("pub"), unique("slot")
    pg.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(fill)
    relation: Relation | None = None
    rows: list[TupleData] = []
    options = StreamOptions((pub,), binary=False)
    with ReplicationClient(pg.dsn, slot, options, until_idle=True, reconnect=False) as client:
        for _, message in client:
            if isinstance(message, Relation):
                relation = message
            elif isinstance(message, Insert):
                rows.append(message.new)
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    pg.execute(f"DROP PUBLICATION {pub}")
    assert relation is not None
    return relation, rows


def selected_rows(conn: psycopg.Connection[Any], table: str) -> list[TupleData]:
    """The rows of `table` as their output functions print them (what pgoutput's text mode
    sends; ``::text`` casts would differ for bpchar and inet)."""
    cursor = conn.execute(f"SELECT * FROM {table}")
    result = cursor.pgresult
    assert result is not None
    rows = []
    for r in range(result.ntuples):
        values = tuple(result.get_value(r, c) for c in range(result.nfields))
        kinds = bytes(0x6E if v is None else 0x74 for v in values)
        rows.append(TupleData(kinds, values))
    return rows


def expected_table(
    relation: Relation, rows: list[TupleData], registry: TypeRegistry, options: MappingOptions
) -> pa.Table:
    """What the stream path builds from `rows`, without the unchanged TOAST marker."""
    builder = ArrowBatchBuilder(relation, registry, options)
    for row in rows:
        builder.append(row)
    batch = builder.flush()
    return pa.Table.from_batches([batch]).drop_columns([UNCHANGED_TOAST_COLUMN])


def copied_table(
    conn: psycopg.Connection[Any],
    relation: Relation,
    registry: TypeRegistry,
    options: MappingOptions,
    *,
    source: str | None = None,
    batch_rows: int = 200_000,
    first_block: int | None = None,
    end_block: int | None = None,
) -> pa.Table:
    query = copy_query(
        relation,
        source or f"{relation.schema}.{relation.relname}",
        first_block=first_block,
        end_block=end_block,
    )
    batches = list(read_copy(conn, query, relation, registry, options, batch_rows=batch_rows))
    schema = copy_schema(relation, registry, options)
    for batch in batches:
        assert batch.schema.equals(schema, check_metadata=True)
        assert 0 < batch.num_rows <= batch_rows
    return pa.Table.from_batches(batches, schema=schema)


def exact(value: Any) -> Any:
    """A value with floats as their bits and decimals as their text, so that == is exact."""
    if isinstance(value, float):
        return ("float", struct.pack(">d", value).hex())
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, list):
        return [exact(v) for v in value]
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    return value


def assert_same(got: pa.Table, expected: pa.Table, key: str = "id") -> None:
    assert got.schema.equals(expected.schema, check_metadata=True), (got.schema, expected.schema)
    assert got.num_rows == expected.num_rows
    got = got.sort_by(key).combine_chunks()
    expected = expected.sort_by(key).combine_chunks()
    for name in expected.column_names:
        a = got.column(name).combine_chunks()
        b = expected.column(name).combine_chunks()
        if pa.types.is_floating(b.type):  # bit for bit: NaN, -0, the last digit
            bits = pa.uint32() if b.type == pa.float32() else pa.uint64()
            a, b = a.view(bits), b.view(bits)
        left, right = a.to_pylist(), b.to_pylist()
        if left != right or exact(left) != exact(right):
            diffs = [(i, x, y) for i, (x, y) in enumerate(zip(left, right, strict=True)) if x != y]
            raise AssertionError(f"column {name}: (row, copied, streamed) {diffs[:5]}")


# --- random rows of nearly every type ------------------------------------------------------

WIDE_TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy, "very"', 'NULL');
CREATE TYPE pair AS (a int, b text, c numeric(6,2), d timestamptz);
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN money2 AS numeric(10,2);
"""
#: Column name -> SQL type; the row generator below has a value maker for each.
WIDE_COLUMNS = {
    "id": "int8",
    "i2": "int2",
    "i4": "int4",
    "i8": "int8",
    "n_typ": "numeric(12,3)",
    "n_int": "numeric(38,0)",
    "n_free": "numeric",
    "f4": "float4",
    "f8": "float8",
    "b": "bool",
    "t": "text",
    "vc": "varchar(10)",
    "ch": "char(5)",
    "nm": "name",
    "by": "bytea",
    "d": "date",
    "ts": "timestamp",
    "tstz": "timestamptz",
    "tm": "time",
    "iv": "interval",
    "u": "uuid",
    "j": "json",
    "jb": "jsonb",
    "ip": "inet",
    "ai": "int4[]",
    "at": "text[]",
    "e": "mood",
    "c": "pair",
    "dom": "posint",
    "dn": "money2",
    "o": "oid",
    "mn": "money",
    "xi": "xid",
    "x8": "xid8",
    "sn": "pg_snapshot",
}
TEXT_CHARS = [*"aZ09 ,\"'\\\n\r\t.;{}()[]é€😀中\u2028", "\\.", "NULL", "null"]


def rand_text(rng: random.Random, most: int = 30) -> str:
    return "".join(rng.choice(TEXT_CHARS) for _ in range(rng.randint(0, most)))


def rand_float8(rng: random.Random) -> str:
    special = ["NaN", "Infinity", "-Infinity", "-0", "0", "5e-324", "2.2250738585072014e-308"]
    special += ["1.7976931348623157e+308", "0.1", "1e22", "123456789012345678", "-1.5e-10"]
    if rng.random() < 0.25:
        return rng.choice(special)
    value = struct.unpack("<d", rng.randbytes(8))[0]
    if math.isnan(value) or math.isinf(value):
        return "NaN"
    return repr(value)


def rand_float4(rng: random.Random) -> str:
    special = ["NaN", "Infinity", "-Infinity", "-0", "1e-45", "3.4028235e+38", "1.17549435e-38"]
    special += ["0.1", "16777217", "3.1415927"]
    if rng.random() < 0.25:
        return rng.choice(special)
    value = struct.unpack("<f", rng.randbytes(4))[0]
    if math.isnan(value) or math.isinf(value):
        return "-Infinity"
    return repr(value)  # the float32's exact value as a double: float4in reads it back


def rand_digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def rand_numeric(rng: random.Random, whole: int, scale: int) -> str:
    sign = rng.choice(["", "-"])
    text = rand_digits(rng, rng.randint(0, whole)).lstrip("0") or "0"
    if scale:
        text += "." + rand_digits(rng, rng.randint(0, scale))
    return sign + text.rstrip(".")


def rand_date(rng: random.Random, wild: bool) -> str:
    if wild and rng.random() < 0.5:
        return rng.choice(
            ["infinity", "-infinity", "0044-03-15 BC", "10000-01-01", "4713-11-24 BC"]
        )
    if rng.random() < 0.1:
        return rng.choice(["0001-01-01", "9999-12-31", "2000-02-29", "1970-01-01"])
    return (date(1, 1, 1) + timedelta(days=rng.randrange(3652059))).isoformat()


def rand_clock(rng: random.Random) -> str:
    text = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
    if rng.random() < 0.7:
        text += "." + rand_digits(rng, rng.randint(1, 6))
    return text


def rand_timestamp(rng: random.Random, wild: bool, tz: bool) -> str:
    if wild and rng.random() < 0.5:
        if rng.random() < 0.5:
            return rng.choice(["infinity", "-infinity"])
        special = rng.choice(["0001-12-31 23:59:59.999999", "20000-01-01 00:00"])
        return (
            special
            + rng.choice(["", " +03"] if tz else [""])
            + (" BC" if "0001" in special else "")
        )
    if rng.random() < 0.1:
        edge = rng.choice(["0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"])
        return edge + (" +00" if tz else "")
    text = f"{(date(1, 1, 2) + timedelta(days=rng.randrange(3652057))).isoformat()} "
    text += rand_clock(rng)
    if tz:
        text += rng.choice(["+00", "+05:30", "-08", "+14", "-03:45"])
    return text


def rand_interval(rng: random.Random) -> str:
    parts = []
    if rng.random() < 0.4:
        parts.append(f"{rng.randint(-30, 30)} years {rng.randint(-11, 11)} mons")
    if rng.random() < 0.7:
        parts.append(f"{rng.randint(-1000, 1000)} days")
    if rng.random() < 0.8:
        parts.append(rng.choice(["", "-"]) + rand_clock(rng))
    return " ".join(parts) or "0"


def rand_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rand_text(rng, 8)
    if kind == 1:
        return rng.choice([0, -1, 12345678901234567890123, 1.5, -0.0, 1e300, True, False, None])
    if kind == 2:
        return rng.randint(-(2**40), 2**40)
    if kind == 3:
        return None
    if kind == 4:
        return [rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rand_text(rng, 5): rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def rand_json_text(rng: random.Random) -> str:
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,", " :  ")])
    text = json.dumps(rand_json(rng), separators=separators, ensure_ascii=rng.random() < 0.5)
    return rng.choice(["", " ", "\n"]) + text if rng.random() < 0.2 else text


def rand_inet(rng: random.Random) -> str:
    if rng.random() < 0.5:
        address = ".".join(str(rng.randrange(256)) for _ in range(4))
        return address + rng.choice(["", "/32", "/24", "/0"])
    words = [f"{rng.choice([0, 0, 1, rng.randrange(65536)]):x}" for _ in range(8)]
    return ":".join(words) + rng.choice(["", "/128", "/64"])


def array_element(text: str | None) -> str:
    if text is None:
        return "NULL"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rand_int_array(rng: random.Random, wild: bool) -> str:
    if wild and rng.random() < 0.4:
        return rng.choice(["{{1,2},{3,NULL}}", "[0:1]={7,8}", "[2:2]={5}"])
    values = [None if rng.random() < 0.2 else str(rng.randint(-(2**31), 2**31 - 1))]
    values += [str(rng.randint(-99, 99)) for _ in range(rng.randint(0, 5))]
    return "{" + ",".join("NULL" if v is None else v for v in values) + "}"


def rand_text_array(rng: random.Random) -> str:
    elements = [
        None if rng.random() < 0.25 else rand_text(rng, 8) for _ in range(rng.randint(0, 5))
    ]
    return "{" + ",".join(array_element(e) for e in elements) + "}"


def record_field(text: str | None) -> str:
    if text is None:
        return ""
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def rand_pair(rng: random.Random, wild: bool) -> str:
    fields = [
        None if rng.random() < 0.2 else str(rng.randint(-(2**31), 2**31 - 1)),
        None if rng.random() < 0.2 else rand_text(rng, 10),
        None if rng.random() < 0.2 else rand_numeric(rng, 4, 2),
        None if rng.random() < 0.2 else rand_timestamp(rng, wild, True),
    ]
    return "(" + ",".join(record_field(f) for f in fields) + ")"


def rand_value(rng: random.Random, column: str, wild: bool) -> str | None:
    """One value of `column` as SQL input text; `wild` allows values some Spark type cannot
    hold (NaN numerics, infinite and BC dates, multi-dimensional arrays)."""
    if column == "i2":
        return str(rng.choice([-(2**15), 2**15 - 1, 0, rng.randint(-(2**15), 2**15 - 1)]))
    if column == "i4":
        return str(rng.choice([-(2**31), 2**31 - 1, rng.randint(-(2**31), 2**31 - 1)]))
    if column == "i8":
        return str(rng.choice([-(2**63), 2**63 - 1, rng.randint(-(2**63), 2**63 - 1)]))
    if column == "n_typ":
        return "NaN" if wild and rng.random() < 0.3 else rand_numeric(rng, 9, 3)
    if column == "n_int":
        return "NaN" if wild and rng.random() < 0.3 else rand_numeric(rng, 38, 0)
    if column == "n_free":
        if wild and rng.random() < 0.4:
            return rng.choice(["NaN", "Infinity", "-Infinity", "1" * 40, "0.00001"])
        return rand_numeric(rng, 30, 4) if rng.random() < 0.7 else rand_numeric(rng, 3, 0)
    if column == "f4":
        return rand_float4(rng)
    if column == "f8":
        return rand_float8(rng)
    if column == "b":
        return rng.choice(["t", "f"])
    if column == "t":
        return rand_text(rng)
    if column == "vc":
        return rand_text(rng, 10)
    if column == "ch":
        return rand_text(rng, 5)
    if column == "nm":
        return rand_text(rng, 12)
    if column == "by":
        return "\\x" + rng.randbytes(rng.randint(0, 20)).hex()
    if column == "d":
        return rand_date(rng, wild)
    if column == "ts":
        return rand_timestamp(rng, wild, False)
    if column == "tstz":
        return rand_timestamp(rng, wild, True)
    if column == "tm":
        return "24:00:00" if wild and rng.random() < 0.3 else rand_clock(rng)
    if column == "iv":
        return rand_interval(rng)
    if column == "u":
        return str(uuid.UUID(bytes=rng.randbytes(16)))
    if column in ("j", "jb"):
        return rand_json_text(rng)
    if column == "ip":
        return rand_inet(rng)
    if column == "ai":
        return rand_int_array(rng, wild)
    if column == "at":
        return rand_text_array(rng)
    if column == "e":
        return rng.choice(["sad", "ok", 'happy, "very"', "NULL"])
    if column == "c":
        return rand_pair(rng, wild)
    if column == "dom":
        return str(rng.randint(1, 2**31 - 1))
    if column == "dn":
        return rand_numeric(rng, 8, 2)
    if column == "o":
        return str(rng.choice([0, 2**32 - 1, rng.randrange(2**32)]))
    if column == "mn":
        return f"{rng.randint(-(10**12), 10**12) / 100:.2f}"
    if column == "xi":
        return str(rng.choice([0, 2**32 - 1, rng.randrange(2**32)]))
    if column == "x8":
        return str(rng.choice([0, 2**64 - 1, rng.randrange(2**64)]))
    if column == "sn":
        return rand_snapshot(rng)
    raise AssertionError(column)


def rand_snapshot(rng: random.Random) -> str:
    """xmin <= xmax, in-progress ids from xmin up to (not including) xmax, ascending."""
    xmin = rng.choice([1, rng.randrange(1, 2**64)])
    xmax = rng.choice([xmin, min(2**64 - 1, xmin + rng.randrange(100)), rng.randrange(xmin, 2**64)])
    xip = (
        sorted({rng.randrange(xmin, xmax) for _ in range(rng.randint(0, 4))}) if xmax > xmin else []
    )
    return f"{xmin}:{xmax}:" + ",".join(map(str, xip))


def fill_wide(pg: Database, table: str, rows: int, *, wild: float, seed: int) -> str:
    """Create `table` with WIDE_COLUMNS; the SQL inserting `rows` random rows (a share `wild`
    of them with out-of-range values, every column NULL now and then)."""
    pg.execute(
        f"CREATE TABLE {table} ("
        + ", ".join(f"{name} {kind}" for name, kind in WIDE_COLUMNS.items())
        + ", PRIMARY KEY (id))"
    )
    rng = random.Random(seed)
    literals = []
    for i in range(rows):
        is_wild = rng.random() < wild
        values = [str(i)]
        for column in list(WIDE_COLUMNS)[1:]:
            values.append(None if rng.random() < 0.1 else rand_value(rng, column, is_wild))
        casts = ", ".join(
            "NULL" if v is None else f"{quote_literal(v)}::{kind}"
            for v, kind in zip(values, WIDE_COLUMNS.values(), strict=True)
        )
        literals.append(f"({casts})")
    return f"INSERT INTO {table} VALUES " + ",\n".join(literals)


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"  # standard_conforming_strings is on


@pytest.fixture
def wide_types(pg: Database) -> Database:
    pg.execute(WIDE_TYPES)
    return pg


#: Columns with a vectorized fast path ("text": kept as is), under OPTION_SETS["default"].
FAST_COLUMNS = {
    "id": "cast",
    "i2": "cast",
    "i4": "cast",
    "i8": "cast",
    "n_typ": "cast",
    "n_int": "cast",
    "f4": "_float4",
    "f8": "cast",
    "b": "_bool",
    "by": "_bytea",
    "d": "cast",
    "ts": "cast",
    "tstz": "cast",
    "dom": "cast",
    "o": "cast",
    "xi": "cast",
    "x8": "cast",
    "n_free": "text",
    "t": "text",
    "vc": "text",
    "ch": "text",
    "nm": "text",
    "tm": "text",
    "iv": "text",
    "u": "text",
    "j": "text",
    "jb": "text",
    "ip": "text",
    "e": "text",
    "dn": "text",  # a domain's typmod is not the column's: unconstrained numeric, its text
}


# --- (1) equivalence with the stream path -------------------------------------------------


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_copy_equals_stream(wide_types: Database, option_set: str) -> None:
    """Random rows of ~30 types: read_copy's batches equal the stream path's, schema and
    values (floats bit for bit), in one batch and in batches of 37 rows (so that fast paths
    and per-value fallbacks meet in the same batch)."""
    pg = wide_types
    options = OPTION_SETS[option_set]
    wild = 0.0 if options.on_out_of_range == "error" else 0.3
    seed = 20260101 + list(OPTION_SETS).index(option_set)
    fill = fill_wide(pg, "wide", 400, wild=wild, seed=seed)
    relation, rows = streamed_rows(pg, "wide", fill)
    assert len(rows) == 400
    registry = registry_for(pg, relation)
    expected = expected_table(relation, rows, registry, options)
    if wild:
        marked = expected.column(OUT_OF_RANGE_COLUMN).drop_null()
        assert len(marked) > 50  # the policy really was exercised
    with session(pg) as conn:
        for batch_rows in (200_000, 37):
            got = copied_table(conn, relation, registry, options, batch_rows=batch_rows)
            assert_same(got, expected)
        # The same rows as a plain SELECT prints them: the reference of the other tests.
        assert_same(
            expected_table(relation, selected_rows(conn, "wide"), registry, options), expected
        )


def test_fast_paths_are_used(wide_types: Database) -> None:
    """The columns claimed to have a vectorized path have it (so the equivalence test above
    proves those paths exact), the others go value by value."""
    pg = wide_types
    fill_wide(pg, "wide", 0, wild=0, seed=1)  # the table only
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.wide")
    registry = registry_for(pg, relation)
    options = OPTION_SETS["default"]
    found = {}
    for column in relation.columns:
        mapping = type_mapping(column.type_oid, column.type_modifier, registry, options)
        fast = columns_module._fast_path(column.type_oid, mapping, registry)
        if fast == "text" or fast is None:
            found[column.name] = fast
        else:
            found[column.name] = fast.convert.__name__.replace("convert", "cast")
    assert {k: v for k, v in found.items() if v is not None} == FAST_COLUMNS
    assert {k for k, v in found.items() if v is None} == {"ai", "at", "c", "mn", "sn"}


def test_a_registry_parser_replaces_the_fast_path(pg: Database) -> None:
    """A codec whose text parser is not the built-in one is parsed with it, value by value."""
    pg.execute("CREATE TABLE r (id int8, v int4)")
    pg.execute("INSERT INTO r VALUES (1, 10), (2, NULL), (3, -7)")
    registry = DEFAULT_REGISTRY.copy()
    registry.add(replace(registry.get(23), from_text=lambda data: int(data) * 2))
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.r")
        got = copied_table(conn, relation, registry, MappingOptions())
    assert got.sort_by("id").column("v").to_pylist() == [20, None, -14]


# --- (2) block ranges ----------------------------------------------------------------------


def test_ctid_ranges_cover_the_table_once(pg: Database) -> None:
    pg.execute("CREATE TABLE blocks (id int8 PRIMARY KEY, pad text) WITH (fillfactor = 50)")
    pg.execute("INSERT INTO blocks SELECT i, repeat('x', 150) FROM generate_series(1, 4000) i")
    pg.execute("UPDATE blocks SET pad = 'moved' WHERE id % 7 = 0")  # new versions, later blocks
    pg.execute("DELETE FROM blocks WHERE id % 11 = 0")
    ids = sorted(r[0] for r in pg.execute("SELECT id FROM blocks"))
    pages = pg.execute("SELECT pg_relation_size('blocks') / current_setting('block_size')::int")
    end = pages[0][0]
    assert end > 40
    registry = DEFAULT_REGISTRY
    options = MappingOptions()
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.blocks")

        def chunk(first: int | None, last: int | None) -> list[int]:
            table = copied_table(
                conn, relation, registry, options, first_block=first, end_block=last, batch_rows=500
            )
            return table.column("id").to_pylist()

        for cuts in ([0, 13, 30], [None, 1, end - 1], [5, end, end + 10], [0, end // 2]):
            first, *inner = cuts
            bounds = [first, *inner, None]
            got = [i for a, b in itertools.pairwise(bounds) for i in chunk(a, b)]
            if first not in (None, 0):
                got += chunk(None, first)
            assert sorted(got) == ids
            assert len(got) == len(set(got))
        assert chunk(20, 20) == []
        assert chunk(end + 5, None) == []
        assert sorted(chunk(None, None)) == ids


def test_copy_query_text(pg: Database) -> None:
    relation = Relation(
        1, "odd schema", 'We"ird', "d", (Column(1, "id", 20, -1), Column(0, 'a "b", c', 25, -1))
    )
    with pg.connect() as conn:
        assert copy_query(relation, 'odd schema.We"ird', first_block=3, end_block=9).as_string(
            conn
        ) == (
            'COPY (SELECT "id", "a ""b"", c" FROM ONLY "odd schema"."We""ird" '
            "WHERE ctid >= '(3,0)'::tid AND ctid < '(9,0)'::tid) TO STDOUT"
        )
        assert copy_query(relation, "p.leaf_1", first_block=None, end_block=None).as_string(
            conn
        ) == ('COPY (SELECT "id", "a ""b"", c" FROM ONLY "p"."leaf_1") TO STDOUT')
        assert copy_query(relation, "leaf", first_block=7, end_block=None).as_string(conn) == (
            'COPY (SELECT "id", "a ""b"", c" FROM ONLY "odd schema"."leaf" '
            "WHERE ctid >= '(7,0)'::tid) TO STDOUT"
        )
    for bad in (-1, 2**32, 1.5, "3"):
        with pytest.raises(ValueError, match="block"):
            copy_query(relation, "s.t", first_block=bad, end_block=None)  # type: ignore[arg-type]
    # The query runs: a table of that shape, read through a partition leaf's name.
    pg.execute('CREATE SCHEMA "odd schema"')
    pg.execute(
        'CREATE TABLE "odd schema"."We""ird" (id int8, "a ""b"", c" text) PARTITION BY RANGE (id)'
    )
    pg.execute(
        'CREATE TABLE "odd schema".leaf PARTITION OF "odd schema"."We""ird" '
        "FOR VALUES FROM (0) TO (100)"
    )
    pg.execute('INSERT INTO "odd schema"."We""ird" VALUES (1, \'x,"y"\'), (2, NULL)')
    with session(pg) as conn:
        got = copied_table(
            conn, relation, DEFAULT_REGISTRY, MappingOptions(), source="odd schema.leaf"
        )
        assert got.sort_by("id").to_pylist() == [
            {"id": 1, 'a "b", c': 'x,"y"'},
            {"id": 2, 'a "b", c': None},
        ]
        # FROM ONLY: the partitioned parent itself holds no rows.
        assert copied_table(conn, relation, DEFAULT_REGISTRY, MappingOptions()).num_rows == 0


# --- (3) the out-of-range policy -----------------------------------------------------------

OOR_FILL = """
CREATE TABLE oor (id int8, d date, n numeric(5,2), ts timestamptz, ok text);
INSERT INTO oor VALUES
    (1, 'infinity', 1.5, '2020-01-01 00:00:00+00', 'a'),
    (2, '2020-01-01', 'NaN', '-infinity', 'b'),
    (3, '2021-02-03', 123.45, '0044-03-15 12:00:00+00 BC', 'c'),
    (4, '2022-03-04', -0.5, '2022-03-04 05:06:07.000008+00', 'd');
"""


def test_out_of_range_error_names_table_column_value(pg: Database) -> None:
    pg.execute(OOR_FILL)
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.oor")
        query = copy_query(relation, "public.oor", first_block=None, end_block=None)
        with pytest.raises(ValueOutOfRange) as info:
            list(read_copy(conn, query, relation, DEFAULT_REGISTRY, table_name="app.orders"))
        error = info.value
        assert error.table == "app.orders"
        assert (error.column, error.value) in {
            ("d", "'infinity'"),
            ("n", "'NaN'"),
            ("ts", "'-infinity'"),
            ("ts", "'0044-03-15 12:00:00+00 BC'"),
        }
        assert "app.orders." + error.column in str(error)
        # Without table_name, the relation's name; the connection is still usable.
        with pytest.raises(ValueOutOfRange, match=r"public\.oor\.(d|n|ts)"):
            list(read_copy(conn, query, relation, DEFAULT_REGISTRY, batch_rows=1))
        assert conn.execute("SELECT 1").fetchone() == (1,)
        # One column at a time: each names its own column.
        for column, value in (("d", "'infinity'"), ("n", "'NaN'")):
            rel = replace(
                relation, columns=tuple(c for c in relation.columns if c.name in ("id", column))
            )
            q = copy_query(rel, "public.oor", first_block=None, end_block=None)
            with pytest.raises(ValueOutOfRange) as info:
                list(read_copy(conn, q, rel, DEFAULT_REGISTRY))
            assert (info.value.column, info.value.value) == (column, value)


def test_out_of_range_null_nulls_and_marks(pg: Database) -> None:
    pg.execute(OOR_FILL)
    options = MappingOptions(on_out_of_range="null")
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.oor")
        for batch_rows in (1, 3, 100):
            got = copied_table(conn, relation, DEFAULT_REGISTRY, options, batch_rows=batch_rows)
            rows = got.sort_by("id").to_pylist()
            assert [r[OUT_OF_RANGE_COLUMN] for r in rows] == [["d"], ["n", "ts"], ["ts"], None]
            assert [(r["d"], r["n"], r["ts"] is None) for r in rows] == [
                (None, Decimal("1.50"), False),
                (date(2020, 1, 1), None, True),
                (date(2021, 2, 3), Decimal("123.45"), True),
                (date(2022, 3, 4), Decimal("-0.50"), False),
            ]
            assert_same(
                got, expected_table(relation, selected_rows(conn, "oor"), DEFAULT_REGISTRY, options)
            )


# --- (4) big values and edge shapes --------------------------------------------------------


def test_toasted_megabyte_round_trips(pg: Database) -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(TEXT_CHARS[:-3]) for _ in range(1 << 20))  # incompressible
    blob = rng.randbytes(1 << 20)
    pg.execute("CREATE TABLE big (id int8, t text, b bytea)")
    with pg.connect() as conn:
        conn.execute("INSERT INTO big VALUES (1, %s, %s), (2, 'small', '\\x00')", (text, blob))
        conn.execute("INSERT INTO big VALUES (3, %s, NULL)", (text[::-1],))
    stored = pg.execute("SELECT pg_column_size(t) FROM big WHERE id = 1")[0][0]
    toasted = pg.execute(
        "SELECT c.reltoastrelid <> 0 AND pg_relation_size(c.reltoastrelid) > 1000000 "
        "FROM pg_class c WHERE relname = 'big'"
    )[0][0]
    assert stored > 1_000_000 and toasted
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.big")
        for batch_rows in (1, 10):
            got = copied_table(
                conn, relation, DEFAULT_REGISTRY, MappingOptions(), batch_rows=batch_rows
            )
            assert got.sort_by("id").to_pylist() == [
                {"id": 1, "t": text, "b": blob},
                {"id": 2, "t": "small", "b": b"\x00"},
                {"id": 3, "t": text[::-1], "b": None},
            ]


#: Texts COPY must escape in one format or the other: every control character, the
#: delimiters, backslash sequences, the NULL markers' spellings as data.
ESCAPED = [
    "",
    '""',
    ",",
    "\n",
    "\\.",
    "\\N",
    "\\",
    "\t",
    "a\tb\\tc",
    "\\x41\\101",
    *(chr(c) for c in range(1, 32)),
    "".join(chr(c) for c in range(1, 128)),
    "é€😀\u2028",
    "NULL",
]


def test_one_column_of_nulls_and_empty_strings(pg: Database) -> None:
    """A row of one NULL column is an empty CSV line and \\N in text; the empty string is
    ``""`` in CSV and nothing in text; every escaped character comes back as it was."""
    pg.execute("CREATE TABLE one (i int, v text)")
    with pg.connect() as conn:
        conn.execute("INSERT INTO one VALUES (0, NULL)")
        for i, text in enumerate(ESCAPED, 1):
            conn.execute("INSERT INTO one VALUES (%s, %s), (%s, NULL)", (2 * i, text, 2 * i + 1))
        conn.commit()
    want = [None] + [v for text in ESCAPED for v in (text, None)]
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.one")
        for batch_rows in (1, 2, 100):
            got = copied_table(
                conn, relation, DEFAULT_REGISTRY, MappingOptions(), batch_rows=batch_rows
            )
            assert got.sort_by("i").column("v").to_pylist() == want


def test_no_columns_and_no_rows(pg: Database) -> None:
    pg.execute("CREATE TABLE nothing ()")
    pg.execute("INSERT INTO nothing SELECT FROM generate_series(1, 5)")
    pg.execute("CREATE TABLE empty (id int8, t text)")
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.nothing")
        for options in (MappingOptions(), MappingOptions(on_out_of_range="null")):
            got = copied_table(conn, relation, DEFAULT_REGISTRY, options, batch_rows=2)
            assert got.num_rows == 5
            assert got.column_names == (
                [OUT_OF_RANGE_COLUMN] if options.on_out_of_range == "null" else []
            )
        empty = catalog_relation(conn, "public.empty")
        query = copy_query(empty, "public.empty", first_block=None, end_block=None)
        assert list(read_copy(conn, query, empty, DEFAULT_REGISTRY)) == []


def test_early_close_cancels_the_copy(pg: Database) -> None:
    pg.execute("CREATE TABLE many (id int8, t text)")
    pg.execute("INSERT INTO many SELECT i, md5(i::text) FROM generate_series(1, 200000) i")
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.many")
        query = copy_query(relation, "public.many", first_block=None, end_block=None)
        batches: Iterator[pa.RecordBatch] = read_copy(
            conn, query, relation, DEFAULT_REGISTRY, batch_rows=1000
        )
        assert next(batches).num_rows == 1000
        batches.close()  # type: ignore[attr-defined]
        assert conn.execute("SELECT count(*) FROM many").fetchone() == (200000,)
        # In a transaction (the snapshot's), too.
        with conn.transaction():
            total = sum(b.num_rows for b in read_copy(conn, query, relation, DEFAULT_REGISTRY))
            assert total == 200000


def test_session_settings_are_checked(pg: Database) -> None:
    pg.execute("CREATE TABLE s (id int8)")
    with session(pg) as conn:
        relation = catalog_relation(conn, "public.s")
        query = copy_query(relation, "public.s", first_block=None, end_block=None)
        conn.execute("SET DateStyle = 'SQL, DMY'")
        with pytest.raises(ValueError, match="DateStyle"):
            list(read_copy(conn, query, relation, DEFAULT_REGISTRY))
        conn.execute("SET DateStyle = 'ISO, DMY'")
        assert list(read_copy(conn, query, relation, DEFAULT_REGISTRY)) == []
        with pytest.raises(ValueError, match="batch_rows"):
            list(read_copy(conn, query, relation, DEFAULT_REGISTRY, batch_rows=0))


def test_a_server_error_mid_copy_is_raised(pg: Database) -> None:
    relation = Relation(1, "public", "q", "d", (Column(0, "v", 23, -1),))
    query = "COPY (SELECT 100000 / (i - 150000) FROM generate_series(1, 200000) i) TO STDOUT"
    with session(pg) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            for _ in read_copy(conn, query, relation, DEFAULT_REGISTRY, batch_rows=1000):
                pass
        assert conn.execute("SELECT 1").fetchone() == (1,)
