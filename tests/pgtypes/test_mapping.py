"""The mapping to Arrow and Spark (`pgcdc.types.mapping`) and the batch builder
(`pgcdc.types.arrow`).

* Spark's Arrow type of every mapped type is exactly the Arrow type pgcdc builds;
* a table with a column of every type, streamed in text and in binary mode, gives the same
  batches, whose values are the server's: its own text for string columns, and for the others
  the values psycopg reads from a plain SELECT (an independent decoder);
* the out-of-range policy: "error" names table, column, value and LSN; "null" nulls and marks;
* a real Spark session builds a DataFrame from a batch and collects the expected values.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from ipaddress import ip_interface, ip_network
from typing import Any

import psycopg
import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from psycopg.types.composite import CompositeInfo, register_composite  # noqa: E402
from psycopg.types.range import Range as PsycopgRange  # noqa: E402
from pyspark.sql import types as st  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type  # noqa: E402
from pyspark.sql.variant_utils import VariantUtils  # noqa: E402

from pgcdc.decoding.catalog import Catalog  # noqa: E402
from pgcdc.embedded import Database  # noqa: E402
from pgcdc.errors import ValueOutOfRange  # noqa: E402
from pgcdc.protocol import Column, Insert, Lsn, Relation, TupleData, Update  # noqa: E402
from pgcdc.replication import ReplicationClient, StreamOptions  # noqa: E402
from pgcdc.types import DEFAULT_REGISTRY, PgArray, TypeRegistry, resolve  # noqa: E402
from pgcdc.types.arrow import (  # noqa: E402
    OUT_OF_RANGE_COLUMN,
    UNCHANGED_TOAST_COLUMN,
    ArrowBatchBuilder,
)
from pgcdc.types.catalog import composite_codec, enum_codec  # noqa: E402
from pgcdc.types.columns import TextColumns  # noqa: E402
from pgcdc.types.mapping import (  # noqa: E402
    MappingOptions,
    arrow_type,
    float4_text,
    float8_text,
    inet_text,
    numeric_typmod,
    spark_type,
)
from replication.helpers import unique  # noqa: E402

OPTION_SETS = {
    "default": MappingOptions(),
    "alternatives": MappingOptions(
        arrays="string",
        unbounded_numeric_scale=4,
        interval="day_time",
        json="variant",
        time="time",
        on_out_of_range="null",
    ),
}


def typmod(precision: int, scale: int) -> int:
    """numeric(p, s)'s typmod as the server computes it (scale in 11-bit two's complement)."""
    return ((precision << 16) | (scale & 0x7FF)) + 4


# --- (a) Spark's Arrow types are ours -------------------------------------------------------


def structured_registry() -> tuple[TypeRegistry, list[int]]:
    """DEFAULT_REGISTRY plus an enum, domains, and a composite with a nested composite, an
    array, a range and an enum (built as `resolve` builds them), and their OIDs."""
    registry = DEFAULT_REGISTRY.copy()
    mood = registry.add(enum_codec(90001, "mood", array_oid=90002))
    posint = registry.add(
        replace(registry.get(23), oid=90003, name="posint", element_oid=23, structure="domain")
    )
    tags = registry.add(
        replace(registry.get(1009), oid=90004, name="tags", element_oid=1009, structure="domain")
    )
    inner = registry.add(
        composite_codec(
            90005, "inner_t", [("x", registry.get(23)), ("label", registry.get(25))], registry
        )
    )
    fields = [
        ("id", posint),
        ("nested", inner),
        ("nums", registry.get(1007)),
        ("r", registry.get(3912)),
        ("m", mood),
        ("tags", tags),
        ("at", registry.get(869)),
    ]
    outer = registry.add(composite_codec(90006, "outer_t", fields, registry, array_oid=90007))
    oids = [mood.oid, 90002, posint.oid, tags.oid, inner.oid, outer.oid, 90007, 999999]
    return registry, oids


def every_type(registry: TypeRegistry, extra: list[int]) -> list[tuple[int, int]]:
    """(OID, typmod) of every registered type, its array type, numerics with typmods."""
    types = []
    for oid, codec in DEFAULT_REGISTRY.codecs.items():
        types.append((oid, -1))
        if codec.array_oid:
            types.append((codec.array_oid, -1))
    for p, s in ((10, 2), (38, 0), (38, 38), (39, 2), (5, -2), (3, 5), (1000, 0)):
        types += [(1700, typmod(p, s)), (1231, typmod(p, s))]
    return types + [(oid, -1) for oid in extra]


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_spark_arrow_type_is_ours(options: MappingOptions) -> None:
    registry, extra = structured_registry()
    for oid, mod in every_type(registry, extra):
        ours = arrow_type(oid, mod, registry, options)
        theirs = to_arrow_type(spark_type(oid, mod, registry, options), timezone="UTC")
        # str() shows list field names, which DataType equality ignores.
        assert theirs.equals(ours, check_metadata=True), (oid, mod, theirs, ours)
        assert str(theirs) == str(ours), (oid, mod)


def test_chosen_types() -> None:
    registry, _ = structured_registry()

    def spark(oid: int, mod: int = -1, **options: Any) -> st.DataType:
        return spark_type(oid, mod, registry, MappingOptions(**options))

    assert numeric_typmod(typmod(10, 2)) == (10, 2)
    assert numeric_typmod(typmod(5, -2)) == (5, -2)
    assert numeric_typmod(-1) is None
    assert spark(1700, typmod(10, 2)) == st.DecimalType(10, 2)
    assert spark(1700, typmod(38, 38)) == st.DecimalType(38, 38)
    for mod in (-1, typmod(39, 2), typmod(5, -2), typmod(3, 5)):
        assert spark(1700, mod) == st.StringType()
        assert spark(1700, mod, unbounded_numeric_scale=6) == st.DecimalType(38, 6)
    assert spark(790) == st.DecimalType(19, 2)
    assert spark(1184) == st.TimestampType() and spark(1114) == st.TimestampNTZType()
    assert spark(1082) == st.DateType() and spark(17) == st.BinaryType()
    assert spark(26) == st.LongType() and spark(21) == st.ShortType()
    assert spark(28) == st.LongType() and spark(29) == st.LongType()  # xid, cid: uint32
    assert spark(5069) == st.DecimalType(20, 0)  # xid8: every uint64, exactly
    assert spark(271) == st.ArrayType(st.DecimalType(20, 0), True)
    snapshot = "struct<xmin:decimal(20,0),xmax:decimal(20,0),xip:array<decimal(20,0)>>"
    assert spark(5038).simpleString() == spark(2970).simpleString() == snapshot
    assert spark(5039) == st.ArrayType(spark(5038), True)
    assert spark(1083) == st.StringType() and spark(1083, time="time") == st.TimeType()
    assert spark(1186) == st.StringType()
    assert spark(1186, interval="day_time") == st.DayTimeIntervalType()
    assert spark(3802) == st.StringType() and spark(114, json="variant") == st.VariantType()
    assert spark(1007) == st.ArrayType(st.IntegerType(), True)
    assert spark(1007, arrays="string") == st.StringType()
    for oid in (25, 869, 650, 1266, 2950, 3220, 3614, 600, 1560, 90001, 999999):
        assert spark(oid) == st.StringType(), oid
    assert spark(90003) == st.IntegerType()  # domain over int4
    assert spark(90004) == st.ArrayType(st.StringType(), True)  # domain over text[]
    daterange = spark(3912)
    assert daterange.simpleString() == ("struct<lower:date,upper:date,bounds:string,empty:boolean>")
    assert spark(4535) == st.ArrayType(daterange, True)
    assert spark(90006).simpleString() == (
        "struct<id:int,nested:struct<x:int,label:string>,nums:array<int>,"
        f"r:{daterange.simpleString()},m:string,tags:array<string>,at:string>"
    )


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="arrays"):
        MappingOptions(arrays="nested")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unbounded_numeric_scale"):
        MappingOptions(unbounded_numeric_scale=39)


def test_float_texts() -> None:
    """float8out / float4out's shortest forms (the server's own are checked in the table test
    through float arrays in binary mode)."""
    f32 = struct.Struct(">f")

    def single(x: float) -> float:
        return f32.unpack(f32.pack(x))[0]

    assert [float8_text(x) for x in (1e15, 1e14, 100.0, -0.0, 1e-5, 0.0001, 0.1)] == [
        "1e+15",
        "100000000000000",
        "100",
        "-0",
        "1e-05",
        "0.0001",
        "0.1",
    ]
    assert [float8_text(x) for x in (math.nan, math.inf, -math.inf)] == [
        "NaN",
        "Infinity",
        "-Infinity",
    ]
    assert [float4_text(single(x)) for x in (0.1, 1e6, 1e5, 1.4e-45, 3.4028235e38)] == [
        "0.1",
        "1e+06",
        "100000",
        "1e-45",
        "3.4028235e+38",
    ]


# --- streaming a table through the builder -------------------------------------------------


def stream_changes(
    pg: Database, table: str, *, binary: bool, sql: str
) -> tuple[Relation, list[tuple[TupleData, Lsn]]]:
    """Run `sql` with a fresh slot and publication on `table`, stream it back, and return the
    table's Relation and each Insert's and Update's new row with its LSN."""
    pub, slot = unique("pub"), unique("slot")
    pg.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute(sql)
    relation: Relation | None = None
    rows: list[tuple[TupleData, Lsn]] = []
    options = StreamOptions((pub,), binary=binary)
    with ReplicationClient(pg.dsn, slot, options, until_idle=True, reconnect=False) as client:
        for frame, message in client:
            if isinstance(message, Relation):
                relation = message
            elif isinstance(message, Insert | Update):
                rows.append((message.new, frame.data_start))
    pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    pg.execute(f"DROP PUBLICATION {pub}")
    assert relation is not None
    return relation, rows


