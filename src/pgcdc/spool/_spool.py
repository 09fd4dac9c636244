"""The spool: committed transactions on disk, one file per relation, as raw change frames.

The replication session (on the driver) writes every committed transaction here as it
arrives; a micro-batch is a range of transactions (by end LSN), and Spark tasks read the
byte ranges of the relations they need and decode them a column at a time
(`read_envelope`). Nothing is decoded into Python objects on the driver: a change is stored
as the message the server sent (a change frame, `pgcdc.protocol.columns`).

Files are records (`pgcdc.records`: length, crc32, payload), a file per relation OID and
one for logical messages, rolled over at `segment_bytes`. A transaction's part in one file is
a *unit*, most often a single record::

    F  version, change frames     (ordinal, lsn, message)*, about 1 MB a record, of the
    …                             Relation (version) they were sent under: only a large unit,
                                  or one whose relation changed inside the transaction
    C  version, commit, frames    commit LSN, end LSN, xid, commit time, origin; the last
                                  frames

A Truncate is a frame in the file of each table it emptied (the whole message, so a reader
knows every table it emptied); a logical message a frame of the messages file (a
non-transactional one a unit of its own). The index of committed units lives in memory;
a unit a crash or a reconnect interrupted is cut off its file before the next one starts.
Segments are deleted once Spark committed everything in them (`release`).

The spool is not a durable log: it holds only what the slot has not been confirmed past, so a
new process starts it empty and the server sends the rest again.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol

import pyarrow as pa

from pgcdc.envelope import ChangeBatch, EnvelopeBuilder
from pgcdc.envelope.builder import FlushedRows
from pgcdc.errors import PgcdcError, RecordError, SpoolError
from pgcdc.protocol import (
    Decoder,
    Delete,
    Insert,
    Lsn,
    Message,
    Relation,
    Truncate,
    UndecodedChange,
    UndecodedChanges,
    Update,
    encode,
    pg_timestamp_to_datetime,
)
from pgcdc.protocol.columns import CHANGE_FRAME, append_change_frames, change_frame
from pgcdc.records import encode_record, split_payloads

__all__ = [
    "MESSAGES",
    "BatchInfo",
    "ColumnResolver",
    "Spool",
    "SpoolRange",
    "default_spool_dir",
    "load_ranges",
    "read_changes",
    "read_envelope",
]


class ColumnResolver(Protocol):
    """Says what each column of a Relation message is (its attnums; the pipeline's
    `ColumnIdentities`), given the transaction it came in (xid, commit position)."""

    def __call__(
        self, relation: Relation, xid: int | None, commit_lsn: int | None
    ) -> tuple[int, ...]: ...

    def rereads(self, relid: int, commit_lsn: int | None) -> bool:
        """Whether the relation's last message, in force for a transaction at
        `commit_lsn`, must be resolved again (it was read before a point this one passes)."""
        ...


DEFAULT_SEGMENT_BYTES = 64 << 20
#: Past this much unreleased data the writer waits for Spark (the server then keeps the WAL).
DEFAULT_MAX_BYTES = 4 << 30
#: Frames are written in records of about this size.
_CHUNK_BYTES = 1 << 20
#: The file of logical decoding messages (no relation has OID 0).
MESSAGES = 0
#: Rows per envelope batch `read_envelope` yields (and values, Arrow's int32 offsets).
_BATCH_ROWS = 100_000
_BATCH_VALUE_BYTES = 1 << 30

_VERSION = struct.Struct(">H")
_FRAME_HEAD = CHANGE_FRAME.pack
_COMMIT = struct.Struct(">BQQIqH")  # flags, commit_lsn, end_lsn, xid, commit_ts, origin length
#: A commit record's head: its tag, its version, `_COMMIT`.
_COMMIT_RECORD = struct.Struct(">cH" + _COMMIT.format[1:])
_HAS_XID, _HAS_TS = 1, 2


@dataclass(frozen=True, slots=True)
class SpoolRange:
    """Whole units of one file: what one task reads for one relation. `versions` are the
    Relation messages the units' frames were sent under (encoded), by version number;
    `attnums`, when known, what each version's columns are (their attnums, resolved from the
    catalog on the driver: `pgcdc.pipeline._columns`). `data`, once read on the driver
    (`load_ranges`), is the range's bytes: what a task reads, since only the driver has the
    file."""

    relid: int
    path: str
    offset: int
    length: int
    changes: int
    versions: tuple[bytes, ...]
    attnums: tuple[tuple[int, ...], ...] = ()
    data: bytes | None = field(default=None, repr=False)


#: A transaction's part in one file: (relid, segment, offset, length, changes). A plain
#: tuple of ints, which the garbage collector stops tracking: the index holds some for each
#: transaction until Spark is through with it, and under a steady load of small
#: transactions named tuples made the collector's full passes frequent (see `_Txn`).
_Unit = tuple[int, int, int, int, int]


@dataclass(slots=True)
class _Txn:
    """A committed transaction in the index (the only object of it the collector tracks)."""

    end_lsn: int  # (not `Lsn`s: the collector tracks those; see `_Unit`)
    commit_lsn: int
    commit_ts: int | None
    changes: int
    size: int
    units: tuple[_Unit, ...]


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the index says of the transactions of a batch."""

    transactions: int
    changes: int
    bytes: int
    first_commit_lsn: Lsn | None
    last_commit_lsn: Lsn | None
    last_commit_time: datetime | None


