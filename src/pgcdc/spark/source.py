"""The Spark data source ``pgoutput``: a slot's committed changes as envelope rows.

Streaming (``spark.readStream.format("pgoutput")``): the driver's data source process keeps
one replication session (`Spooler`) that writes committed transactions to a spool directory;
an offset is ``{"lsn": "X/Y"}``, the end LSN of the last transaction in the batch, so a batch
always ends on a transaction boundary. Each partition carries its spool ranges' bytes (read
where the session runs), and executors build the envelope from them in parallel: they need
no access to the spool. The slot is confirmed only in `commit`, after Spark committed the batch;
restarting from a checkpoint resumes exactly, because the slot still holds everything after the
last committed batch. Admission control: ``maxChangesPerBatch`` and ``maxBytesPerBatch``
(whole transactions, at least one per batch); ``Trigger.AvailableNow`` reads up to the
server's WAL position at the start.

Batch (``spark.read.format("pgoutput")``): the slot's pending changes (optionally up to
``endLsn``, from ``startLsn``: transactions that committed in that range) through
``pg_logical_slot_peek_binary_changes``; nothing is consumed.

Options: ``conninfo`` (libpq string or URI), ``slot``, ``publication`` (comma-separated),
``createSlot`` (create the slot when missing), ``maxChangesPerBatch``, ``maxBytesPerBatch``,
``spoolDir`` (default: under the temp directory of the process that holds the session),
``partitionBytes`` (target size of one task's spool range, default 16 MB), ``streaming``
(``on``/``off``: how the server sends large transactions, default on where supported),
``messages`` (include logical decoding messages), ``statusInterval`` (seconds), and for batch
reads ``startLsn`` and ``endLsn``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pgcdc.decoding.assembler import TransactionAssembler
from pgcdc.decoding.catalog import Catalog
from pgcdc.decoding.context import DecodingContext
from pgcdc.errors import SlotNotFound, SourceError
from pgcdc.pipeline._columns import ColumnIdentities
from pgcdc.protocol import Lsn, StreamingMode
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.slots import connect_sql, create_slot, get_slot
from pgcdc.replication.sql_transport import SqlTransport
from pgcdc.spark.envelope import ENVELOPE_SCHEMA
from pgcdc.spool._session import Spooler, SpoolWriter
from pgcdc.spool._spool import Spool, SpoolRange, default_spool_dir, load_ranges, read_envelope

__all__ = ["PgoutputDataSource", "SourceOptions", "register"]

#: How long planning waits for the session to re-deliver a batch Spark asks for again.
_REDELIVERY_TIMEOUT = 600.0


#: How long a new session waits for a previous one (of a killed process) to release the slot.
_SLOT_RELEASE_TIMEOUT = 30.0


def get_server_version(conninfo: str) -> int:
    with connect_sql(conninfo) as conn:
        return conn.info.server_version


def _server_lsn(conninfo: str) -> Lsn:
    with connect_sql(conninfo) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def register(spark: Any) -> None:
    """Make ``format("pgoutput")`` available in `spark`."""
    spark.dataSource.register(PgoutputDataSource)


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("true", "on", "yes", "1"):
        return True
    if lowered in ("false", "off", "no", "0"):
        return False
    raise SourceError(f"option {name}={value!r} is not a boolean")


def _count(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise SourceError(f"option {name}={value!r} must be a positive integer")
    return number


@dataclass(frozen=True, slots=True)
class SourceOptions:
    conninfo: str
    slot: str
    publications: tuple[str, ...]
    create_slot: bool = False
    max_changes: int | None = None
    max_bytes: int | None = None
    spool_dir: str | None = None
    partition_bytes: int = 16 << 20
    streaming: StreamingMode | None = None
    messages: bool = False
    status_interval: float = 10.0
    start_lsn: Lsn | None = None
    end_lsn: Lsn | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {k.lower(): v for k, v in options.items()}
        missing = [n for n in ("conninfo", "slot", "publication") if not given.get(n)]
        if missing:
            raise SourceError(f"the pgoutput source needs the option(s) {', '.join(missing)}")
        streaming = given.get("streaming")
        try:
            start, end = given.get("startlsn"), given.get("endlsn")
            return cls(
                conninfo=given["conninfo"],
                slot=given["slot"],
                publications=tuple(p.strip() for p in given["publication"].split(",") if p),
                create_slot=_flag(given.get("createslot"), "createSlot"),
                max_changes=_count(given.get("maxchangesperbatch"), "maxChangesPerBatch"),
                max_bytes=_count(given.get("maxbytesperbatch"), "maxBytesPerBatch"),
                spool_dir=given.get("spooldir"),
                partition_bytes=_count(given.get("partitionbytes"), "partitionBytes") or 16 << 20,
                streaming=None if streaming is None else StreamingMode(streaming.lower()),
                messages=_flag(given.get("messages"), "messages"),
                status_interval=float(given.get("statusinterval", 10.0)),
                start_lsn=None if start is None else Lsn.parse(start),
                end_lsn=None if end is None else Lsn.parse(end),
            )
        except ValueError as exc:
            raise SourceError(f"invalid pgoutput option: {exc}") from None

    @property
    def stream_options(self) -> StreamOptions:
        return StreamOptions(self.publications, messages=self.messages)


class PgoutputDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pgoutput"

    def schema(self) -> StructType:
        return ENVELOPE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PgoutputStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return PgoutputBatchReader(SourceOptions.parse(self.options))


class SpoolPartition(InputPartition):
    def __init__(self, ranges: tuple[SpoolRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class PgoutputStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark builds one of these in the driver's data source process (where the session
    lives) and others only to ship `read` to executors: nothing starts in the constructor."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._spooler: Spooler | None = None
        self._target: Lsn | None = None
        self._catalog: Catalog | None = None
        #: The server's WAL position when the session started, until the first batch that
        #: waited for it was planned (`_settle`).
        self._opened_at: Lsn | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "_spooler": None,
            "_target": None,
            "_catalog": None,
            "_opened_at": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    # -- driver side -----------------------------------------------------------------------

    def _slot_start(self, wait_inactive: float = 0.0) -> Lsn:
        options = self.options
        try:
            slot = get_slot(options.conninfo, options.slot)
            # A previous run's session (its process killed with the query) may still hold it.
            deadline = time.monotonic() + wait_inactive
            while slot.active and time.monotonic() < deadline:
                time.sleep(0.2)
                slot = get_slot(options.conninfo, options.slot)
        except SlotNotFound:
            if not options.create_slot:
                raise SourceError(
                    f"replication slot {options.slot!r} does not exist (create it with "
                    f"`pgcdc slot create`, or set the option createSlot=true)"
                ) from None
            create_slot(options.conninfo, options.slot)
            slot = get_slot(options.conninfo, options.slot)
        if slot.plugin != "pgoutput":
            raise SourceError(f"slot {options.slot!r} uses plugin {slot.plugin!r}, not pgoutput")
        return Lsn(slot.confirmed_flush_lsn or slot.restart_lsn or 0)

    def _session(self, start: Lsn) -> Spooler:
        """The replication session, started at the first call: `start` is the offset Spark
        committed (the checkpoint's), which the slot may lie before (a crash between Spark's
        commit and the slot's confirmation; a standby's copy of the slot after a failover)."""
        if self._spooler is None:
            options = self.options
            self._slot_start(wait_inactive=_SLOT_RELEASE_TIMEOUT)
            directory = options.spool_dir or default_spool_dir(options.slot)
            # Large transactions come streamed where the server can (14+): the spooler
            # assembles them within bounded memory instead of the server spilling to disk.
            streaming = options.streaming
            if streaming is None:
                version = get_server_version(options.conninfo)
                streaming = StreamingMode.ON if version >= 140000 else StreamingMode.OFF
            self._catalog = Catalog(options.conninfo)
            identities = ColumnIdentities(self._catalog, options.publications)
            identities.hold(start)  # Spark skips what the slot sends again before it
            self._opened_at = _server_lsn(options.conninfo)
            self._spooler = Spooler(
                options.conninfo,
                options.slot,
                options.stream_options,
                Spool(directory, identify=identities),
                streaming=streaming,
                status_interval=options.status_interval,
            ).start()
        self._spooler.check()
        return self._spooler

    def initialOffset(self) -> dict:
        return {"lsn": str(self._slot_start())}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_changes is not None:
            return ReadMaxRows(self.options.max_changes)
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _server_lsn(self.options.conninfo)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start_lsn = Lsn.parse(start["lsn"])
        spooler = self._session(start_lsn)
        # Available-now: a batch as soon as there is one, but no end before the target.
        target = self._target
        if target is not None and not spooler.wait_for(
            target, _REDELIVERY_TIMEOUT, after=start_lsn
        ):
            raise SourceError(
                f"slot {self.options.slot!r}: the server did not send up to {self._target} "
                f"within {_REDELIVERY_TIMEOUT:.0f} s"
            )
        max_changes = max_bytes = None
        if not isinstance(limit, ReadAllAvailable):
            max_changes, max_bytes = self.options.max_changes, self.options.max_bytes
            if isinstance(limit, ReadMaxRows):
                max_changes = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
        if target is None:
            self._settle(spooler, start_lsn, max_changes, max_bytes)
        end, _ = spooler.spool.plan(
            start_lsn, max_changes=max_changes, max_bytes=max_bytes, upto=self._target
        )
        return {"lsn": str(end)}

    def _settle(
        self, spooler: Spooler, start: Lsn, max_changes: int | None, max_bytes: int | None
    ) -> None:
        """The first batch of a session that just started waits until it has spooled what
        committed before it started, or a full batch: Spark may ask for one batch only (a
        run of a declarative pipeline, a once trigger: Python sources have no available-now
        there), which must not be whatever arrived in the session's first moments."""
        opened_at, self._opened_at = self._opened_at, None
        if opened_at is None:
            return
        deadline = time.monotonic() + _REDELIVERY_TIMEOUT
        spool = spooler.spool
        while not spooler.wait_for(opened_at, 0.5):
            _, changes = spool.plan(start, max_changes=max_changes)
            full = max_changes is not None and changes >= max_changes
            if full or spool.bytes_held >= min(max_bytes or spool.max_bytes, spool.max_bytes):
                return
            if time.monotonic() > deadline:
                raise SourceError(
                    f"slot {self.options.slot!r}: the server did not send up to {opened_at} "
                    f"within {_REDELIVERY_TIMEOUT:.0f} s"
                )

    def reportLatestOffset(self) -> dict | None:
        if self._spooler is None:
            return None
        last = self._spooler.spool.last_lsn
        return None if last is None else {"lsn": str(last)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_lsn, end_lsn = Lsn.parse(start["lsn"]), Lsn.parse(end["lsn"])
        if end_lsn <= start_lsn:
            return []
        spooler = self._session(start_lsn)
        # After a restart Spark asks again for the batch it had planned: the session sends it
        # again from the slot, which was not confirmed past it.
        if not spooler.wait_for(end_lsn, _REDELIVERY_TIMEOUT):
            raise SourceError(
                f"slot {self.options.slot!r}: changes up to {end_lsn} were not delivered again "
                f"within {_REDELIVERY_TIMEOUT:.0f} s (was the slot advanced by someone else?)"
            )
        partitions: list[InputPartition] = []
        for ranges in spooler.spool.ranges(start_lsn, end_lsn).values():
            current: list[SpoolRange] = []
            for spool_range in ranges:  # tasks of about partitionBytes
                current.append(spool_range)
                if sum(r.length for r in current) >= self.options.partition_bytes:
                    partitions.append(SpoolPartition(load_ranges(current)))
                    current = []
            if current:
                partitions.append(SpoolPartition(load_ranges(current)))
        return partitions

    def commit(self, end: dict) -> None:
        if self._spooler is not None:
            self._spooler.confirm(Lsn.parse(end["lsn"]))

    def stop(self) -> None:
        if self._spooler is not None:
            self._spooler.stop()
            self._spooler = None
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    # -- executor side ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpoolPartition)
        return read_envelope(partition.ranges)


class PgoutputBatchReader(DataSourceReader):
    """Reads the slot's pending changes without consuming them (one task)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        options = self.options
        with (
            tempfile.TemporaryDirectory(prefix="pgcdc-peek-") as directory,
            contextlib.closing(Catalog(options.conninfo)) as catalog,
        ):
            identities = ColumnIdentities(catalog, options.publications)
            spool = Spool(Path(directory) / "spool", identify=identities)
            plugin = SpoolWriter()
            plugin.spool = spool
            with SqlTransport(options.conninfo, options.slot, options.stream_options) as transport:
                ctx = DecodingContext(server_version=transport.conn.info.server_version)
                assembler = TransactionAssembler(plugin, ctx)
                try:
                    upto = None if options.end_lsn is None else Lsn(options.end_lsn + 1)
                    for change in transport.changes(upto_lsn=upto, undecoded_rows=True):
                        assembler.feed(change.message, change.lsn)
                finally:
                    assembler.close()
            ranges = spool.ranges(Lsn(0), spool.last_lsn or Lsn(0))
            start, end = options.start_lsn, options.end_lsn
            for batch in read_envelope([r for found in ranges.values() for r in found]):
                if start is not None or end is not None:
                    lsns = batch.column("commit_lsn")
                    keep = pc.and_(
                        pc.greater_equal(lsns, start or 0),
                        pc.less_equal(lsns, end if end is not None else 2**63 - 1),
                    )
                    batch = batch.filter(keep)
                yield batch
            spool.close()