def build(
    relation: Relation,
    rows: list[tuple[TupleData, Lsn]],
    registry: TypeRegistry,
    options: MappingOptions,
) -> Any:
    builder = ArrowBatchBuilder(relation, registry, options)
    for row, lsn in rows:
        builder.append(row, lsn)
    batch = builder.flush()
    assert len(builder) == 0
    assert batch.schema.equals(to_arrow_schema(builder.spark_schema, timezone="UTC"), True)
    return batch


SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'a b', 'NULL');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN tags AS text[];
CREATE TYPE inner_t AS (x int, label text);
CREATE TYPE outer_t AS (id posint, nested inner_t, nums int[], r daterange, m mood, a inet,
    f float8);
"""

#: (column, type, the rows' values as SQL literals; missing ones are NULL).
COLUMNS: list[tuple[str, str, list[str]]] = [
    ("b", "bool", ["true", "false"]),
    ("i2", "int2", ["-32768", "32767"]),
    ("i4", "int4", ["-2147483648", "2147483647"]),
    ("i8", "int8", ["-9223372036854775808", "9223372036854775807"]),
    ("o", "oid", ["4294967295", "0"]),
    ("f4", "float4", ["0.1", "'-3.4028235e38'", "'1e-45'", "'NaN'", "'Infinity'"]),
    ("f8", "float8", ["'1e15'", "'-0'", "'5e-324'", "'NaN'", "'-Infinity'", "0.1"]),
    ("n102", "numeric(10,2)", ["12345678.90", "-0.01", "0", "'NaN'"]),
    ("n38", "numeric(38,0)", ["'99999999999999999999999999999999999999'", "-1"]),
    ("n", "numeric", ["'1e-30'", "'NaN'", "'Infinity'", "-123.4500", "'1e40'", "1.23456"]),
    ("nneg", "numeric(5,-2)", ["12300", "-9999900"]),
    ("mo", "money", ["'-92233720368547758.08'", "1234.56", "0"]),
    ("t", "text", ["''", r"E'a \"q\" \\ text'", "'ünï 🎉'", "E'tab\\there'"]),
    ("vc", "varchar(5)", ["'ab '"]),
    ("bp", "char(5)", ["'ab'"]),
    ("nm", "name", ["'a name'"]),
    ("ch", '"char"', ["'x'"]),
    ("x", "xml", ["'<a>b</a>'"]),
    ("j", "json", ["""'{"b": 1, "a": [1, 2.5, "x", null, true], "a": {"c": 1e400}}'""", "'3'"]),
    ("jb", "jsonb", ["""'{"b": 1, "a": [1, 2.5, "x"], "big": 12345678901234567890123}'"""]),
    ("u", "uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    ("ip", "inet", ["'192.168.1.5'", "'10.1.2.3/8'", "'::ffff:1.2.3.4'", "'::1.2.3.4'"]),
    ("ip2", "inet", ["'2001:db8::1/64'", "'::'", "'1:0:0:1:0:0:0:1'", "'1::'", "'::2'"]),
    ("cd", "cidr", ["'10/8'", "'::ffff:1.2.3.0/120'", "'1.2.3.4/32'", "'2001:db8::/32'"]),
    ("mac", "macaddr", ["'08:00:2b:01:02:03'"]),
    ("mac8", "macaddr8", ["'08:00:2b:01:02:03:04:05'"]),
    ("bt", "bit(5)", ["B'10101'"]),
    ("vb", "varbit", ["B''", "B'1'", "B'1010101010'"]),
    ("lsn", "pg_lsn", ["'16/B374D848'"]),
    ("tsv", "tsvector", ["'a fat cat:3A sat'", "''"]),
    ("tsq", "tsquery", ["'fat & (rat | !cat:*A) <2> mouse'"]),
    ("pt", "point", ["'(1.5,-2)'", "'(1e20,1e-20)'"]),
    ("ln", "line", ["'{1,-1,0}'"]),
    ("ls", "lseg", ["'[(0,0),(1,1)]'"]),
    ("bx", "box", ["'(1,1),(0,0)'"]),
    ("pa", "path", ["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"]),
    ("pg", "polygon", ["'((0,0),(1,1),(1,0))'"]),
    ("ci", "circle", ["'<(0,0),1.5>'"]),
    ("ba", "bytea", ["'\\x00ff10'", "''"]),
    ("d", "date", ["'0001-01-01'", "'9999-12-31'", "'2024-02-29'"]),
    ("ts", "timestamp", ["'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'"]),
    ("tz", "timestamptz", ["'2024-06-01 12:34:56.789+02'", "'0001-01-01 00:00:00+00'"]),
    ("tm", "time", ["'00:00:00.000001'", "'23:59:59.999999'", "'24:00:00'"]),
    ("ttz", "timetz", ["'12:00:00+05:30'", "'24:00:00-15:59'", "'01:02:03.5-00:00:01'"]),
    ("iv", "interval", ["'3 days 04:05:06.7'", "'1 year 2 mons -3 days'", "'-00:00:01'"]),
    ("ia", "int[]", ["'{1,NULL,3}'", "'{}'", "'{{1,2},{3,4}}'", "'[0:1]={5,6}'"]),
    ("ta", "text[]", ["""ARRAY['a b', '', NULL, 'NULL', '"q\\', '{}', 'ü']"""]),
    ("na", "numeric(6,2)[]", ["'{1.5,NULL,-9999.99}'"]),
    ("tza", "timestamptz[]", ["'{\"2020-01-01 00:00:00+00\",NULL}'"]),
    ("ipa", "inet[]", ["'{::1,1.2.3.4/24,1.2.3.4}'"]),
    ("bxa", "box[]", ["'{(1,1),(0,0);(2,2),(1,1)}'"]),
    ("f4a", "float4[]", ["'{0.1,1e-45,-0,NaN,3.4028235e38}'"]),
    ("f8a", "float8[]", ["'{0.1,1e15,1e-5,-Infinity}'"]),
    ("ba_a", "bytea[]", ["'{\"\\\\x00\",NULL}'"]),
    ("da", "date[]", ["'{2020-01-01,9999-12-31}'"]),
    ("jba", "jsonb[]", ["""ARRAY['{"a": "b c"}'::jsonb, 'null']"""]),
    ("iva", "interval[]", ["'{\"1 day\",\"-1 mons\"}'"]),
    ("ba2", "bool[]", ["'{t,f,NULL}'"]),
    ("moa", "money[]", ["'{1.5,-2}'"]),
    ("ir", "int4range", ["'[1,5)'", "'empty'", "'(,)'"]),
    ("nr", "numrange", ["'(1.5,2.5]'", "'[1e-30,)'"]),
    ("tzr", "tstzrange", ["'[2020-01-01,)'", "'[2020-01-01,infinity)'"]),
    ("dr", "daterange", ["'empty'", "'[2020-01-01,2020-02-01)'"]),
    ("imr", "int4multirange", ["'{[1,3),[5,7)}'", "'{}'"]),
    ("m", "mood", ["'a b'", "'NULL'"]),
    ("ma", "mood[]", ["'{\"a b\",NULL,\"NULL\",sad}'"]),
    ("dra", "daterange[]", ["'{\"[2020-01-01,2020-01-03)\",empty}'"]),
    ("pi", "posint", ["7"]),
    ("tg", "tags", ["'{x,\"y z\"}'"]),
    ("oc", "outer_t", ["ROW(1, ROW(2, 'in\"ner'), '{1,2}', '[2020-01-01,2020-01-05)', 'a b', "
                       "'::1', 1e15)", "ROW(NULL, NULL, NULL, 'empty', NULL, NULL, NULL)"]),
    ("oca", "outer_t[]", ["ARRAY[ROW(1, ROW(2, 'x y'), '{3}', 'empty', 'NULL', '1.2.3.4/24', "
                          "-0.5)::outer_t, NULL]"]),
    ("xi", "xid", ["'4294967295'", "'0'", "pg_current_xact_id()::xid"]),
    ("cm", "cid", ["'7'", "'4294967295'"]),
    ("x8", "xid8", ["'18446744073709551615'", "'0'", "pg_current_xact_id()"]),
    ("sn", "pg_snapshot", ["'10:20:10,14,15'", "pg_current_snapshot()",
                           "'1:18446744073709551615:'"]),
    ("tsn", "txid_snapshot", ["'7:9:8'", "txid_current_snapshot()"]),
    ("x8a", "xid8[]", ["'{1,NULL,18446744073709551615}'", "'{}'"]),
    ("sna", "pg_snapshot[]", ["ARRAY['10:20:10,14,15'::pg_snapshot, NULL, '3:3:']"]),
]  # fmt: skip
ROW_COUNT = max(len(values) for _, _, values in COLUMNS)


def create_every_type_table(pg: Database) -> str:
    """Tables `src` (the rows, with an id) and `v` (empty, published); returns the INSERT
    that copies `src` into `v`."""
    pg.execute(SETUP)
    try:
        pg.execute("SELECT '<a/>'::xml")
        has_xml = True
    except psycopg.errors.FeatureNotSupported:  # a server built without libxml
        has_xml = False
    pg.execute("CREATE TABLE src (id int, " + ", ".join(f"{c} {t}" for c, t, _ in COLUMNS) + ")")
    for i in range(ROW_COUNT):
        values = [v[i] if i < len(v) and (has_xml or t != "xml") else "NULL" for _, t, v in COLUMNS]
        pg.execute(f"INSERT INTO src VALUES ({i}, {', '.join(values)})")
    pg.execute("CREATE TABLE v (LIKE src)")
    return "INSERT INTO v SELECT * FROM src ORDER BY id"


def resolved_registry(pg: Database, relation: Relation) -> TypeRegistry:
    registry = DEFAULT_REGISTRY.copy()
    catalog = Catalog(pg.dsn)
    try:
        resolve(registry, catalog, [c.type_oid for c in relation.columns])
    finally:
        catalog.close()
    return registry


def server_connection(pg: Database) -> Any:
    """A connection whose text output matches the replication session's pinned settings, with
    the composites registered for psycopg."""
    conn = pg.connect()
    conn.execute(
        "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; "
        "SET extra_float_digits = 3; SET bytea_output = 'hex'"
    )
    for name in ("inner_t", "outer_t"):
        info = CompositeInfo.fetch(conn, name)
        assert info is not None
        register_composite(info, conn)
    return conn


def same(got: Any, want: Any, spark: st.DataType) -> bool:
    """Whether an Arrow value (to_pylist) is psycopg's value of the same column."""
    if want is None or got is None:
        return got is None and want is None
    if isinstance(spark, st.FloatType | st.DoubleType):
        if isinstance(spark, st.FloatType):
            want = struct.unpack(">f", struct.pack(">f", want))[0]
        return (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)
        )
    if isinstance(spark, st.ArrayType):
        element = spark.elementType
        pairs = zip(got, want, strict=False)
        return len(got) == len(want) and all(same(g, w, element) for g, w in pairs)
    if isinstance(spark, st.StructType) and isinstance(want, PsycopgRange):
        bound = spark["lower"].dataType
        if want.isempty:
            return got["empty"] and got["lower"] is None and got["upper"] is None
        return (
            not got["empty"]
            and got["bounds"] == want.bounds
            and same(got["lower"], want.lower, bound)
            and same(got["upper"], want.upper, bound)
        )
    if isinstance(spark, st.StructType) and isinstance(want, str):  # a snapshot's text
        xip = ",".join(str(x) for x in got["xip"])
        return want == f"{got['xmin']}:{got['xmax']}:{xip}"
    if isinstance(spark, st.StructType):  # a registered composite: a named tuple
        return all(same(got[f.name], getattr(want, f.name), f.dataType) for f in spark.fields)
    if isinstance(spark, st.StringType):  # inside a struct: the server's text of a value
        if isinstance(want, list):  # (int arrays in these tests)
            want = "{" + ",".join("NULL" if w is None else str(w) for w in want) + "}"
        return got == (format(want, "f") if isinstance(want, Decimal) else str(want))
    if isinstance(spark, st.VariantType):
        return VariantUtils.to_python(got["value"], got["metadata"]) == json.loads(want)
    if isinstance(want, str):  # a domain inside a composite: psycopg does not know its OID
        return str(got) == want
    return got == want and type(got) is type(want)