@dataclass(slots=True)
class _File:
    """The active segment of one relation's (or the messages') file."""

    segment: int
    handle: BinaryIO
    size: int = 0


@dataclass(slots=True)
class _Open:
    """A unit being written: where it starts, its frames not yet written, its version."""

    start: int
    version: int
    chunk: bytearray = field(default_factory=bytearray)
    changes: int = 0


#: The write buffer of a spool file.
_WRITE_BUFFER = 1 << 18


class Spool:
    """Writes come from the replication thread (`begin`, `change`, `truncate`, `message`,
    `commit`); planning and release from the pipeline's thread."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        identify: ColumnResolver | None = None,
    ) -> None:
        self.directory = Path(directory)
        #: Says what each column of a Relation message is (its attnums), when it arrives,
        #: given the xid and the commit position of the transaction it came in.
        self.identify = identify
        self._xid: int | None = None
        self._commit_lsn: int | None = None
        if self.directory.exists():
            shutil.rmtree(self.directory)  # a previous process's: the slot resends it
        self.directory.mkdir(parents=True)
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.closed = False
        self.changed = threading.Condition()
        self._txns: list[_Txn] = []
        self._files: dict[int, _File] = {}
        self._segments: dict[tuple[int, int], int] = {}  # (relid, segment) -> units in index
        self._bytes_held = 0
        #: Per relid: the Relation messages its frames were sent under, encoded, and what
        #: their columns are (attnums; empty: not known).
        self._versions: dict[int, list[tuple[bytes, tuple[int, ...]]]] = {}
        #: Per relid: the last Relation message received, and its version.
        self._version_of: dict[int, tuple[Relation, int]] = {}
        self._open: dict[int, _Open] = {}
        self._ordinal = 0
        #: Seconds a committed transaction may wait before it is published (0: at once).
        #: Under a steady load, publishing a group of them at a time saves a flush of each
        #: file and a wake-up of the planner per transaction; whoever holds commits must call
        #: `publish_due` whenever it waits (the `Spooler` does, before each wait for the
        #: server).
        self.hold_seconds = 0.0
        self._staged: list[_Txn] = []
        self._staged_at = 0.0
        self._dirty: set[int] = set()
        self._last_end: Lsn | None = None

    # -- files ---------------------------------------------------------------------------

    def _path(self, relid: int, segment: int) -> Path:
        name = "messages" if relid == MESSAGES else f"r{relid}"
        return self.directory / f"{name}-{segment:06d}.spool"

    def _open_segment(self, relid: int, segment: int) -> BinaryIO:
        # Written in large pieces: what a transaction adds reaches the OS when it is
        # published (`publish`), not record by record.
        return open(self._path(relid, segment), "w+b", buffering=_WRITE_BUFFER)

    def _file(self, relid: int) -> _File:
        file = self._files.get(relid)
        if file is None:
            file = self._files[relid] = _File(0, self._open_segment(relid, 0))
        return file

    def _write(self, relid: int, payload: bytes) -> None:
        file = self._files[relid]
        record = encode_record(payload)
        file.handle.write(record)
        file.size += len(record)

    def _roll(self, relid: int) -> None:
        """A new segment for `relid` (between units only); the old one goes now if Spark is
        through with it already (else `release` deletes it)."""
        file = self._files[relid]
        file.handle.close()
        segment = file.segment + 1
        with self.changed:
            self._files[relid] = _File(segment, self._open_segment(relid, segment))
            if not self._segments.get((relid, file.segment)):
                self._segments.pop((relid, file.segment), None)
                self._path(relid, file.segment).unlink(missing_ok=True)

    # -- the writer (replication thread) -------------------------------------------------

    def begin(self, xid: int | None = None, commit_lsn: int | None = None) -> None:
        """A transaction's changes follow (`xid`, `commit_lsn`: its, when known). One that
        was interrupted (a lost connection: the server sends it again whole) is cut off its
        files."""
        self._xid, self._commit_lsn = xid, commit_lsn
        for relid, unit in self._open.items():
            file = self._files[relid]
            file.handle.seek(unit.start)
            file.handle.truncate()
            file.size = unit.start
        self._open.clear()
        self._ordinal = 0

    def _version(self, relation: Relation) -> int:
        """The version of a relation's frames: a new one when a Relation message differs
        from the last one, or names other columns (a message sent again after DDL may be
        the same bytes: ``DROP c; ADD c``)."""
        known = self._version_of.get(relation.relid)
        identify = self.identify
        if (
            known is not None
            and known[0] is relation
            and (identify is None or not identify.rereads(relation.relid, self._commit_lsn))
        ):
            return known[1]
        attnums = () if identify is None else identify(relation, self._xid, self._commit_lsn)
        encoded = encode(replace(relation, xid=None))  # not a stream block's
        versions = self._versions.setdefault(relation.relid, [])
        if known is not None and versions[known[1]] == (encoded, attnums):
            version = known[1]
        else:
            versions.append((encoded, attnums))
            version = len(versions) - 1
        self._version_of[relation.relid] = (relation, version)
        return version

    def _frame(self, relid: int, version: int, frame: bytes) -> None:
        unit = self._open.get(relid)
        if unit is None:
            unit = self._open[relid] = _Open(self._file(relid).size, version)
        elif unit.version != version:  # the relation changed inside the transaction
            self._flush(relid, unit)
            unit.version = version
        unit.chunk += frame
        unit.changes += 1
        if len(unit.chunk) >= _CHUNK_BYTES:
            self._flush(relid, unit)

    def _flush(self, relid: int, unit: _Open) -> None:
        if unit.chunk:
            self._write(relid, b"F" + _VERSION.pack(unit.version) + unit.chunk)
            unit.chunk.clear()

    def _unit(self, relation: Relation) -> _Open:
        """The open unit of `relation`'s file, under the relation's current version."""
        relid = relation.relid
        unit = self._open.get(relid)
        if unit is None:  # the relation's first change in the transaction
            version = self._version(relation)
            unit = self._open[relid] = _Open(self._file(relid).size, version)
        elif self._version_of[relid][0] is not relation:  # DDL inside the transaction
            version = self._version(relation)
            if version != unit.version:
                self._flush(relid, unit)
                unit.version = version
        return unit

    def change(self, relation: Relation, lsn: int | None, message: bytes) -> None:
        """An Insert, Update or Delete as the server sent it (`UndecodedChange.message`)."""
        self._ordinal += 1
        unit = self._unit(relation)
        chunk = unit.chunk
        chunk += _FRAME_HEAD(self._ordinal, lsn or 0, len(message))
        chunk += message
        unit.changes += 1
        if len(chunk) >= _CHUNK_BYTES:
            self._flush(relation.relid, unit)

    def changes(self, relation_of: Callable[[int], Relation], changes: UndecodedChanges) -> None:
        """Inserts, Updates and Deletes as the server sent them, in order; `relation_of`
        gives each relid's Relation."""
        units = {relid: self._unit(relation_of(relid)) for relid in changes.relids()}
        self._ordinal, counts = append_change_frames(
            changes.frames, self._ordinal, {relid: unit.chunk for relid, unit in units.items()}
        )
        for relid, unit in units.items():
            unit.changes += counts[relid]
            if len(unit.chunk) >= _CHUNK_BYTES:
                self._flush(relid, unit)

    def truncate(self, relations: Iterable[Relation], message: Truncate, lsn: int | None) -> None:
        """A TRUNCATE: a frame in the file of each table it emptied."""
        body = encode(Truncate(message.options, message.relids))
        for relation in relations:
            self._ordinal += 1
            frame = change_frame(self._ordinal, lsn or 0, body)
            self._frame(relation.relid, self._version(relation), frame)

    def message(self, message: Message) -> None:
        """A transactional logical decoding message (a non-transactional one: `begin`, this,
        then `commit` at its own position)."""
        self._ordinal += 1
        body = encode(Message(message.flags, message.lsn, message.prefix, message.content))
        self._frame(MESSAGES, 0, change_frame(self._ordinal, message.lsn, body))

    def commit(
        self,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        xid: int | None,
        commit_ts: int | None,
        origin: str | None,
    ) -> None:
        """The transaction committed: its units close. They become visible to planning
        now, or, while commits are held (`hold_seconds`), at the next `publish`."""
        flags = (_HAS_XID if xid is not None else 0) | (_HAS_TS if commit_ts is not None else 0)
        origin_bytes = (origin or "").encode()
        trailer = (
            _COMMIT.pack(flags, commit_lsn, end_lsn, xid or 0, commit_ts or 0, len(origin_bytes))
            + origin_bytes
        )
        if self._last_end is not None and end_lsn <= self._last_end:
            raise SpoolError(
                f"transaction ending at {end_lsn} arrived after one ending at "
                f"{self._last_end}: positions must increase"
            )
        self._last_end = Lsn(end_lsn)
        units = []
        size = changes = 0
        for relid, unit in self._open.items():
            file = self._files[relid]
            record = encode_record(
                b"".join((b"C", _VERSION.pack(unit.version), trailer, unit.chunk))
            )
            file.handle.write(record)
            file.size += len(record)
            length = file.size - unit.start
            units.append((relid, file.segment, unit.start, length, unit.changes))
            size += length
            changes += unit.changes
            self._dirty.add(relid)
        self._open.clear()
        now = time.monotonic()
        if not self._staged:
            self._staged_at = now
        txn = _Txn(int(end_lsn), int(commit_lsn), commit_ts, changes, size, tuple(units))
        self._staged.append(txn)
        if not self.hold_seconds or now - self._staged_at >= self.hold_seconds:
            self.publish()

    def publish(self) -> None:
        """The committed transactions held so far become visible to planning (their bytes
        reach the OS first: tasks read the files)."""
        if not self._staged:
            return
        for relid in self._dirty:
            self._files[relid].handle.flush()
        staged, self._staged = self._staged, []
        with self.changed:
            while self._bytes_held > self.max_bytes and not self.closed:
                self.changed.wait(1.0)
            if self.closed:
                raise SpoolError("the spool was closed")
            for txn in staged:
                self._txns.append(txn)
                self._bytes_held += txn.size
                for relid, segment, *_ in txn.units:
                    key = (relid, segment)
                    self._segments[key] = self._segments.get(key, 0) + 1
            self.changed.notify_all()
        self._dirty.clear()
        full = [r for r, f in self._files.items() if f.size >= self.segment_bytes]
        for relid in full:
            if relid not in self._open:  # a transaction being written stays in its file
                self._roll(relid)

    @property
    def holding(self) -> bool:
        """Whether committed transactions wait to be published."""
        return bool(self._staged)

    def publish_due(self) -> float | None:
        """Called when the replication session is about to wait for the server: publishes
        the held commits once the oldest was held `hold_seconds`; else the seconds until
        then (None: nothing held)."""
        if not self._staged:
            return None
        due = self._staged_at + self.hold_seconds - time.monotonic()
        if due <= 0:
            self.publish()
            return None
        return due

    # -- planning (the pipeline's thread) ----------------------------------------------------

    @property
    def last_lsn(self) -> Lsn | None:
        with self.changed:
            return Lsn(self._txns[-1].end_lsn) if self._txns else None

    @property
    def bytes_held(self) -> int:
        return self._bytes_held

    def _after(self, start: Lsn) -> list[_Txn]:
        txns = self._txns
        lo, hi = 0, len(txns)
        while lo < hi:
            mid = (lo + hi) // 2
            if txns[mid].end_lsn <= start:
                lo = mid + 1
            else:
                hi = mid
        return txns[lo:]

    def pending(self, start: Lsn, *, upto: Lsn | None = None, at_most: int | None = None) -> int:
        """The changes of the transactions after `start` (up to `upto`); counting stops
        once past `at_most`."""
        with self.changed:
            changes = 0
            for txn in self._after(start):
                if (upto is not None and txn.end_lsn > upto) or (
                    at_most is not None and changes > at_most
                ):
                    break
                changes += txn.changes
            return changes

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
            end, changes, size = int(start), 0, 0
            for txn in self._after(start):
                if upto is not None and txn.end_lsn > upto:
                    break
                if changes and (
                    (max_changes is not None and changes + txn.changes > max_changes)
                    or (max_bytes is not None and size + txn.size > max_bytes)
                ):
                    break
                end, changes, size = txn.end_lsn, changes + txn.changes, size + txn.size
            return Lsn(end), changes

    def oldest_pending(self, after: Lsn) -> datetime | None:
        """The commit time of the first transaction spooled after `after` (None: none)."""
        with self.changed:
            for txn in self._after(after):
                if txn.commit_ts is not None:
                    return pg_timestamp_to_datetime(txn.commit_ts)
        return None

    def batch(self, start: Lsn, end: Lsn) -> BatchInfo:
        """The transactions ending in (start, end]."""
        with self.changed:
            txns = [t for t in self._after(start) if t.end_lsn <= end]
        times = [t.commit_ts for t in txns if t.commit_ts is not None]
        return BatchInfo(
            len(txns),
            sum(t.changes for t in txns),
            sum(t.size for t in txns),
            Lsn(txns[0].commit_lsn) if txns else None,
            Lsn(txns[-1].commit_lsn) if txns else None,
            pg_timestamp_to_datetime(max(times)) if times else None,
        )

    def ranges(self, start: Lsn, end: Lsn) -> dict[int, list[SpoolRange]]:
        """Per relation OID (and `MESSAGES`), the byte ranges of its units of the
        transactions ending in (start, end]: adjacent units of a segment are one range."""
        spans: dict[int, list[list[int]]] = {}  # relid -> [segment, offset, length, changes]
        with self.changed:
            for txn in self._after(start):
                if txn.end_lsn > end:
                    break
                for relid, segment, offset, length, changes in txn.units:
                    found = spans.setdefault(relid, [])
                    last = found[-1] if found else None
                    if last is not None and last[0] == segment and last[1] + last[2] == offset:
                        last[2] += length
                        last[3] += changes
                    else:
                        found.append([segment, offset, length, changes])
            versions = {relid: tuple(self._versions.get(relid, ())) for relid in spans}
        return {
            relid: [
                SpoolRange(
                    relid,
                    str(self._path(relid, seg)),
                    offset,
                    length,
                    changes,
                    tuple(encoded for encoded, _ in versions[relid]),
                    tuple(attnums for _, attnums in versions[relid]),
                )
                for seg, offset, length, changes in found
            ]
            for relid, found in spans.items()
        }

    def release(self, upto: Lsn) -> None:
        """Spark committed everything up to `upto`: forget it and delete finished segments."""
        with self.changed:
            done = len(self._txns) - len(self._after(upto))
            if not done:
                return
            gone, self._txns = self._txns[:done], self._txns[done:]
            self._bytes_held -= sum(t.size for t in gone)
            for txn in gone:
                for relid, segment, *_ in txn.units:
                    key = (relid, segment)
                    self._segments[key] -= 1
                    active = self._files.get(relid)
                    if self._segments[key] == 0 and (active is None or active.segment != segment):
                        del self._segments[key]
                        self._path(relid, segment).unlink(missing_ok=True)
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
            for file in self._files.values():
                file.handle.close()
            self._files.clear()
            shutil.rmtree(self.directory, ignore_errors=True)


