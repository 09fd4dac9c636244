"""date, time, timetz, timestamp, timestamptz and interval: streamed values equal the server's.

The oracle is the server itself: each type's send function (``date_send``, ``interval_send``, …)
gives the exact integers it stores, read here as bytea. Every value streamed in text mode and in
binary mode must decode to the same Python value, whose exact integers equal those; values the
special classes carry must print as the server's own text; and values Python's `datetime` can
hold must equal what psycopg loads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY
from pgcdc.types.values import (
    INFINITY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NEG_INFINITY,
    Infinity,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    civil_from_days,
    days_from_civil,
)

from .helpers import kinds_sent, stream_inserts

EPOCH = datetime(2000, 1, 1)
EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
TEXT, BINARY = 0x74, 0x62
FRACTIONS = [".1", ".12", ".123", ".1234", ".12345", ".123456", ".000001", ".5", ""]

# --- exact integers of a decoded value, to compare with the send functions' bytes -----------


def date_fields(v: Any) -> tuple[int, ...]:
    if isinstance(v, date):
        return ((v - date(2000, 1, 1)).days,)
    assert isinstance(v, PgDate | Infinity), v
    return (v.days,)


def timestamp_fields(v: Any) -> tuple[int, ...]:
    if isinstance(v, datetime):
        return ((v - (EPOCH if v.tzinfo is None else EPOCH_UTC)) // US,)
    assert isinstance(v, PgTimestamp | Infinity), v
    return (v.microseconds,)


def time_fields(v: Any) -> tuple[int, ...]:
    if isinstance(v, PgTime):
        us, offset = v.microseconds, v.offset
    else:
        assert isinstance(v, time), v
        us = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
        delta = v.utcoffset()
        offset = None if delta is None else int(delta.total_seconds())
    return (us,) if offset is None else (us, -offset)  # timetz_send: zone in seconds west


def interval_fields(v: Any) -> tuple[int, ...]:
    assert isinstance(v, Interval), v
    return (v.microseconds, v.days, v.months)


TYPES: dict[str, tuple[str, Callable[[Any], tuple[int, ...]]]] = {
    "date": (">i", date_fields),
    "time": (">q", time_fields),
    "timetz": (">qi", time_fields),
    "timestamp": (">q", timestamp_fields),
    "timestamptz": (">q", timestamp_fields),
    "interval": (">qii", interval_fields),
}
OIDS = {"date": 1082, "time": 1083, "timetz": 1266, "timestamp": 1114, "timestamptz": 1184}
OIDS["interval"] = 1186

# --- edge values per type ---------------------------------------------------------------------

DATES = [
    "-infinity",
    "infinity",
    "4714-11-24 BC",  # Julian day 0, the minimum
    "4714-11-25 BC",
    "0045-02-29 BC",  # astronomical year -44 is a leap year
    "0044-03-15 BC",
    "0001-12-31 BC",
    "0001-01-01 BC",
    "0001-01-01",
    "0004-02-29",
    "1900-02-28",
    "1900-03-01",
    "1970-01-01",
    "1999-12-31",
    "2000-01-01",
    "2000-02-29",
    "2024-02-29",
    "9999-12-31",
    "10000-01-01",
    "12345-06-07",
    "5874897-12-31",  # the maximum
]
TIMES = [f"12:34:56{f}" for f in FRACTIONS] + [
    "00:00:00",
    "00:00:00.000001",
    "23:59:59.999999",
    "24:00:00",
]
TIMETZS = [f"01:02:03{f}+05:30" for f in FRACTIONS] + [
    "00:00:00+00",
    "12:00:00-03:30:15",  # seconds offsets exist for LMT-era zones
    "12:00:00+00:00:01",
    "12:00:00-00:00:01",
    "23:59:59.999999+15:59:59",
    "00:00:00-15:59:59",
    "24:00:00+14",
    "24:00:00-12:45",
]
TIMESTAMPS = [f"2000-02-29 12:34:56{f}" for f in FRACTIONS] + [
    "-infinity",
    "infinity",
    "4714-11-24 00:00:00 BC",  # the minimum
    "0044-03-15 12:30:00.5 BC",
    "0001-12-31 23:59:59.999999 BC",
    "0001-01-01 00:00:00",
    "1969-12-31 23:59:59.5",
    "1999-12-31 23:59:59.999999",
    "2000-01-01 00:00:00",
    "2000-01-01 00:00:00.000001",
    "9999-12-31 23:59:59.999999",
    "10000-01-01 00:00:00",
    "294276-12-31 23:59:59.999999",  # the maximum
]
TIMESTAMPTZS = [f"{v}+00" if "inf" not in v and "BC" not in v else v for v in TIMESTAMPS] + [
    "0044-03-15 12:30:00.5+00 BC",
    "2000-01-01 00:00:00+05:30",  # stored in UTC, streamed as 1999-12-31 18:30:00+00
    "0001-01-01 00:30:00+01",  # 1 BC in UTC
    "9999-12-31 23:30:00-01",  # 10000 in UTC
    "294276-12-31 23:59:59.999999+00",
]
INTERVALS = [
    "0",
    "1 year 2 mons 3 days 04:05:06.789",
    "1 mon",
    "1 day",
    "1 year",
    "-1 days +02:03:00",
    "1 mon -1 days",
    "-1 years -2 mons +3 days -04:05:06",
    "1 day -00:00:00.000001",
    "-00:00:00.000001",
    "12 years 13 mons",
    "-7 mons",
    "1000000 hours",
    "-2147483648 days",
    "2147483647 days",
    "-2147483648 mons",
    "2147483647 mons",
] + [f"00:00:01{f}" for f in FRACTIONS]
INTERVALS_BEFORE_17 = [
    # All three fields at their limits: finite before 17, the infinities from 17 on.
    "2147483647 mons 2147483647 days 9223372036854775807 microseconds",
    "-2147483648 mons -2147483648 days -9223372036854775808 microseconds",
]
INTERVALS_FROM_17 = [
    "infinity",
    "-infinity",
    "2147483647 mons 2147483647 days 9223372036854775806 microseconds",
    "-2147483648 mons -2147483648 days -9223372036854775807 microseconds",
    "2147483647 mons 2147483647 days",
]


def edge_values(type_name: str, version: int) -> list[str]:
    if type_name == "interval":
        return INTERVALS + (INTERVALS_FROM_17 if version >= 17 else INTERVALS_BEFORE_17)
    return {
        "date": DATES,
        "time": TIMES,
        "timetz": TIMETZS,
        "timestamp": TIMESTAMPS,
        "timestamptz": TIMESTAMPTZS,
    }[type_name]


@pytest.fixture
def session(pg: Database) -> Iterator[psycopg.Connection[Any]]:
    """A connection with the settings pgcdc pins on the walsender, so ::text is comparable."""
    with pg.connect() as conn:
        conn.execute("SET DateStyle = ISO")
        conn.execute("SET IntervalStyle = postgres")
        conn.execute("SET TimeZone = 'UTC'")
        yield conn


def same(a: Any, b: Any) -> bool:
    """Equal, of the same type, and (for datetimes and times) with the same offset."""
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, datetime | time):
        return a.utcoffset() == b.utcoffset()
    return True


def psycopg_value(session: psycopg.Connection[Any], row_id: int) -> Any:
    """psycopg's value of row `row_id`, or None where it cannot load one (infinity, BC, …)."""
    try:
        return session.execute("SELECT x FROM v WHERE id = %s", (row_id,)).fetchone()[0]
    except psycopg.DataError:
        return None