def oracle_expression(name: str, arrow: Any) -> str:
    """The SELECT expression giving what column `name` of Arrow type `arrow` must hold:
    format('%s') calls the output function (::text would not, for inet and bpchar)."""
    if pa.types.is_string(arrow):  # (format() makes NULL an empty string)
        return f"CASE WHEN {name} IS NOT NULL THEN format('%s', {name}) END"
    if pa.types.is_list(arrow) and pa.types.is_string(arrow.value_type):
        return (
            f"CASE WHEN {name} IS NOT NULL THEN ARRAY(SELECT CASE WHEN e IS NOT NULL THEN "
            f"format('%s', e) END FROM unnest({name}) WITH ORDINALITY u(e, n) ORDER BY n) END"
        )
    special = {
        "mo": "mo::numeric",  # money's text is the locale's
        "moa": "moa::numeric[]",
        "j": "j::text",  # a variant: compared with the parsed text
        "jb": "jb::text",
        # values psycopg cannot load (and which the policy nulls anyway)
        "tzr": "NULLIF(tzr, '[2020-01-01,infinity)')",
        "tm": "NULLIF(tm, '24:00:00')",
        # numbers, never printed as the types print themselves
        "xi": "xi::text::int8",
        "cm": "cm::text::int8",
        "x8": "x8::text::numeric",
        "x8a": "x8a::text::numeric[]",
        # a snapshot's text (compared with the struct by `same`)
        "sn": "sn::text",
        "tsn": "tsn::text",
        "sna": "CASE WHEN sna IS NOT NULL THEN ARRAY(SELECT e::text FROM unnest(sna) "
        "WITH ORDINALITY u(e, n) ORDER BY n) END",
    }
    return special.get(name, name)


