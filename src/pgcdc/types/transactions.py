"""Transaction ids and snapshots: ``xid``, ``cid``, ``xid8``, ``pg_snapshot`` and
``txid_snapshot``.

* ``xid`` and ``cid``: 32-bit unsigned numbers; text in decimal (``xidout``, ``cidout``),
  binary the uint32 (``xidsend``, ``cidsend``); an `int`.
* ``xid8``: a 64-bit full transaction id (epoch and xid); text in decimal (``xid8out``),
  binary the uint64 (``xid8send``); an `int` from 0 to 2**64 - 1.
* ``pg_snapshot``: a `PgSnapshot`; text ``xmin:xmax:xip,...`` (``pg_snapshot_out``: the
  in-progress ids in ascending order, nothing after the second colon when there are none),
  binary an int32 count of in-progress ids, then xmin, xmax and the ids, each a uint64
  (``pg_snapshot_send``). ``txid_snapshot``, its older name, has the same output and send
  functions (PostgreSQL 13+ implements both with the pg_snapshot functions).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__ = ["PgSnapshot"]


@dataclass(frozen=True, slots=True)
class PgSnapshot:
    """A ``pg_snapshot`` (or ``txid_snapshot``): transactions before `xmin` are finished,
    those from `xmax` on had not started, and `xip` lists the ones in between that were
    still in progress (ascending)."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    def __str__(self) -> str:
        """The server's text, e.g. ``10:20:10,14,15``."""
        return f"{self.xmin}:{self.xmax}:" + ",".join(map(str, self.xip))


def _unsigned_text(bits: int, what: str) -> Callable[[bytes], int]:
    limit = 1 << bits

    def parse(data: bytes) -> int:
        if not data.isdigit() or (value := int(data)) >= limit:  # ASCII digits only
            raise ValueDecodeError(f"invalid {what} text {data[:40]!r}")
        return value

    return parse


def _unsigned_binary(fmt: str, what: str) -> Callable[[bytes], int]:
    layout = struct.Struct(fmt)

    def parse(data: bytes) -> int:
        if len(data) != layout.size:
            raise ValueDecodeError(f"{what} binary needs {layout.size} bytes, got {len(data)}")
        value: int = layout.unpack(data)[0]
        return value

    return parse


_xid8_text = _unsigned_text(64, "xid8")


def snapshot_text(data: bytes) -> PgSnapshot:
    """``pg_snapshot_out``: ``xmin:xmax:`` and the in-progress ids, separated by commas."""
    parts = data.split(b":")
    try:
        if len(parts) != 3:
            raise ValueDecodeError("not three parts")
        xip = tuple(_xid8_text(x) for x in parts[2].split(b",")) if parts[2] else ()
        return PgSnapshot(_xid8_text(parts[0]), _xid8_text(parts[1]), xip)
    except ValueDecodeError:
        raise ValueDecodeError(f"invalid pg_snapshot text {data[:60]!r}") from None


_SNAPSHOT_HEAD = struct.Struct(">iQQ")


def snapshot_binary(data: bytes) -> PgSnapshot:
    """``pg_snapshot_send``: int32 count, uint64 xmin, uint64 xmax, count uint64 ids."""
    if len(data) < _SNAPSHOT_HEAD.size:
        raise ValueDecodeError(f"pg_snapshot binary needs at least 20 bytes, got {len(data)}")
    count, xmin, xmax = _SNAPSHOT_HEAD.unpack_from(data)
    if count < 0 or len(data) != _SNAPSHOT_HEAD.size + 8 * count:
        raise ValueDecodeError(
            f"pg_snapshot binary of {len(data)} bytes cannot hold {count} transaction ids"
        )
    return PgSnapshot(xmin, xmax, struct.unpack_from(f">{count}Q", data, _SNAPSHOT_HEAD.size))


register(28, "xid", _unsigned_text(32, "xid"), _unsigned_binary(">I", "xid"), array_oid=1011)
register(29, "cid", _unsigned_text(32, "cid"), _unsigned_binary(">I", "cid"), array_oid=1012)
register(5069, "xid8", _xid8_text, _unsigned_binary(">Q", "xid8"), array_oid=271)
register(5038, "pg_snapshot", snapshot_text, snapshot_binary, array_oid=5039)
register(2970, "txid_snapshot", snapshot_text, snapshot_binary, array_oid=2949)