def default_spool_dir(slot: str) -> str:
    """A directory of this process under the temp directory; those of dead processes (Spark
    kills the data source process without `stop`; a killed pipeline) are removed."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"pgcdc-spool-{slot}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    return str(base / f"pgcdc-spool-{slot}-{os.getpid()}")


def load_ranges(ranges: Iterable[SpoolRange]) -> tuple[SpoolRange, ...]:
    """`ranges` with their bytes (`SpoolRange.data`), read from the spool's files here, on
    the driver: a task gets them inside its work, so executors need no access to the spool."""
    loaded = []
    for spool_range in ranges:
        if spool_range.data is None:
            try:
                with open(spool_range.path, "rb") as file:
                    file.seek(spool_range.offset)
                    data = file.read(spool_range.length)
            except OSError as exc:
                raise SpoolError(f"cannot read spool file {spool_range.path}: {exc}") from None
            if len(data) < spool_range.length:
                raise SpoolError(
                    f"spool file {spool_range.path} ends {spool_range.length - len(data)} "
                    f"bytes before the range at {spool_range.offset} does"
                )
            spool_range = replace(spool_range, data=data)
        loaded.append(spool_range)
    return tuple(loaded)


# -- reading (executors) -----------------------------------------------------------------


def _payloads(spool_range: SpoolRange) -> Iterator[bytes]:
    """The payloads of the range's records (RecordError when one is damaged: the reader
    says which file)."""
    data = spool_range.data
    if data is None:
        data = load_ranges([spool_range])[0].data
        assert data is not None
    return split_payloads(data, spool_range.offset)


def read_envelope(ranges: Iterable[SpoolRange]) -> Iterator[pa.RecordBatch]:
    """The envelope rows of the units in `ranges`, a column at a time (`EnvelopeBuilder`):
    row changes straight from their frames, Truncates and messages decoded one by one."""
    for part in _read_flushed(ranges):
        yield part.envelope()


def read_changes(ranges: Iterable[SpoolRange]) -> ChangeBatch:
    """The units in `ranges` as one `ChangeBatch`: their row changes per relation shape,
    and the envelope made from them when something needs it."""
    return ChangeBatch(list(_read_flushed(ranges)))


def _read_flushed(ranges: Iterable[SpoolRange]) -> Iterator[FlushedRows]:
    builder = EnvelopeBuilder()
    read = 0  # record bytes since the last flush: at least the values collected
    for spool_range in ranges:
        for size in _read_units(builder, spool_range):
            read += size
            if len(builder) >= _BATCH_ROWS or (
                read >= _BATCH_VALUE_BYTES and builder.value_bytes >= _BATCH_VALUE_BYTES
            ):
                yield builder.flush_rows()
                read = 0
    if len(builder):
        yield builder.flush_rows()


def _read_units(builder: EnvelopeBuilder, spool_range: SpoolRange) -> Iterator[int]:
    """Each unit of the range into `builder`, its records' bytes yielded after it."""
    path = spool_range.path
    relations = [_relation(v) for v in spool_range.versions]
    attnums = list(spool_range.attnums) or [()] * len(relations)
    messages = spool_range.relid == MESSAGES
    frames: list[tuple[Relation | None, tuple[int, ...], bytes, int]] = []  # the F records
    size = 0
    begin, take = builder.begin, builder.frames
    try:
        for payload in _payloads(spool_range):
            size += len(payload)
            tag = payload[:1]
            try:
                if tag == b"C":
                    _, version, flags, commit_lsn, _, xid, commit_ts, origin_length = (
                        _COMMIT_RECORD.unpack_from(payload)
                    )
                    start = _COMMIT_RECORD.size + origin_length
                elif tag == b"F":
                    (version,) = _VERSION.unpack_from(payload, 1)
                    start = 1 + _VERSION.size
                else:
                    raise SpoolError(f"spool file {path}: unknown record {tag!r}")
            except struct.error:
                raise SpoolError(
                    f"spool file {path}: a {tag!r} record of {len(payload)} bytes"
                ) from None
            if version >= len(relations) and not messages:
                raise SpoolError(f"spool file {path}: no relation version {version}")
            relation = None if messages else relations[version]
            numbers = attnums[version] if relation is not None else ()
            if tag == b"F":
                frames.append((relation, numbers, payload, start))
                continue
            origin = payload[_COMMIT_RECORD.size : start].decode() if origin_length else None
            begin(
                commit_lsn,
                xid if flags & _HAS_XID else None,
                commit_ts if flags & _HAS_TS else None,
                origin,
            )
            for earlier in frames:
                _frames(builder, *earlier)
            frames = []
            if relation is not None:  # (most often all of a unit: one relation's row changes)
                start = take(relation, payload, start, len(payload), numbers)
            _frames(builder, relation, numbers, payload, start)
            yield size
            size = 0
    except RecordError as exc:
        raise SpoolError(f"spool file {path}: {exc}") from None