def check_against_server(pg: Database, batch: Any, spark_schema: st.StructType) -> None:
    """Every value of the batch (built from table `v`) is the server's value in `src`."""
    names = [c for c, _, _ in COLUMNS]
    exprs = [oracle_expression(name, batch.schema.field(name).type) for name in names]
    with server_connection(pg) as conn:
        server = conn.execute(f"SELECT {', '.join(exprs)} FROM src ORDER BY id").fetchall()
    marks = batch.column(OUT_OF_RANGE_COLUMN).to_pylist()
    checked = 0
    for r, (row, marked) in enumerate(zip(server, marks, strict=True)):
        for name, want in zip(names, row, strict=True):
            got = batch.column(name)[r].as_py()
            if marked and name in marked:
                assert got is None, (name, r)
                continue
            assert same(got, want, spark_schema[name].dataType), (name, r, got, want)
            checked += 1
    assert checked > len(names) * 2


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_every_type_text_and_binary_agree_with_the_server(
    pg: Database, options: MappingOptions
) -> None:
    insert = create_every_type_table(pg)
    relation, text_rows = stream_changes(pg, "v", binary=False, sql=insert)
    pg.execute("TRUNCATE v")
    _, binary_rows = stream_changes(pg, "v", binary=True, sql=insert)
    assert {chr(k) for row, _ in binary_rows for k in row.kinds} == {"b", "n"}
    registry = resolved_registry(pg, relation)
    null_policy = replace(options, on_out_of_range="null")
    text = build(relation, text_rows, registry, null_policy)
    binary = build(relation, binary_rows, registry, null_policy)
    assert text.schema.equals(binary.schema, check_metadata=True)
    for name in text.schema.names:
        # (repr: NaN equals NaN)
        expected, got = (repr(b.column(name).to_pylist()) for b in (text, binary))
        assert got == expected, name
    assert text.num_rows == ROW_COUNT
    builder = ArrowBatchBuilder(relation, registry, null_policy)
    check_against_server(pg, text, builder.spark_schema)
    marks = dict(enumerate(text.column(OUT_OF_RANGE_COLUMN).to_pylist()))
    if options.arrays == "list":  # the 2-D array, the one with lower bound 0
        assert "ia" in marks[2] and "ia" in marks[3]
        assert "n102" in marks[3]  # NaN in a decimal
        assert "tzr" in marks[1]  # a range bound at infinity
        assert text.column("ir").to_pylist()[:3] == [
            {"lower": 1, "upper": 5, "bounds": "[)", "empty": False},
            {"lower": None, "upper": None, "bounds": "()", "empty": True},
            {"lower": None, "upper": None, "bounds": "()", "empty": False},
        ]
        assert text.column("oc").to_pylist()[0] == {
            "id": 1,
            "nested": {"x": 2, "label": 'in"ner'},
            "nums": [1, 2],
            "r": {"lower": date(2020, 1, 1), "upper": date(2020, 1, 5), "bounds": "[)",
                  "empty": False},
            "m": "a b",
            "a": "::1",
            "f": 1e15,
        }  # fmt: skip
    else:
        assert text.column("ia").to_pylist()[2:4] == ["{{1,2},{3,4}}", "[0:1]={5,6}"]
        assert "iv" in marks[1] and "tm" in marks[2]  # months; 24:00:00
        assert "n" in marks[4] and "n" in marks[5]  # 1e40, 1.23456: not decimal(38,4)


