"""Fixed-size identifiers: ``uuid`` (to `uuid.UUID`) and ``pg_lsn`` (to `pgcdc.protocol.Lsn`,
the same class the replication protocol uses for WAL positions)."""

from __future__ import annotations

import struct
from uuid import UUID

from pgcdc.errors import ValueDecodeError
from pgcdc.protocol.lsn import Lsn
from pgcdc.types.registry import register

__all__: list[str] = []


def uuid_text(data: bytes) -> UUID:
    """``uuid_out``: 32 lower-case hex digits in 8-4-4-4-12 groups."""
    try:
        return UUID(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise ValueDecodeError(f"invalid uuid text {data[:40]!r}") from None


def uuid_binary(data: bytes) -> UUID:
    """``uuid_send``: the 16 bytes."""
    if len(data) != 16:
        raise ValueDecodeError(f"uuid binary needs 16 bytes, got {len(data)}")
    return UUID(bytes=bytes(data))


_UINT64 = struct.Struct(">Q")


def pg_lsn_text(data: bytes) -> Lsn:
    """``pg_lsn_out``: ``X/Y``, the high and low 32 bits in upper-case hex."""
    try:
        return Lsn.parse(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise ValueDecodeError(f"invalid pg_lsn text {data[:40]!r}") from None


def pg_lsn_binary(data: bytes) -> Lsn:
    """``pg_lsn_send``: the uint64 position."""
    if len(data) != 8:
        raise ValueDecodeError(f"pg_lsn binary needs 8 bytes, got {len(data)}")
    return Lsn(_UINT64.unpack(data)[0])


register(2950, "uuid", uuid_text, uuid_binary, array_oid=2951)
register(3220, "pg_lsn", pg_lsn_text, pg_lsn_binary, array_oid=3221)
