"""The spool: committed transactions on disk, indexed by their end LSN.

The Spark source's driver process writes every committed transaction here as it arrives from
the walsender; a micro-batch is a range of end LSNs, and the executors read the byte ranges
that hold it (`read_range`) and build the envelope in parallel. A record is a length, a crc32
and a pickled `SpooledTransaction`; segment files roll over at `segment_bytes` and are deleted
once Spark has committed everything in them (`release`).

The spool is not a durable log: it holds only what the slot has not been confirmed past, so a
new process starts it empty and the server sends the rest again.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pgcdc.errors import SpoolError
from pgcdc.protocol import Lsn
from pgcdc.spark.envelope import SpooledTransaction

__all__ = ["Spool", "SpoolRange", "read_range"]

_RECORD = struct.Struct("<II")  # payload length, crc32 of the payload
DEFAULT_SEGMENT_BYTES = 64 << 20
#: Past this much unreleased data the writer waits for Spark (the server then keeps the WAL).
DEFAULT_MAX_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class SpoolRange:
    """Consecutive records of one segment file: what one executor task reads."""

    path: str
    offset: int
    length: int
    changes: int


@dataclass(frozen=True, slots=True)
class _Unit:
    end_lsn: Lsn
    segment: int
    offset: int
    length: int
    changes: int


class Spool:
    """Appends come from the replication thread; planning and release from Spark's thread."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.directory = Path(directory)
        if self.directory.exists():
            shutil.rmtree(self.directory)  # a previous process's: the slot resends it
        self.directory.mkdir(parents=True)
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.closed = False
        self.changed = threading.Condition()
        self._units: list[_Unit] = []
        self._segment = -1
        self._file: BinaryIO | None = None
        self._size = 0
        self._bytes_held = 0
        self._roll()

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:08d}.spool"

    def _roll(self) -> None:
        if self._file is not None:
            self._file.close()
        self._segment += 1
        self._file = open(self._path(self._segment), "wb")  # noqa: SIM115 - kept open
        self._size = 0

    # -- the writer (replication thread) ---------------------------------------------------

    def append(self, txn: SpooledTransaction) -> None:
        payload = pickle.dumps(txn, protocol=pickle.HIGHEST_PROTOCOL)
        record = _RECORD.pack(len(payload), zlib.crc32(payload)) + payload
        with self.changed:
            while self._bytes_held > self.max_bytes and not self.closed:
                self.changed.wait(1.0)
            if self.closed:
                raise SpoolError("the spool was closed")
            if self._units and txn.end_lsn <= self._units[-1].end_lsn:
                raise SpoolError(
                    f"transaction ending at {txn.end_lsn} arrived after one ending at "
                    f"{self._units[-1].end_lsn}: positions must increase"
                )
            if self._size and self._size + len(record) > self.segment_bytes:
                self._roll()
            assert self._file is not None
            self._file.write(record)
            # Executors read the file through the OS: hand every record over at once.
            self._file.flush()
            unit = _Unit(txn.end_lsn, self._segment, self._size, len(record), txn.changes)
            self._units.append(unit)
            self._size += len(record)
            self._bytes_held += len(record)
            self.changed.notify_all()

    # -- planning (Spark's driver thread) --------------------------------------------------

    @property
    def last_lsn(self) -> Lsn | None:
        with self.changed:
            return self._units[-1].end_lsn if self._units else None

    @property
    def bytes_held(self) -> int:
        return self._bytes_held

    def _after(self, start: Lsn) -> list[_Unit]:
        units = self._units
        lo, hi = 0, len(units)
        while lo < hi:
            mid = (lo + hi) // 2
            if units[mid].end_lsn <= start:
                lo = mid + 1
            else:
                hi = mid
        return units[lo:]

    def plan(
        self,
        start: Lsn,
        *,
        max_changes: int | None = None,
        max_bytes: int | None = None,
        upto: Lsn | None = None,
    ) -> tuple[Lsn, int]:
        """The end of the next batch after `start` (whole transactions, at least one) and its
        number of changes; `start` and 0 when there is nothing."""
        with self.changed:
            end, changes, size = start, 0, 0
            for unit in self._after(start):
                if upto is not None and unit.end_lsn > upto:
                    break
                if changes and (
                    (max_changes is not None and changes + unit.changes > max_changes)
                    or (max_bytes is not None and size + unit.length > max_bytes)
                ):
                    break
                end, changes, size = unit.end_lsn, changes + unit.changes, size + unit.length
            return end, changes

    def ranges(self, start: Lsn, end: Lsn, *, target_bytes: int) -> list[SpoolRange]:
        """The records of transactions ending in (start, end], cut into ranges of about
        `target_bytes` that never split a transaction."""
        out: list[SpoolRange] = []
        with self.changed:
            current: list[_Unit] = []
            for unit in self._after(start):
                if unit.end_lsn > end:
                    break
                if current and (
                    unit.segment != current[0].segment
                    or sum(u.length for u in current) >= target_bytes
                ):
                    out.append(self._range(current))
                    current = []
                current.append(unit)
            if current:
                out.append(self._range(current))
        return out

    def _range(self, units: list[_Unit]) -> SpoolRange:
        first, last = units[0], units[-1]
        return SpoolRange(
            str(self._path(first.segment)),
            first.offset,
            last.offset + last.length - first.offset,
            sum(u.changes for u in units),
        )

    def release(self, upto: Lsn) -> None:
        """Spark committed everything up to `upto`: forget it and delete finished segments."""
        with self.changed:
            done = len(self._units) - len(self._after(upto))
            if not done:
                return
            gone, self._units = self._units[:done], self._units[done:]
            self._bytes_held -= sum(u.length for u in gone)
            keep = self._units[0].segment if self._units else self._segment
            for segment in {u.segment for u in gone}:
                if segment < keep:
                    self._path(segment).unlink(missing_ok=True)
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
            if self._file is not None:
                self._file.close()
                self._file = None
            shutil.rmtree(self.directory, ignore_errors=True)


def read_range(spool_range: SpoolRange) -> Iterator[SpooledTransaction]:
    """The transactions of one range, checked record by record (executor side)."""
    path = spool_range.path
    try:
        with open(path, "rb") as f:
            f.seek(spool_range.offset)
            data = f.read(spool_range.length)
    except OSError as exc:
        raise SpoolError(
            f"cannot read spool file {path} (on executors the spool directory must be the "
            f"driver's, e.g. shared storage): {exc}"
        ) from None
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            raise SpoolError(
                f"spool file {path}: record header cut at byte {spool_range.offset + pos}"
            )
        length, crc = _RECORD.unpack_from(view, pos)
        payload = view[pos + _RECORD.size : pos + _RECORD.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            raise SpoolError(
                f"spool file {path}: record at byte {spool_range.offset + pos} is damaged"
            )
        yield pickle.loads(payload)
        pos += _RECORD.size + length
