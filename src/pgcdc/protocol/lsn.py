"""Log sequence numbers and PostgreSQL timestamps."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["INVALID_LSN", "PG_EPOCH", "Lsn", "datetime_to_pg_timestamp", "pg_timestamp_to_datetime"]

_LSN_RE = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_MAX = (1 << 64) - 1


class Lsn(int):
    """An XLogRecPtr: a 64-bit WAL position, written ``X/Y`` (high and low 32 bits in hex).

    An `int`, so it orders and hashes like one and packs straight into the wire format. Adding
    a byte count gives an Lsn; subtracting two Lsns gives the distance in bytes.
    """

    __slots__ = ()

    def __new__(cls, value: int | str = 0) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        return int.__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``X/Y`` as PostgreSQL prints it (``pg_lsn`` input syntax)."""
        m = _LSN_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"invalid LSN {text!r}: expected X/Y in hexadecimal, e.g. 0/16B3748")
        return int.__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        return f"{self >> 32:X}/{self & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __add__(self, other: int) -> Lsn:
        return Lsn(int(self) + int(other))

    __radd__ = __add__

    def __sub__(self, other: int) -> int:
        """Bytes between two positions, or an Lsn moved back by a byte count."""
        if isinstance(other, Lsn):
            return int(self) - int(other)
        return Lsn(int(self) - int(other))


#: PostgreSQL's InvalidXLogRecPtr: "no position" (and "resume from the slot" in START_REPLICATION).
INVALID_LSN = Lsn(0)

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def pg_timestamp_to_datetime(micros: int) -> datetime:
    """Microseconds since 2000-01-01 UTC (the wire's timestamps) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=micros)


def datetime_to_pg_timestamp(value: datetime) -> int:
    """The inverse of `pg_timestamp_to_datetime`; naive datetimes are taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