@pytest.mark.parametrize("type_name", list(TYPES))
def test_edge_values_equal_the_servers(
    pg: Database, session: psycopg.Connection[Any], type_name: str
) -> None:
    layout, fields = TYPES[type_name]
    values = edge_values(type_name, pg.version)
    pg.execute(f"CREATE TABLE v (id int, x {type_name})")
    rows = ", ".join(f"({i}, '{value}')" for i, value in enumerate(values))
    insert = f"INSERT INTO v VALUES {rows}, (-1, NULL)"
    streamed = {}
    for binary in (False, True):
        got = stream_inserts(pg, "v", binary=binary, insert=insert)
        streamed[binary] = {row[0]: row[1] for row in got}
        pg.execute("TRUNCATE v")
    pg.execute(insert)
    oracle = session.execute(
        f"SELECT id, x::text, {type_name}_send(x) FROM v WHERE id >= 0 ORDER BY id"
    ).fetchall()
    assert len(oracle) == len(values)
    assert streamed[False][-1] is None and streamed[True][-1] is None
    unpack = struct.Struct(layout).unpack
    compared = 0
    for row_id, text, sent in oracle:
        loaded = psycopg_value(session, row_id)
        from_text, from_binary = streamed[False][row_id], streamed[True][row_id]
        context = f"{type_name} {values[row_id]!r} (server text {text!r})"
        assert same(from_text, from_binary), context
        assert fields(from_text) == unpack(sent), context
        special = isinstance(from_text, PgDate | PgTimestamp | PgTime | Infinity | Interval)
        # Before 17, an interval with every field at its limit is finite and prints as such.
        if special and not (pg.version < 17 and getattr(from_text, "is_infinite", False)):
            assert str(from_text) == text, context
        if isinstance(from_text, date | time) and loaded is not None:
            assert from_text == loaded, context
            if isinstance(from_text, datetime | time):
                assert from_text.utcoffset() == loaded.utcoffset(), context
            compared += 1
        # psycopg folds months into days, and loads PostgreSQL 17's infinity as 0; past
        # timedelta's ±999999999 days neither it nor to_timedelta has a value.
        if (
            isinstance(from_text, Interval)
            and from_text.months == 0
            and loaded is not None
            and text != "infinity"
        ):
            assert from_text.to_timedelta() == loaded, context
            compared += 1
    assert compared >= len(values) // 2, "psycopg loaded too few values to compare"
    assert "b" in kinds_sent(pg, "v", "INSERT INTO v VALUES (0, NULL)", binary=True)


