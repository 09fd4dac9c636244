"""date, time, timetz, timestamp, timestamptz and interval, from text and from binary.

Text is the output functions' form under the session settings pgcdc pins (DateStyle ISO,
IntervalStyle postgres, TimeZone UTC): ``2026-11-22``, ``0044-03-15 BC``, ``10000-01-01``,
``02:04:50.2+05:30``, ``2026-11-22 02:04:50.200254+00``, ``-1 days +02:03:00``, ``infinity``.
Binary is the send functions' form: int32 days (date), int64 microseconds (time, timestamp,
timestamptz; since 2000-01-01 for the latter two), int64 + int32 zone in seconds *west* (timetz),
int64 microseconds + int32 days + int32 months (interval).

Both forms decode to the same value. Values Python's `datetime` can hold come back as `date`,
`time` and `datetime` (naive for timestamp, UTC for timestamptz, a fixed offset for timetz);
the rest as the exact classes of `pgcdc.types.values`: `PgDate`, `PgTimestamp`, `PgTime`
(24:00:00) and `Infinity`. Intervals are always `Interval`.

Speed: the common text case (a four-digit year, no BC) goes through `fromisoformat`, which is
C code and several times faster than slicing and ``int()`` in Python; the separators are
checked first so its extra leniency (week dates, ``T``, missing seconds) never applies. The
rare forms take a slower path through integer arithmetic that is shared with the binary parser,
which is what keeps the two forms in exact agreement.
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, time, timedelta, timezone

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register
from pgcdc.types.values import (
    INFINITY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NEG_INFINITY,
    USECS_PER_DAY,
    Infinity,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    days_from_civil,
)

__all__ = [
    "date_from_days",
    "time_from_microseconds",
    "timestamp_from_microseconds",
    "timestamptz_from_microseconds",
]

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_TIMETZ = struct.Struct(">qi")
_INTERVAL = struct.Struct(">qii")

_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()  # 730120
_MAX_ORDINAL = date.max.toordinal()
_EPOCH = datetime(2000, 1, 1)
_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)
#: The microseconds (since 2000-01-01) `datetime` can hold: 0001-01-01 .. 9999-12-31 23:59:59.9…
_MIN_PY_US = (1 - _EPOCH_ORDINAL) * USECS_PER_DAY
_MAX_PY_US = (_MAX_ORDINAL + 1 - _EPOCH_ORDINAL) * USECS_PER_DAY - 1
#: The server's range: Julian day 0 (4714-11-24 BC) up to, not including, the first day past
#: the maximum (5874898-01-01 for date, 294277-01-01 for timestamp).
_MIN_DAYS = -2451545
_END_DAYS = 2147483494 - 2451545
_MIN_TIMESTAMP = _MIN_DAYS * USECS_PER_DAY
_END_TIMESTAMP = (109203528 - 2451545) * USECS_PER_DAY
#: timetz zones are limited to 15:59:59 either way (TZDISP_LIMIT).
_TZDISP_LIMIT = 16 * 3600

_INTERVAL_INFINITY = Interval(INT32_MAX, INT32_MAX, INT64_MAX)
_INTERVAL_NEG_INFINITY = Interval(INT32_MIN, INT32_MIN, INT64_MIN)
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# Byte values of the separators checked before trusting fromisoformat.
_DASH, _PLUS, _COLON, _DOT, _SPACE, _C = 0x2D, 0x2B, 0x3A, 0x2E, 0x20, 0x43
#: Microseconds per unit of the last digit of a 1..6-digit fraction of a second.
_FRACTION_SCALE = (0, 100000, 10000, 1000, 100, 10, 1)


# --- from the integers the server stores ---------------------------------------------------


def date_from_days(days: int) -> date | PgDate | Infinity:
    """The value of a DateADT (days since 2000-01-01)."""
    ordinal = days + _EPOCH_ORDINAL
    if 1 <= ordinal <= _MAX_ORDINAL:
        return date.fromordinal(ordinal)
    if days == INT32_MAX:
        return INFINITY
    if days == INT32_MIN:
        return NEG_INFINITY
    return PgDate(days)


def timestamp_from_microseconds(us: int) -> datetime | PgTimestamp | Infinity:
    """The value of a timestamp (microseconds since 2000-01-01 00:00), naive."""
    if _MIN_PY_US <= us <= _MAX_PY_US:
        return _EPOCH + timedelta(0, 0, us)
    return _timestamp_special(us, False)


def timestamptz_from_microseconds(us: int) -> datetime | PgTimestamp | Infinity:
    """The value of a timestamptz (microseconds since 2000-01-01 00:00 UTC), in UTC."""
    if _MIN_PY_US <= us <= _MAX_PY_US:
        return _EPOCH_UTC + timedelta(0, 0, us)
    return _timestamp_special(us, True)


def _timestamp_special(us: int, tz: bool) -> PgTimestamp | Infinity:
    if us == INT64_MAX:
        return INFINITY
    if us == INT64_MIN:
        return NEG_INFINITY
    return PgTimestamp(us, tz)


_TZ_CACHE: dict[int, timezone] = {}


def _tzinfo(offset: int) -> timezone:
    """A shared fixed-offset tzinfo (seconds east), so a column of timetz does not allocate one
    per value."""
    tz = _TZ_CACHE.get(offset)
    if tz is None:
        tz = _TZ_CACHE.setdefault(offset, timezone(timedelta(seconds=offset)))
    return tz


def time_from_microseconds(us: int, offset: int | None = None) -> time | PgTime:
    """A time of day (microseconds since midnight, 0 .. 24:00:00) with, for timetz, its UTC
    offset in seconds east."""
    if not 0 <= us <= USECS_PER_DAY:
        raise ValueDecodeError(f"time {us} µs is outside 00:00:00 .. 24:00:00")
    if us == USECS_PER_DAY:
        return PgTime(us, offset)
    seconds, micro = divmod(us, 1_000_000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if offset is None:
        return time(hours, minutes, seconds, micro)
    return time(hours, minutes, seconds, micro, _tzinfo(offset))


# --- binary ------------------------------------------------------------------------------


def _date_binary(data: bytes) -> date | PgDate | Infinity:
    try:
        (days,) = _I32.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"date binary needs 4 bytes, got {len(data)}") from None
    return date_from_days(days)


def _time_binary(data: bytes) -> time | PgTime:
    try:
        (us,) = _I64.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"time binary needs 8 bytes, got {len(data)}") from None
    return time_from_microseconds(us)


def _timetz_binary(data: bytes) -> time | PgTime:
    try:
        us, zone = _TIMETZ.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"timetz binary needs 12 bytes, got {len(data)}") from None
    if not -_TZDISP_LIMIT < zone < _TZDISP_LIMIT:
        raise ValueDecodeError(f"timetz zone {zone} s is out of range")
    return time_from_microseconds(us, -zone)


def _timestamp_binary(data: bytes) -> datetime | PgTimestamp | Infinity:
    try:
        (us,) = _I64.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"timestamp binary needs 8 bytes, got {len(data)}") from None
    if _MIN_PY_US <= us <= _MAX_PY_US:
        return _EPOCH + timedelta(0, 0, us)
    return _timestamp_special(us, False)


def _timestamptz_binary(data: bytes) -> datetime | PgTimestamp | Infinity:
    try:
        (us,) = _I64.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"timestamptz binary needs 8 bytes, got {len(data)}") from None
    if _MIN_PY_US <= us <= _MAX_PY_US:
        return _EPOCH_UTC + timedelta(0, 0, us)
    return _timestamp_special(us, True)


def _interval_binary(data: bytes) -> Interval:
    try:
        us, days, months = _INTERVAL.unpack(data)
    except struct.error:
        raise ValueDecodeError(f"interval binary needs 16 bytes, got {len(data)}") from None
    return Interval(months, days, us)


# --- text: pieces --------------------------------------------------------------------------


def _bad(what: str, data: bytes) -> ValueDecodeError:
    return ValueDecodeError(f"invalid {what} text {data!r}")


def _days_of(text: bytes, bc: bool, what: str, data: bytes) -> int:
    """Days since 2000-01-01 of ``YYYY[Y…]-MM-DD`` (a BC year when `bc`)."""
    parts = text.split(b"-")
    if len(parts) != 3:
        raise _bad(what, data)
    year_text, month_text, day_text = parts
    if not (
        len(year_text) >= 4
        and len(month_text) == 2
        and len(day_text) == 2
        and year_text.isdigit()
        and month_text.isdigit()
        and day_text.isdigit()
    ):
        raise _bad(what, data)
    year, month, day = int(year_text), int(month_text), int(day_text)
    if bc:
        if year == 0:
            raise _bad(what, data)
        year = 1 - year  # astronomical numbering: 1 BC is year 0
    if not 1 <= month <= 12 or day < 1:
        raise _bad(what, data)
    last = _DAYS_IN_MONTH[month]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        last = 29
    if day > last:
        raise _bad(what, data)
    return days_from_civil(year, month, day)


def _clock_of(text: bytes, what: str, data: bytes) -> int:
    """Microseconds of ``HH:MM:SS[.f…]`` (hours not range-checked here)."""
    n = len(text)
    if n < 8 or text[2] != _COLON or text[5] != _COLON:
        raise _bad(what, data)
    hh, mm, ss = text[0:2], text[3:5], text[6:8]
    if not (hh.isdigit() and mm.isdigit() and ss.isdigit()):
        raise _bad(what, data)
    fraction = 0
    if n > 8:
        digits = text[9:]
        if text[8] != _DOT or not 1 <= len(digits) <= 6 or not digits.isdigit():
            raise _bad(what, data)
        fraction = int(digits) * _FRACTION_SCALE[len(digits)]
    minutes, seconds = int(mm), int(ss)
    if minutes > 59 or seconds > 59:
        raise _bad(what, data)
    return ((int(hh) * 60 + minutes) * 60 + seconds) * 1_000_000 + fraction


def _offset_of(text: bytes, what: str, data: bytes) -> int:
    """Seconds east of ``+HH[:MM[:SS]]`` / ``-HH[:MM[:SS]]``."""
    fields = text[1:].split(b":")
    if (
        text[:1] not in (b"+", b"-")
        or len(fields) > 3
        or not all(len(f) == 2 and f.isdigit() for f in fields)
    ):
        raise _bad(what, data)
    hours, minutes, seconds = (int(f) for f in (*fields, b"0", b"0")[:3])
    if minutes > 59 or seconds > 59:
        raise _bad(what, data)
    offset = (hours * 60 + minutes) * 60 + seconds
    if offset >= _TZDISP_LIMIT:
        raise _bad(what, data)
    return -offset if text[0] == _DASH else offset


def _split_offset(text: bytes, what: str, data: bytes) -> tuple[bytes, int]:
    """``clock`` and the offset (seconds east) of ``clock±HH[:MM[:SS]]``."""
    at = text.find(b"+", 8)
    if at < 0:
        at = text.find(b"-", 8)
        if at < 0:
            raise _bad(what, data)
    return text[:at], _offset_of(text[at:], what, data)


# --- text: types ---------------------------------------------------------------------------


def _date_text(data: bytes) -> date | PgDate | Infinity:
    if len(data) == 10 and data[4] == _DASH and data[7] == _DASH:
        try:
            return date.fromisoformat(data.decode())
        except ValueError:
            raise _bad("date", data) from None
    if data == b"infinity":
        return INFINITY
    if data == b"-infinity":
        return NEG_INFINITY
    bc = data.endswith(b" BC")
    days = _days_of(data[:-3] if bc else data, bc, "date", data)
    if not _MIN_DAYS <= days < _END_DAYS:
        raise ValueDecodeError(f"date text {data!r} is out of range")
    return date_from_days(days)


def _time_text(data: bytes) -> time | PgTime:
    n = len(data)
    if (
        (n == 8 or (10 <= n <= 15 and data[8] == _DOT))
        and data[2] == _COLON
        and data[5] == _COLON
        and data[0:2] != b"24"
    ):
        try:
            return time.fromisoformat(data.decode())
        except ValueError:
            raise _bad("time", data) from None
    return time_from_microseconds(_time_of_day(data, "time", data))


def _time_of_day(text: bytes, what: str, data: bytes) -> int:
    """Microseconds of a time of day, 00:00:00 .. 24:00:00 inclusive."""
    us = _clock_of(text, what, data)
    if us > USECS_PER_DAY:
        raise _bad(what, data)
    return us


def _timetz_text(data: bytes) -> time | PgTime:
    n = len(data)
    if n >= 11 and data[2] == _COLON and data[5] == _COLON and data[0:2] != b"24":
        try:
            value = time.fromisoformat(data.decode())
        except ValueError:
            raise _bad("timetz", data) from None
        if value.tzinfo is None:
            raise _bad("timetz", data)
        return value
    clock, offset = _split_offset(data, "timetz", data)
    return time_from_microseconds(_time_of_day(clock, "timetz", data), offset)


def _timestamp_text(data: bytes) -> datetime | PgTimestamp | Infinity:
    n = len(data)
    if (
        19 <= n <= 26
        and data[4] == _DASH
        and data[10] == _SPACE
        and data[16] == _COLON
        and (n == 19 or data[19] == _DOT)
        and data[-1] != _C
    ):
        try:
            return datetime.fromisoformat(data.decode())
        except ValueError:
            raise _bad("timestamp", data) from None
    return _timestamp_slow(data, False)


def _timestamptz_text(data: bytes) -> datetime | PgTimestamp | Infinity:
    n = len(data)
    if (
        22 <= n <= 29
        and data.endswith(b"+00")
        and data[4] == _DASH
        and data[10] == _SPACE
        and data[16] == _COLON
        and (n == 22 or data[19] == _DOT)
    ):
        try:
            return datetime.fromisoformat(data.decode())
        except ValueError:
            raise _bad("timestamptz", data) from None
    return _timestamp_slow(data, True)


def _timestamp_slow(data: bytes, tz: bool) -> datetime | PgTimestamp | Infinity:
    """BC, five-digit years, infinities and (timestamptz) offsets other than +00."""
    what = "timestamptz" if tz else "timestamp"
    if data == b"infinity":
        return INFINITY
    if data == b"-infinity":
        return NEG_INFINITY
    bc = data.endswith(b" BC")
    date_text, space, clock = (data[:-3] if bc else data).partition(b" ")
    if not space:
        raise _bad(what, data)
    offset = 0
    if tz:
        clock, offset = _split_offset(clock, what, data)
    us = _clock_of(clock, what, data)
    if us >= USECS_PER_DAY:
        raise _bad(what, data)
    us += _days_of(date_text, bc, what, data) * USECS_PER_DAY - offset * 1_000_000
    if not _MIN_TIMESTAMP <= us < _END_TIMESTAMP:
        raise ValueDecodeError(f"{what} text {data!r} is out of range")
    if tz:
        return timestamptz_from_microseconds(us)
    return timestamp_from_microseconds(us)


#: The units of IntervalStyle postgres, as months or days per unit.
_INTERVAL_UNITS: dict[bytes, tuple[int, int]] = {
    b"year": (12, 0),
    b"years": (12, 0),
    b"mon": (1, 0),
    b"mons": (1, 0),
    b"day": (0, 1),
    b"days": (0, 1),
}


def _interval_text(data: bytes) -> Interval:
    """IntervalStyle postgres: ``[N year[s]] [N mon[s]] [N day[s]] [±H…H:MM:SS[.f]]``, each
    part with its own sign; or PostgreSQL 17's ``infinity`` / ``-infinity``."""
    tokens = data.split(b" ")
    last = len(tokens) - 1
    months = days = us = 0
    i = 0
    while i <= last:
        token = tokens[i]
        if i == last:
            if token == b"infinity" and last == 0:
                return _INTERVAL_INFINITY
            if token == b"-infinity" and last == 0:
                return _INTERVAL_NEG_INFINITY
            us = _interval_clock(token, data)
            break
        unit = _INTERVAL_UNITS.get(tokens[i + 1])
        digits = token[1:] if token[:1] in (b"+", b"-") else token
        if unit is None or not digits.isdigit():
            raise _bad("interval", data)
        value = int(token)
        months += value * unit[0]
        days += value * unit[1]
        i += 2
    if not (INT32_MIN <= months <= INT32_MAX and INT32_MIN <= days <= INT32_MAX):
        raise ValueDecodeError(f"interval text {data!r} is out of range")
    return Interval(months, days, us)


