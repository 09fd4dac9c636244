"""The server's text formatting that more than one built-in plugin reproduces."""

from __future__ import annotations

from pgcdc.types.values import INT64_MAX, INT64_MIN, USECS_PER_DAY, PgTimestamp

__all__ = ["timestamptz_to_str"]

#: Julian day number of 2000-01-01 (POSTGRES_EPOCH_JDATE): day 0 is 4714-11-24 BC.
_POSTGRES_EPOCH_JDATE = 2451545


def timestamptz_to_str(timestamp: int | None) -> str:
    """The server's ``timestamptz_to_str`` in a UTC session, for any int64: ISO whatever the
    DateStyle, trailing zeros of the fraction trimmed, ``+00``, then `` BC`` for years before 1
    (``4714-11-24 00:00:00+00 BC`` is the earliest it prints; earlier values, which no
    timestamptz input accepts, are ``(timestamp out of range)``), years past 9999 in full,
    ``infinity`` and ``-infinity``. `timestamp` is microseconds since 2000-01-01 UTC."""
    if timestamp is None:
        return "(null)"
    if timestamp == INT64_MIN:
        return "-infinity"
    if timestamp == INT64_MAX:
        return "infinity"
    if timestamp // USECS_PER_DAY + _POSTGRES_EPOCH_JDATE < 0:  # before Julian day 0
        return "(timestamp out of range)"
    return str(PgTimestamp(timestamp, tz=True))