# --- (c) the out-of-range policy -----------------------------------------------------------

POLICY_TABLE = "CREATE TABLE p (id int, ts timestamptz, d date, n numeric, a int[])"
POLICY_ROWS = [
    ("ts", "'infinity'", "'infinity'"),
    ("d", "'0044-03-15 BC'", "'0044-03-15 BC'"),
    ("d", "'10000-01-01'", "'10000-01-01'"),
    ("n", "'1e40'", "'10000000000000000000000000000000000000000'"),
    ("n", "1.555", "'1.555'"),
    ("a", "'{{1,2},{3,4}}'", "'{{1,2},{3,4}}'"),
]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_out_of_range_policy(pg: Database, binary: bool) -> None:
    pg.execute(POLICY_TABLE)
    values = ", ".join(
        f"({i}, {sql if c == 'ts' else 'now()'}, {sql if c == 'd' else 'NULL'}, "
        f"{sql if c == 'n' else '1.25'}, {sql if c == 'a' else 'NULL'})"
        for i, (c, sql, _) in enumerate(POLICY_ROWS)
    )
    relation, rows = stream_changes(pg, "p", binary=binary, sql=f"INSERT INTO p VALUES {values}")
    options = MappingOptions(unbounded_numeric_scale=2)
    assert spark_type(1700, -1, DEFAULT_REGISTRY, options) == st.DecimalType(38, 2)
    for (row, lsn), (column, _, shown) in zip(rows, POLICY_ROWS, strict=True):
        builder = ArrowBatchBuilder(relation, DEFAULT_REGISTRY, options, table_name="policy")
        with pytest.raises(ValueOutOfRange) as caught:
            builder.append(row, lsn)
        error = caught.value
        assert (error.table, error.column, error.lsn) == ("public.policy", column, lsn)
        message = str(error)
        assert f"public.policy.{column}" in message and f"LSN {lsn}" in message
        assert shown.replace("'", "") in message, message
        assert len(builder) == 0

    null_policy = replace(options, on_out_of_range="null")
    batch = build(relation, rows, DEFAULT_REGISTRY, null_policy)
    assert batch.column(OUT_OF_RANGE_COLUMN).to_pylist() == [[c] for c, _, _ in POLICY_ROWS]
    for r, (column, _, _) in enumerate(POLICY_ROWS):
        assert batch.column(column)[r].as_py() is None
    assert batch.column("n").to_pylist()[0] == Decimal("1.25")  # the others are kept
    assert batch.column(UNCHANGED_TOAST_COLUMN).to_pylist() == [None] * len(POLICY_ROWS)