def _interval_clock(token: bytes, data: bytes) -> int:
    """Microseconds of ``[+-]H…H:MM:SS[.f…]`` (hours unbounded, the total up to int64)."""
    sign = token[0] if token else 0
    parts = (token[1:] if sign in (_PLUS, _DASH) else token).split(b":")
    if len(parts) != 3:
        raise _bad("interval", data)
    hh, mm, ss = parts
    fraction = 0
    if len(ss) != 2:
        ss, dot, digits = ss.partition(b".")
        if not dot or not 1 <= len(digits) <= 6 or not digits.isdigit():
            raise _bad("interval", data)
        fraction = int(digits) * _FRACTION_SCALE[len(digits)]
    if not (
        len(hh) >= 2
        and len(mm) == 2
        and len(ss) == 2
        and hh.isdigit()
        and mm.isdigit()
        and ss.isdigit()
    ):
        raise _bad("interval", data)
    minutes, seconds = int(mm), int(ss)
    if minutes > 59 or seconds > 59:
        raise _bad("interval", data)
    us = ((int(hh) * 60 + minutes) * 60 + seconds) * 1_000_000 + fraction
    if sign == _DASH:
        us = -us
    if not INT64_MIN <= us <= INT64_MAX:
        raise ValueDecodeError(f"interval text {data!r} is out of range")
    return us


register(1082, "date", _date_text, _date_binary, array_oid=1182)
register(1083, "time", _time_text, _time_binary, array_oid=1183)
register(1266, "timetz", _timetz_text, _timetz_binary, array_oid=1270)
register(1114, "timestamp", _timestamp_text, _timestamp_binary, array_oid=1115)
register(1184, "timestamptz", _timestamptz_text, _timestamptz_binary, array_oid=1185)
register(1186, "interval", _interval_text, _interval_binary, array_oid=1187)
