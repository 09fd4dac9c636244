"""Exact Python values for PostgreSQL temporal data that the `datetime` module cannot hold.

PostgreSQL dates run from 4714-11-24 BC to 5874897-12-31, timestamps to 294276-12-31, times to
24:00:00, and every date and timestamp type has ``infinity`` and ``-infinity``; `datetime` stops
at years 1..9999 and 23:59:59.999999. Rather than clamp or fail, the decoders return the classes
here, each keeping the exact integer the server stores (and sends in binary), so that a later
conversion (Arrow date32, timestamp[us], month_day_nano) is lossless.

`Interval` is used for every interval: months, days and microseconds are separate quantities in
PostgreSQL (a month is not 30 days, a day is not 24 hours across DST), so they are never folded.

Calendar arithmetic uses the proleptic Gregorian calendar with astronomical year numbering
(year 0 is 1 BC), which is what PostgreSQL's ``date2j``/``j2date`` implement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

__all__ = [
    "INFINITY",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "NEG_INFINITY",
    "USECS_PER_DAY",
    "Infinity",
    "Interval",
    "PgDate",
    "PgTime",
    "PgTimestamp",
    "civil_from_days",
    "days_from_civil",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

USECS_PER_SEC = 1_000_000
USECS_PER_MINUTE = 60 * USECS_PER_SEC
USECS_PER_HOUR = 60 * USECS_PER_MINUTE
USECS_PER_DAY = 24 * USECS_PER_HOUR

#: Days from 0000-03-01 (the start of Hinnant's era arithmetic) to 2000-01-01.
_EPOCH_SHIFT = 719468 + 10957


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 2000-01-01 of a proleptic Gregorian date (astronomical `year`: 0 is 1 BC).

    H. Hinnant's branch-light algorithm; Python's floor division makes it valid for any year.
    """
    if month <= 2:
        year -= 1
        month += 9
    else:
        month -= 3
    era = year // 400
    yoe = year - era * 400
    doy = (153 * month + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - _EPOCH_SHIFT


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(astronomical year, month, day) of `days` since 2000-01-01; inverse of days_from_civil."""
    z = days + _EPOCH_SHIFT
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _iso_date(days: int) -> tuple[str, bool]:
    """The server's ISO date text (without " BC") and whether the year is BC."""
    year, month, day = civil_from_days(days)
    bc = year <= 0
    return f"{1 - year if bc else year:04d}-{month:02d}-{day:02d}", bc


def _seconds_text(seconds: int, fraction: int) -> str:
    """``SS[.ffffff]`` with trailing zeros trimmed, as the server's AppendSeconds writes it."""
    if fraction:
        return f"{seconds:02d}.{fraction:06d}".rstrip("0")
    return f"{seconds:02d}"


def _clock_text(microseconds: int) -> str:
    """``HH:MM:SS[.ffffff]`` of a non-negative count of microseconds (hours may pass 23)."""
    seconds, fraction = divmod(microseconds, USECS_PER_SEC)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{_seconds_text(seconds, fraction)}"


def _offset_text(offset: int) -> str:
    """An ISO UTC offset (seconds east) the way the server's EncodeTimezone writes it."""
    sign = "-" if offset < 0 else "+"
    minutes, seconds = divmod(abs(offset), 60)
    hours, minutes = divmod(minutes, 60)
    if seconds:
        return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    if minutes:
        return f"{sign}{hours:02d}:{minutes:02d}"
    return f"{sign}{hours:02d}"


class Infinity(Enum):
    """``infinity`` / ``-infinity`` of date, timestamp and timestamptz.

    One pair of singletons serves every type because the value means the same thing for all of
    them; the type-specific integer the server stores is `days` (date, int32) or
    `microseconds` (timestamp and timestamptz, int64).
    """

    NEGATIVE = -1
    POSITIVE = 1

    @property
    def days(self) -> int:
        """The date value: DATEVAL_NOBEGIN (INT32_MIN) or DATEVAL_NOEND (INT32_MAX)."""
        return INT32_MAX if self is Infinity.POSITIVE else INT32_MIN

    @property
    def microseconds(self) -> int:
        """The timestamp value: DT_NOBEGIN (INT64_MIN) or DT_NOEND (INT64_MAX)."""
        return INT64_MAX if self is Infinity.POSITIVE else INT64_MIN

    def __str__(self) -> str:
        return "infinity" if self is Infinity.POSITIVE else "-infinity"


INFINITY = Infinity.POSITIVE
NEG_INFINITY = Infinity.NEGATIVE


@dataclass(frozen=True, slots=True, order=True)
class PgDate:
    """A finite date outside `datetime.date`'s range (BC, or after 9999): days since 2000-01-01,
    exactly the server's DateADT (and Arrow's date32 after adding 10957)."""

    days: int

    def ymd(self) -> tuple[int, int, int]:
        """(year, month, day) with astronomical years: 0 is 1 BC, -1 is 2 BC."""
        return civil_from_days(self.days)

    def __str__(self) -> str:
        """The server's text (DateStyle ISO), e.g. ``0044-03-15 BC`` or ``10000-01-01``."""
        text, bc = _iso_date(self.days)
        return text + " BC" if bc else text


@dataclass(frozen=True, slots=True, order=True)
class PgTimestamp:
    """A finite timestamp outside `datetime.datetime`'s range: microseconds since
    2000-01-01 00:00 (UTC when `tz`), exactly the server's int64 Timestamp."""

    microseconds: int
    tz: bool = False

    def __str__(self) -> str:
        """The server's text (DateStyle ISO, TimeZone UTC), e.g. ``0001-01-01 00:00:00+00 BC``."""
        days, clock = divmod(self.microseconds, USECS_PER_DAY)
        text, bc = _iso_date(days)
        text = f"{text} {_clock_text(clock)}"
        if self.tz:
            text += "+00"
        return text + " BC" if bc else text


@dataclass(frozen=True, slots=True)
class PgTime:
    """A time of day `datetime.time` cannot hold, in practice only 24:00:00 (which time and
    timetz accept): microseconds since midnight, plus for timetz the UTC `offset` in seconds
    east (ISO sign; the binary form stores seconds west)."""

    microseconds: int
    offset: int | None = None

    def __str__(self) -> str:
        text = _clock_text(self.microseconds)
        return text if self.offset is None else text + _offset_text(self.offset)


@dataclass(frozen=True, slots=True)
class Interval:
    """A PostgreSQL interval: months, days and microseconds, kept apart as the server keeps them.

    Equality is field-wise (``1 mon`` != ``30 days`` here, unlike the server's ``=``), because
    the fields are what is stored and sent. PostgreSQL 17+ ``infinity`` / ``-infinity`` are all
    three fields at their maximum / minimum (see `is_infinite`).
    """

    months: int
    days: int
    microseconds: int

    @property
    def is_infinite(self) -> bool:
        """Whether this is PostgreSQL 17+'s ``infinity`` or ``-infinity`` interval.

        (Before 17 the same fields were an ordinary, finite interval.)
        """
        return (self.months, self.days, self.microseconds) in _INFINITE_FIELDS

    def to_timedelta(self) -> timedelta:
        """The interval as a `timedelta`; only without months, whose length depends on the date
        the interval is added to (ValueError). OverflowError past timedelta's ±999999999 days."""
        if self.months or self.is_infinite:
            raise ValueError(f"interval {self} has months; it has no fixed timedelta")
        return timedelta(days=self.days, microseconds=self.microseconds)

    def __str__(self) -> str:
        """The server's text with IntervalStyle ``postgres`` (EncodeInterval)."""
        if self.is_infinite:
            return "infinity" if self.months > 0 else "-infinity"
        # C division truncates towards zero: years and months share the sign of `months`,
        # and hours, minutes, seconds and fraction share the sign of `microseconds`.
        years = abs(self.months) // 12
        months = abs(self.months) - years * 12
        if self.months < 0:
            years, months = -years, -months
        parts: list[str] = []
        is_before = False
        for value, unit in ((years, "year"), (months, "mon"), (self.days, "day")):
            if value:
                plus = "+" if is_before and value > 0 else ""
                parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
                is_before = value < 0
        if not parts or self.microseconds:
            sign = "-" if self.microseconds < 0 else ("+" if is_before else "")
            parts.append(sign + _clock_text(abs(self.microseconds)))
        return " ".join(parts)


_INFINITE_FIELDS = ((INT32_MAX, INT32_MAX, INT64_MAX), (INT32_MIN, INT32_MIN, INT64_MIN))