def test_python_types_where_possible(pg: Database) -> None:
    """A sample of the edge values: Python types inside datetime's range, special ones outside."""
    pg.execute("CREATE TABLE v (id int, d date, ts timestamp, tz timestamptz, t time, z timetz)")
    insert = """INSERT INTO v VALUES
        (1, '2000-01-01', '2000-01-01 00:00:00', '2000-01-01 00:00:00+00', '00:00:00',
         '24:00:00+05:30'),
        (2, '10000-01-01', '0001-01-01 00:00:00 BC', 'infinity', '24:00:00', '12:00:00-03:30:15')"""
    for binary in (False, True):
        (first, second) = stream_inserts(pg, "v", binary=binary, insert=insert)
        pg.execute("TRUNCATE v")
        assert first[1:] == (
            date(2000, 1, 1),
            datetime(2000, 1, 1),
            datetime(2000, 1, 1, tzinfo=UTC),
            time(0, 0),
            PgTime(86_400_000_000, 5 * 3600 + 30 * 60),
        )
        assert first[3].tzinfo is UTC
        assert second[1] == PgDate(days_from_civil(10000, 1, 1))
        assert second[2] == PgTimestamp(days_from_civil(0, 1, 1) * 86_400_000_000)
        assert second[3] is INFINITY
        assert second[4] == PgTime(86_400_000_000)
        assert second[5] == time(12, tzinfo=timezone(-timedelta(hours=3, minutes=30, seconds=15)))


# --- random values through the server -------------------------------------------------------

MIN_TIMESTAMP = -211813488000000000  # 4714-11-24 00:00:00 BC
END_TIMESTAMP = 9223371331200000000  # 294277-01-01 00:00:00
MIN_DATE, END_DATE = -2451545, 2145031949

HYPOTHESIS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def check_round_trip(type_name: str, text: str, sent: bytes) -> Any:
    """Decode the server's text and send bytes; both must agree and match the send integers."""
    codec = DEFAULT_REGISTRY.get(OIDS[type_name])
    layout, fields = TYPES[type_name]
    from_text = codec.decode(TEXT, text.encode())
    from_binary = codec.decode(BINARY, sent)
    assert same(from_text, from_binary), text
    assert fields(from_text) == struct.unpack(layout, sent), text
    if not isinstance(from_text, date | time):
        assert str(from_text) == text
    return from_text


