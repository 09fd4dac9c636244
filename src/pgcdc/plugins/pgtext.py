"""The server's text formatting that more than one built-in plugin reproduces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["timestamptz_to_str"]

_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_DT_NOBEGIN = -(2**63)
_DT_NOEND = 2**63 - 1


def timestamptz_to_str(timestamp: int | None) -> str:
    """The server's ``timestamptz_to_str`` in a UTC session: ISO, trailing zeros of the
    fraction trimmed, ``+00``. `timestamp` is microseconds since 2000-01-01 UTC."""
    if timestamp is None:
        return "(null)"
    if timestamp == _DT_NOBEGIN:
        return "-infinity"
    if timestamp == _DT_NOEND:
        return "infinity"
    try:
        moment = _PG_EPOCH + timedelta(microseconds=timestamp)
    except OverflowError:
        return "(timestamp out of range)"
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.year < 1000:  # strftime's %Y does not pad everywhere; the server pads to 4
        text = f"{moment.year:04d}" + text[text.index("-") :]
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "+00"