def _relation(encoded: bytes) -> Relation:
    message = Decoder(1).decode(encoded)
    assert isinstance(message, Relation)
    return message


def _frames(
    builder: EnvelopeBuilder,
    relation: Relation | None,
    attnums: tuple[int, ...],
    record: bytes,
    pos: int,
) -> None:
    """The frames of a unit's record from `pos`: row changes a column at a time, the rest
    one by one."""
    end = len(record)
    while pos < end:
        if relation is not None:
            pos = builder.frames(relation, record, pos, end, attnums)
            if pos >= end:
                break
        pos = _one_frame(builder, relation, attnums, record, pos)


def _one_frame(
    builder: EnvelopeBuilder,
    relation: Relation | None,
    attnums: tuple[int, ...],
    payload: bytes,
    pos: int,
) -> int:
    """The frame at `pos` that the column path did not take: a Truncate, a message, or a
    change that does not decode (the decoder raises the precise error)."""
    ordinal, lsn, size = CHANGE_FRAME.unpack_from(payload, pos)
    start = pos + CHANGE_FRAME.size
    body = payload[start : start + size]
    decoder = Decoder(4, "parallel")
    if relation is not None:
        decoder.relations[relation.relid] = relation
    try:
        message = decoder.decode(body, lsn)
    except PgcdcError as exc:
        commit = Lsn(builder.commit_lsn)
        raise SpoolError(f"the change at LSN {Lsn(lsn)} (commit {commit}): {exc}") from None
    if isinstance(message, Truncate) and relation is not None:
        builder.truncate(ordinal, relation, message.cascade, message.restart_identity, lsn, attnums)
    elif isinstance(message, Message):
        builder.message(ordinal, message.prefix, message.content, message.transactional, lsn)
    elif isinstance(message, Insert | Update | Delete | UndecodedChange) and relation is not None:
        assert not isinstance(message, UndecodedChange)
        builder.change(ordinal, message, relation, lsn, attnums)  # decoded in Python
    else:
        raise SpoolError(f"unexpected {type(message).__name__} in a spool unit at LSN {Lsn(lsn)}")
    return start + size