def test_unchanged_toast_is_null_and_listed(pg: Database) -> None:
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, doc text, n int)")
    pg.execute("ALTER TABLE big ALTER doc SET STORAGE EXTERNAL")  # out of line, uncompressed
    pg.execute("INSERT INTO big VALUES (1, repeat('x', 10000), 1)")
    relation, rows = stream_changes(pg, "big", binary=False, sql="UPDATE big SET n = 2")
    assert rows[0][0].kind(1) == "u"
    batch = build(relation, rows, DEFAULT_REGISTRY, MappingOptions())
    assert batch.to_pylist() == [
        {"id": 1, "doc": None, "n": 2, UNCHANGED_TOAST_COLUMN: ["doc"]},
    ]


def test_unknown_binary_cannot_be_text(pg: Database) -> None:
    pg.execute("CREATE TABLE s (id int, rc regclass)")  # (no codec: its text is a name)
    insert = "INSERT INTO s VALUES (1, 'pg_class')"
    relation, rows = stream_changes(pg, "s", binary=False, sql=insert)
    batch = build(relation, rows, DEFAULT_REGISTRY, MappingOptions())
    assert batch.column("rc").to_pylist() == ["pg_class"]
    pg.execute("TRUNCATE s")
    relation, rows = stream_changes(pg, "s", binary=True, sql=insert)
    if rows[0][0].kind(1) != "b":
        pytest.skip("this server sends regclass as text in binary mode")
    with pytest.raises(ValueOutOfRange, match="stream in text mode"):
        build(relation, rows, DEFAULT_REGISTRY, MappingOptions())