@HYPOTHESIS
@given(
    us=st.one_of(
        st.integers(MIN_TIMESTAMP, END_TIMESTAMP - 1),
        st.integers(-(10**16), 10**16),  # mostly inside datetime's range
    ),
    tz=st.booleans(),
)
def test_random_timestamps(session: psycopg.Connection[Any], us: int, tz: bool) -> None:
    type_name = "timestamptz" if tz else "timestamp"
    text, sent = session.execute(
        f"SELECT x::text, {type_name}_send(x) FROM (SELECT '2000-01-01 00:00:00'::{type_name}"
        " + (%s || ' microseconds')::interval AS x) s",
        (str(us),),
    ).fetchone()
    assert timestamp_fields(check_round_trip(type_name, text, sent)) == (us,)


@HYPOTHESIS
@given(days=st.integers(MIN_DATE, END_DATE - 1))
def test_random_dates(session: psycopg.Connection[Any], days: int) -> None:
    text, sent = session.execute(
        "SELECT x::text, date_send(x) FROM (SELECT '2000-01-01'::date + %s AS x) s", (days,)
    ).fetchone()
    assert date_fields(check_round_trip("date", text, sent)) == (days,)


@HYPOTHESIS
@given(
    months=st.integers(INT32_MIN + 1, INT32_MAX - 1),
    days=st.integers(INT32_MIN + 1, INT32_MAX - 1),
    us=st.one_of(st.integers(INT64_MIN + 1, INT64_MAX - 1), st.integers(-(10**11), 10**11)),
)
def test_random_intervals(
    session: psycopg.Connection[Any], months: int, days: int, us: int
) -> None:
    text, sent = session.execute(
        "SELECT x::text, interval_send(x) FROM (SELECT make_interval(months => %s, days => %s)"
        " + (%s || ' microseconds')::interval AS x) s",
        (months, days, str(us)),
    ).fetchone()
    assert check_round_trip("interval", text, sent) == Interval(months, days, us)


@HYPOTHESIS
@given(
    us=st.integers(0, 86_400_000_000),
    offset=st.integers(-(16 * 3600) + 1, 16 * 3600 - 1),
)
def test_random_timetz(session: psycopg.Connection[Any], us: int, offset: int) -> None:
    # timetz has no arithmetic that reaches 24:00:00, so build the literal (checked by the
    # send bytes, which the server computes from its own parse).
    seconds, fraction = divmod(us, 1_000_000)
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{fraction:06d}"
    sign = "-" if offset < 0 else "+"
    h, r = divmod(abs(offset), 3600)
    literal = f"{clock}{sign}{h:02d}:{r // 60:02d}:{r % 60:02d}"
    text, sent = session.execute(
        "SELECT x::text, timetz_send(x) FROM (SELECT %s::timetz AS x) s", (literal,)
    ).fetchone()
    assert time_fields(check_round_trip("timetz", text, sent)) == (us, -offset)


# --- units: classes and error paths ---------------------------------------------------------


def decode(type_name: str, kind: int, data: bytes) -> Any:
    return DEFAULT_REGISTRY.get(OIDS[type_name]).decode(kind, data)


