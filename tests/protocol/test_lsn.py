"""`Lsn` (the X/Y text form, arithmetic, ordering) and the PostgreSQL timestamp helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pgcdc.protocol import Lsn, datetime_to_pg_timestamp, pg_timestamp_to_datetime


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16/B374D848", 0x16_B374D848),
        ("0/0", 0),
        ("0/1", 1),
        ("1/0", 1 << 32),
        ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
        ("0/16B3748", 0x16B3748),
    ],
)
def test_parse_and_format(text: str, value: int) -> None:
    lsn = Lsn(text)

    assert lsn == value
    assert type(lsn) is Lsn
    assert Lsn.parse(text) == value
    assert str(lsn) == text
    assert repr(lsn) == f"Lsn('{text}')"
    assert Lsn(value) == lsn


def test_parse_accepts_lower_case_and_leading_zeros_and_prints_canonically() -> None:
    lsn = Lsn("00000016/b374d848")

    assert lsn == 0x16_B374D848
    assert str(lsn) == "16/B374D848"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "/",
        "0/",
        "/0",
        "0/0/0",
        "G/0",
        "0/-1",
        "-1/0",
        "0x1/0",
        "123456789/0",  # nine hex digits: more than 32 bits
        "0/123456789",
        "1.0/0",
        "0 /0",
        "\uff11/0",  # a full-width digit one is not hexadecimal
    ],
)
def test_invalid_text_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="invalid LSN"):
        Lsn(text)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_out_of_range_int_raises_value_error(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Lsn(value)


def test_ordering() -> None:
    lsns = [Lsn("1/0"), Lsn("0/FFFFFFFF"), Lsn("0/0"), Lsn("A/1"), Lsn("1/1")]

    assert sorted(lsns) == [Lsn("0/0"), Lsn("0/FFFFFFFF"), Lsn("1/0"), Lsn("1/1"), Lsn("A/1")]
    assert Lsn("1/0") > Lsn("0/FFFFFFFF")
    assert Lsn("0/10") < 0x11
    assert max(lsns) == Lsn("A/1")
    assert hash(Lsn("0/10")) == hash(16)


def test_add_bytes_gives_lsn() -> None:
    result = Lsn("0/FFFFFFF0") + 0x20

    assert type(result) is Lsn
    assert result == Lsn("1/10")
    assert str(result) == "1/10"

    reflected = 0x20 + Lsn("0/FFFFFFF0")
    assert type(reflected) is Lsn and reflected == Lsn("1/10")


def test_add_past_the_end_raises() -> None:
    with pytest.raises(ValueError):
        Lsn("FFFFFFFF/FFFFFFFF") + 1


def test_subtract_lsns_gives_byte_distance() -> None:
    distance = Lsn("1/10") - Lsn("0/FFFFFFF0")

    assert distance == 0x20
    assert type(distance) is int
    assert Lsn("0/0") - Lsn("0/10") == -16


def test_subtract_bytes_gives_lsn() -> None:
    result = Lsn("1/10") - 0x20

    assert type(result) is Lsn
    assert result == Lsn("0/FFFFFFF0")


# -- timestamps ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("micros", "expected"),
    [
        (0, datetime(2000, 1, 1, tzinfo=UTC)),
        (1, datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
        (-1, datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        (
            767_795_696_789_012,
            datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=767_795_696_789_012),
        ),
        (86_400_000_000 * 366, datetime(2001, 1, 1, tzinfo=UTC)),  # 2000 was a leap year
    ],
)
def test_pg_timestamp_round_trip(micros: int, expected: datetime) -> None:
    value = pg_timestamp_to_datetime(micros)

    assert value == expected
    assert value.utcoffset() == timedelta(0)
    assert datetime_to_pg_timestamp(value) == micros


def test_datetime_to_pg_timestamp_handles_naive_and_other_zones() -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    aware = datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    expected = (datetime(2024, 5, 1, 12, 0, tzinfo=UTC) - datetime(2000, 1, 1, tzinfo=UTC)) // (
        timedelta(microseconds=1)
    )

    assert datetime_to_pg_timestamp(naive) == expected
    assert datetime_to_pg_timestamp(aware) == expected
    assert pg_timestamp_to_datetime(expected) == aware