# --- (d) Spark -------------------------------------------------------------------------------


SPARK_COLUMNS = [  # name, type OID, typmod, two rows' text values
    ("id", 23, -1, b"1", b"2"),
    ("amount", 1700, typmod(12, 2), b"1234.50", None),
    ("at", 1184, -1, b"2024-06-01 10:34:56.789+00", None),
    ("wall", 1114, -1, b"9999-12-31 23:59:59.999999", None),
    ("day", 1082, -1, b"2024-02-29", None),
    ("tags", 1009, -1, b'{a,"b c",NULL}', b"{}"),
    ("r", 3904, -1, b"[1,5)", b"empty"),
    ("mr", 4451, -1, b"{[1,3),[5,7)}", b"{}"),
    ("addr", 869, -1, b"10.0.0.1", None),
    ("doc", 3802, -1, b'{"a": [1, 2.5]}', None),
    ("clock", 1083, -1, b"01:02:03.000004", None),
    ("span", 1186, -1, b"1 day 00:00:01", None),
    ("raw", 17, -1, b"\\x00ff", None),
]


def spark_batch() -> tuple[Any, st.StructType]:
    """A batch of two rows of the SPARK_COLUMNS, with the Spark-typed options, and its schema."""
    columns = tuple(Column(0, name, oid, mod) for name, oid, mod, _, _ in SPARK_COLUMNS)
    relation = Relation(1, "public", "t", "d", columns)
    options = MappingOptions(json="variant", time="time", interval="day_time")
    builder = ArrowBatchBuilder(relation, DEFAULT_REGISTRY, options)
    for i in (3, 4):
        values = tuple(column[i] for column in SPARK_COLUMNS)
        kinds = b"".join(b"t" if v is not None else b"n" for v in values)
        builder.append(TupleData(kinds, values), Lsn(i))
    return builder.flush(), builder.spark_schema


def check_spark_rows(rows: list[Any]) -> None:
    first, second = rows
    assert first.id == 1 and first.amount == Decimal("1234.50")
    # TimestampType collects as a naive local time; TimestampNTZType as it is
    assert first.at.astimezone(UTC) == datetime(2024, 6, 1, 10, 34, 56, 789000, tzinfo=UTC)
    assert first.wall == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert first.day == date(2024, 2, 29) and first.tags == ["a", "b c", None]
    assert first.r.asDict() == {"lower": 1, "upper": 5, "bounds": "[)", "empty": False}
    assert [r.lower for r in first.mr] == [1, 5]
    assert first.addr == "10.0.0.1" and first.doc.toPython() == {"a": [1, Decimal("2.5")]}
    assert first.clock == time(1, 2, 3, 4) and first.span == timedelta(days=1, seconds=1)
    assert first.raw == bytearray(b"\x00\xff")
    assert first[UNCHANGED_TOAST_COLUMN] is None
    assert second.id == 2 and second.amount is None and second.tags == [] and second.mr == []
    assert second.r.empty and second.r.lower is None


def test_spark_creates_a_dataframe_from_the_batch(spark: Any) -> None:
    batch, schema = spark_batch()
    df = spark.createDataFrame(pa.Table.from_batches([batch]), schema=schema)
    assert df.schema == schema
    check_spark_rows(df.collect())