@pytest.mark.parametrize(
    ("type_name", "data"),
    [
        ("date", b""),
        ("date", b"2026-13-01"),
        ("date", b"2026-02-29"),
        ("date", b"2026-1-01"),
        ("date", b"0000-01-01 BC"),
        ("date", b"99999999-01-01"),
        ("date", b"2026-W01-1"),
        ("date", b"yesterday"),
        ("time", b"25:00:00"),
        ("time", b"24:00:00.000001"),
        ("time", b"12:60:00"),
        ("time", b"12:00"),
        ("time", b"12:00:00.1234567"),
        ("timetz", b"12:00:00"),
        ("timetz", b"12:00:00+05:3"),
        ("timestamp", b"2026-01-01T00:00:00"),
        ("timestamp", b"2026-01-01 24:00:00"),
        ("timestamp", b"2026-01-01 00:00:00.5 AD"),
        ("timestamp", b"2026-02-30 00:00:00"),
        ("timestamp", b"294277-01-01 00:00:00"),
        ("timestamptz", b"2026-01-01 00:00:00"),
        ("timestamptz", b"4714-11-23 23:59:59+00 BC"),
        ("interval", b""),
        ("interval", b"1 fortnight"),
        ("interval", b"1 day 2"),
        ("interval", b"1:2:3"),
        ("interval", b"00:00:00 1 day"),
        ("interval", b"2147483648 days"),
        ("interval", b"-2562047788:00:54.775809"),
        ("interval", b"2562047788:00:54.775808"),
    ],
)
def test_bad_text(type_name: str, data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        decode(type_name, TEXT, data)


@pytest.mark.parametrize(
    ("type_name", "data"),
    [
        ("date", b"\x00\x00\x00"),
        ("time", b"\x00" * 4),
        ("time", struct.pack(">q", -1)),
        ("time", struct.pack(">q", 86_400_000_001)),
        ("timetz", b"\x00" * 8),
        ("timetz", struct.pack(">qi", 0, 16 * 3600)),
        ("timestamp", b"\x00" * 9),
        ("timestamptz", b""),
        ("interval", b"\x00" * 12),
    ],
)
def test_bad_binary(type_name: str, data: bytes) -> None:
    with pytest.raises(ValueDecodeError):
        decode(type_name, BINARY, data)


def test_infinities_carry_the_servers_integers() -> None:
    assert decode("date", BINARY, struct.pack(">i", INT32_MAX)) is INFINITY
    assert decode("date", BINARY, struct.pack(">i", INT32_MIN)) is NEG_INFINITY
    assert decode("timestamptz", BINARY, struct.pack(">q", INT64_MIN)) is NEG_INFINITY
    assert (INFINITY.days, INFINITY.microseconds) == (INT32_MAX, INT64_MAX)
    assert (NEG_INFINITY.days, NEG_INFINITY.microseconds) == (INT32_MIN, INT64_MIN)
    assert str(INFINITY) == "infinity" and str(NEG_INFINITY) == "-infinity"
    assert decode("interval", TEXT, b"-infinity") == Interval(INT32_MIN, INT32_MIN, INT64_MIN)
    assert decode("interval", TEXT, b"-infinity").is_infinite


def test_interval() -> None:
    value = Interval(14, 3, 14_706_789_000)
    assert decode("interval", TEXT, b"1 year 2 mons 3 days 04:05:06.789") == value
    assert str(Interval(-1, 1, -1)) == "-1 mons +1 day -00:00:00.000001"
    assert str(Interval(0, 0, 0)) == "00:00:00"
    assert Interval(0, -1, 7_380_000_000).to_timedelta() == timedelta(days=-1, hours=2, minutes=3)
    with pytest.raises(ValueError):
        Interval(1, 0, 0).to_timedelta()
    with pytest.raises(ValueError):
        Interval(INT32_MAX, INT32_MAX, INT64_MAX).to_timedelta()
    with pytest.raises(OverflowError):
        Interval(0, INT32_MIN, 0).to_timedelta()
    with pytest.raises(AttributeError):
        value.months = 2  # type: ignore[misc]


def test_special_classes_print_like_the_server() -> None:
    assert str(PgDate(days_from_civil(-43, 3, 15))) == "0044-03-15 BC"
    assert PgDate(days_from_civil(-43, 3, 15)).ymd() == (-43, 3, 15)
    assert str(PgTimestamp(-1, tz=True)) == "1999-12-31 23:59:59.999999+00"
    assert str(PgTime(86_400_000_000, -(3 * 3600 + 30 * 60 + 15))) == "24:00:00-03:30:15"
    assert str(PgTime(86_400_000_000)) == "24:00:00"


@given(st.integers(MIN_DATE - 1000, END_DATE + 1000))
def test_civil_calendar_round_trips(days: int) -> None:
    assert days_from_civil(*civil_from_days(days)) == days
    year, month, day = civil_from_days(days)
    if 1 <= year <= 9999:
        assert date(year, month, day) == date(2000, 1, 1) + timedelta(days=days)
