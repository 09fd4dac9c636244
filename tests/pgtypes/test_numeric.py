"""numeric and money: streamed text and binary values equal the server's own, digit for digit
and scale for scale, and each other."""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types.numeric import money_binary, money_text, numeric_binary, numeric_text

from .helpers import stream_both

NUMERICS = [
    "'NaN'",
    "'Infinity'",
    "'-Infinity'",
    "0",
    "'-0.000'",
    "'1.50'",
    "'-1.50'",
    "'0.0001'",
    "'-12345.6789'",
    "'10000'",
    "'99990000'",
    "'0.00000000000000000000000000000000001'",
    "'123456789012345678901234567890.123456789012345678901234567890'",
    "'1e-1000'",
    "'1e-16383'",
    "'-1e100'",
    "('1' || repeat('0', 131071))::numeric",  # the largest power of ten: 131072 digits
    "(repeat('9', 1000) || '.' || repeat('9', 16383))::numeric",
    "'1.0000000000000000000000000000000000000000000000000000000000000000'",
]
MONEY = [
    "'-92233720368547758.08'",
    "'92233720368547758.07'",
    "0",
    "'0.01'",
    "'-0.01'",
    "'1234567.89'",
    "'-1.00'",
    "'12.345'",  # rounded by the server to 12.35
]


def exact(value: Decimal) -> tuple:
    """A Decimal's sign, digits and exponent: equal only when value and scale are."""
    return value.as_tuple()


def test_numeric_values_equal_the_servers(pg: Database) -> None:
    rows = [f"{n}, null" for n in NUMERICS]
    rows[3] = "0, 12345678"  # numeric(10, -2) rounds to hundreds (PostgreSQL 15+)
    text, binary = stream_both(pg, "n numeric, r numeric(10, -2)", rows)
    with pg.connect() as conn:
        server = conn.execute("SELECT n, r FROM src ORDER BY id").fetchall()
    assert len(text) == len(binary) == len(server) == len(NUMERICS)
    for t, b, s in zip(text, binary, server, strict=True):
        for tv, bv, sv in zip(t, b, s, strict=True):
            if sv is None:
                assert tv is None and bv is None
                continue
            assert isinstance(tv, Decimal) and isinstance(bv, Decimal)
            assert exact(tv) == exact(bv) == exact(sv)
    assert str(text[5][0]) == "1.50" and str(text[4][0]) == "0.000"
    assert exact(text[0][0]) == exact(Decimal("NaN"))
    assert text[1][0] == Decimal("Infinity") and text[2][0] == Decimal("-Infinity")
    assert len(str(text[16][0])) == 131072
    assert str(text[3][1]) == "12345700"


def test_money_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, "m money", [f"{m}::numeric::money" for m in MONEY])
    with pg.connect() as conn:
        server = conn.execute("SELECT m::numeric, m::text FROM src ORDER BY id").fetchall()
    for (t,), (b,), (number, shown) in zip(text, binary, server, strict=True):
        assert exact(t) == exact(b)
        assert t == number and exact(t) == exact(number.quantize(Decimal("0.01")))
        assert money_text(shown.encode()) == t
    assert str(text[0][0]) == "-92233720368547758.08"
    assert str(text[1][0]) == "92233720368547758.07"
    assert str(text[7][0]) == "12.35"


@pytest.mark.parametrize(
    ("shown", "value"),
    [
        (b"$1,234.56", "1234.56"),
        (b"-$1.00", "-1.00"),
        (b"($1,000.00)", "-1000.00"),
        (b"1.234,56 \xe2\x82\xac", "1234.56"),  # a de_DE-style locale
        (b"$0.00", "0.00"),
        (b"-$92,233,720,368,547,758.08", "-92233720368547758.08"),
    ],
)
def test_money_text_in_other_locales(shown: bytes, value: str) -> None:
    assert exact(money_text(shown)) == exact(Decimal(value))


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (numeric_text, b"12x", "numeric text"),
        (numeric_text, b"\xff", "numeric text"),
        (numeric_binary, b"\x00\x01", "at least 8 bytes"),
        (numeric_binary, struct.pack(">hhHh", 0, 0, 0x8000, 0), "sign word"),
        (numeric_binary, struct.pack(">hhHhH", 2, 0, 0, 0, 1), "2 digits needs 12 bytes"),
        (numeric_binary, struct.pack(">hhHh", -1, 0, 0, 0), "-1 digits"),
        (numeric_binary, struct.pack(">hhHhH", 1, 0, 0, 0, 10000), "above 9999"),
        (numeric_binary, struct.pack(">hhHh", 0, 0, 0, -1), "display scale"),
        (money_text, b"$", "money text"),
        (money_text, b"$123,456,789,012,345,678,901.00", "money text"),
        (money_binary, b"\x00" * 7, "money binary needs 8 bytes"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)


def test_numeric_binary_layouts() -> None:
    """Digits past the display scale are dropped (numeric_out truncates); long digit lists
    take the array path."""
    assert str(numeric_binary(struct.pack(">hhHhHH", 2, 0, 0x4000, 1, 1, 5678))) == "-1.5"
    long = struct.pack(">hhHh", 40, 39, 0, 0) + struct.pack(">H", 1) * 40
    assert str(numeric_binary(long)) == ("0001" * 40).lstrip("0")
    assert str(numeric_binary(struct.pack(">hhHh", 0, 0, 0, 3))) == "0.000"


finite_decimals = st.decimals(allow_nan=False, allow_infinity=False).filter(
    lambda d: d.adjusted() < 131000 and d.as_tuple().exponent > -16000  # type: ignore[operator]
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    value=st.one_of(
        finite_decimals,
        st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")]),
    )
)
def test_numeric_round_trips_through_the_server(pg: Database, value: Decimal) -> None:
    """Whatever the server makes of a Decimal, both parsers read back what psycopg reads."""
    row = pg.execute("SELECT x, x::text, numeric_send(x) FROM (SELECT %s::numeric AS x) s", [value])
    server, shown, sent = row[0]
    assert exact(numeric_text(shown.encode())) == exact(numeric_binary(sent)) == exact(server)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cents=st.integers(-(2**63), 2**63 - 1))
def test_money_round_trips_through_the_server(pg: Database, cents: int) -> None:
    row = pg.execute(
        "SELECT m::text, cash_send(m) FROM (SELECT %s::int8 * 0.01::money m) s", [cents]
    )
    shown, sent = row[0]
    expected = exact(Decimal(f"{cents}E-2"))
    assert exact(money_text(shown.encode())) == exact(money_binary(sent)) == expected