def test_a_spark_data_source_accepts_the_batch(spark: Any) -> None:
    """Python data sources refuse a batch whose schema is not exactly Spark's Arrow schema."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    batch, schema = spark_batch()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()

    class Reader(DataSourceReader):
        def read(self, partition: Any) -> Iterator[Any]:
            import pyarrow

            yield from pyarrow.ipc.open_stream(payload)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pgcdc_test_mapping"

        def schema(self) -> st.StructType:
            return schema

        def reader(self, schema: st.StructType) -> Reader:
            return Reader()

    spark.dataSource.register(Source)
    check_spark_rows(spark.read.format("pgcdc_test_mapping").load().collect())


# --- helpers' own checks ---------------------------------------------------------------------


def test_inet_texts() -> None:
    assert inet_text(ip_interface("1.2.3.4/32")) == "1.2.3.4"
    assert inet_text(ip_network("1.2.3.4/32")) == "1.2.3.4/32"
    assert inet_text(ip_interface("::ffff:1.2.3.4")) == "::ffff:1.2.3.4"
    assert inet_text(ip_interface("1:0:0:2:0:0:3:4")) == "1::2:0:0:3:4"
    assert inet_text(ip_network("::/0")) == "::/0"


# --- arrays whose elements are arrays ------------------------------------------------------

#: Values of ``tags[]`` (``tags`` a domain over ``text[]``) and ``deep[]`` (``deep`` a domain
#: over ``tags``), as literals, with the list each one is, or None when the default mapping
#: cannot hold it (a multi-dimensional array of them; an element with more dimensions, or
#: another lower bound, than a list holds).
NESTED_ROWS: list[tuple[str | None, list[Any] | None]] = [
    (r'{"{a,b}","{}",NULL,"{\"x y\",NULL}","{\"\"}"}', [["a", "b"], [], None, ["x y", None], [""]]),
    ("{}", []),
    (None, None),
    ("{NULL}", [None]),
    ('{{"{a}","{b}"},{NULL,"{}"}}', None),
    ("{{NULL,NULL},{NULL,NULL}}", None),
    ('[0:1]={"{a}","{b}"}', None),
    ('{"{{a,b},{c,d}}"}', None),
    ('{"[0:0]={x}"}', None),
]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_an_array_of_a_domain_over_an_array(pg: Database, binary: bool) -> None:
    """``tags[]``, ``tags`` a domain over ``text[]``, has one dimension of elements that are
    arrays: a list of lists (Arrow list<list<string>>, Spark array<array<string>>), in text
    and binary mode, and through the copy's text columns; a multi-dimensional one is refused
    (marked under the policy "null"), though its nested lists could pass for one dimension;
    as a string (arrays = "string") each is the server's text."""
    pg.execute(
        "CREATE DOMAIN tags AS text[]; CREATE DOMAIN deep AS tags;"
        "CREATE TABLE n0 (id int, ts tags[], ds deep[]); CREATE TABLE n (LIKE n0)"
    )
    for i, (literal, _) in enumerate(NESTED_ROWS):
        pg.execute("INSERT INTO n0 VALUES (%s, %s::tags[], %s::deep[])", (i, literal, literal))
    two_dimensional = "SELECT array_agg(id ORDER BY id) FROM n0 WHERE array_ndims(ts) = 2"
    assert pg.execute(two_dimensional) == [([4, 5],)]
    insert = "INSERT INTO n SELECT * FROM n0 ORDER BY id"
    relation, rows = stream_changes(pg, "n", binary=binary, sql=insert)
    registry = resolved_registry(pg, relation)
    nested = pa.list_(pa.field("element", pa.list_(pa.field("element", pa.string()))))
    spark_nested = st.ArrayType(st.ArrayType(st.StringType(), True), True)
    null_policy = MappingOptions(on_out_of_range="null")
    batch = build(relation, rows, registry, null_policy)
    want = [value for _, value in NESTED_ROWS]
    marked = [None if v is not None or lit is None else ["ts", "ds"] for lit, v in NESTED_ROWS]
    for column in relation.columns[1:]:
        assert batch.schema.field(column.name).type == nested
        assert spark_type(column.type_oid, -1, registry) == spark_nested
        assert batch.column(column.name).to_pylist() == want, column.name
    assert batch.column(OUT_OF_RANGE_COLUMN).to_pylist() == marked
    # decoded, the two dimensions of NULLs are not a list of two lists of NULLs
    row, _ = rows[5]
    decoded = registry.get(relation.columns[1].type_oid).decode(row.kinds[1], row.values[1])
    assert decoded == PgArray([[None, None], [None, None]], (1, 1))
    # the copy's path: the server's texts, typed column by column
    texts = pg.execute("SELECT id::text, ts::text, ds::text FROM n0 ORDER BY id")
    columns = [pa.array([row[k] for row in texts], pa.string()) for k in range(3)]
    copied = TextColumns(relation, registry, null_policy, None).batch(columns, len(texts))
    assert copied.column("ts").to_pylist() == want and copied.column("ds").to_pylist() == want
    assert copied.column(OUT_OF_RANGE_COLUMN).to_pylist() == marked
    # as strings: the server's text, in either mode (binary values written back as text)
    strings = build(relation, rows, registry, MappingOptions(arrays="string"))
    assert strings.column("ts").to_pylist() == [row[1] for row in texts]
    assert strings.column("ds").to_pylist() == [row[2] for row in texts]
