"""The CopyBoth loop of one walsender session: frames in, decoded messages out, feedback back.

`LogicalStream` owns a `ReplicationConnection` in CopyBoth mode. It answers keepalives, sends
standby status updates on a timer and whenever the server asks, and reports as flushed only
what the `Acknowledgement` state machine allows. It decodes with the codec; it never looks
inside a tuple.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import cast

from pgcdc.errors import (
    InvalidStartPosition,
    PublicationNotFound,
    SlotPluginMismatch,
    UnsupportedOption,
)
from pgcdc.protocol import (
    INVALID_LSN,
    Decoder,
    Lsn,
    PgoutputMessage,
    PrimaryKeepalive,
    StandbyStatusUpdate,
    UndecodedChanges,
    XLogData,
    datetime_to_pg_timestamp,
    encode_frame,
    parse_frame,
)
from pgcdc.protocol.lsn import PG_EPOCH
from pgcdc.replication.acknowledgement import Acknowledgement
from pgcdc.replication.connection import (
    DEFAULT_SESSION_SETTINGS,
    ReplicationConnection,
    SystemIdentity,
)
from pgcdc.replication.options import StreamOptions
from pgcdc.replication.quoting import literal

__all__ = ["LogicalStream", "now_pg_timestamp"]

log = logging.getLogger("pgcdc.replication")

#: At most this many bytes of row changes go into one `UndecodedChanges`.
_RUN_BYTES = 1 << 20

_UNIX_TO_PG_MICROS = datetime_to_pg_timestamp(PG_EPOCH.replace(year=1970))


def now_pg_timestamp() -> int:
    """Current time as microseconds since 2000-01-01 UTC, for status updates."""
    return time.time_ns() // 1000 + _UNIX_TO_PG_MICROS


class LogicalStream:
    """Streams decoded pgoutput messages from a slot, one walsender session.

    `start_lsn` is the position the consumer has durably handled; the server starts at the
    later of it and the slot's confirmed_flush_lsn. `endpos` stops the stream once a
    transaction ending at or after it was delivered (or an idle keepalive passed it); with
    `until_idle`, `endpos` is the server's WAL position when the stream started. With
    `acknowledge=False` the slot is never moved. `acks` carries the acknowledgement state
    over the sessions of one consumer (`ReplicationClient`); by default the stream has its own.
    `undecoded_rows` leaves row changes undecoded (`pgcdc.protocol.UndecodedChange`).
    """

    def __init__(
        self,
        conn: ReplicationConnection,
        slot: str,
        options: StreamOptions,
        start_lsn: Lsn = INVALID_LSN,
        *,
        status_interval: float = 10.0,
        endpos: Lsn | None = None,
        until_idle: bool = False,
        on_frame: Callable[[bytes], None] | None = None,
        acknowledge: bool = True,
        acks: Acknowledgement | None = None,
        before_status: Callable[[], None] | None = None,
        undecoded_rows: bool = False,
    ) -> None:
        self.conn = conn
        self.slot = slot
        self.options = options.negotiate(conn.server_version)
        assert self.options.proto_version is not None
        self.start_lsn = Lsn(start_lsn)
        self.status_interval = status_interval
        self.endpos = endpos
        self.until_idle = until_idle
        self.on_frame = on_frame
        #: Called before each status update that may move the slot: a consumer that confirms
        #: what it wrote but syncs it in batches makes it durable here (e.g. one fsync).
        self.before_status = before_status
        self.acknowledge = acknowledge
        self.acks = acks if acks is not None else Acknowledgement(start=self.start_lsn)
        self.decoder = Decoder(
            self.options.proto_version, self.options.streaming, undecoded_rows=undecoded_rows
        )
        self.identity: SystemIdentity | None = None
        self._last_status = 0.0
        self._stopped = False
        #: Set (from any thread) to end iteration at the next message or within a second.
        self.stop_requested = False
        #: Ask for a keepalive after each quiet second, so `acks.keepalive_wal_end` follows
        #: the server closely (a consumer waiting for a position needs that; endpos implies it).
        self.ping_when_idle = False
        #: Set (from any thread) to send a status update at the next wake-up: a consumer that
        #: confirms from another thread wants the slot to move now, not at the next interval.
        self.status_due = False
        #: Called (on the stream's thread) whenever it is about to wait for the server; it
        #: may ask to be called again within the seconds it returns
        #: (`ReplicationConnection.read_copy_data`).
        self.on_wait: Callable[[], float | None] | None = None

    def start(self) -> None:
        self.identity = self.conn.identify_system()
        if self.start_lsn > self.identity.xlogpos:
            # The server would start there and the slot would be confirmed past every change
            # in between, unsent: refuse instead.
            raise InvalidStartPosition(
                f"start position {self.start_lsn} is past the server's WAL end "
                f"{self.identity.xlogpos} (slot {self.slot!r}); nothing was confirmed"
            )
        if self.until_idle and self.endpos is None:
            self.endpos = self.identity.xlogpos
        self.conn.apply_settings(DEFAULT_SESSION_SETTINGS | self.options.settings)
        self._check_session()
        self.conn.start_replication(self.slot, self.start_lsn, self.options)
        self.acks.session_started()
        self._last_status = time.monotonic()

    def _check_session(self) -> None:
        """Refuse, before streaming, what would otherwise fail later or silently.

        A missing publication: PG18 only warns and skips it, older servers fail once the
        first change is decoded. A slot of another output plugin (or a physical one): the
        server would reject pgoutput's options one by one. A two-phase slot: the server
        decodes prepared transactions at PREPARE whatever the session asks, and a session
        below proto_version 3 cannot carry them.
        """
        names = ",".join(literal(n) for n in self.options.publication_names)
        found = {
            row[0]
            for row in self.conn.execute(
                f"SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ({names})",
                "checking publications",
            )
        }
        missing = [n for n in self.options.publication_names if n not in found]
        if missing:
            database = self.identity.dbname if self.identity else "?"
            raise PublicationNotFound(
                f"publication {', '.join(map(repr, missing))} does not exist "
                f"in database {database!r}"
            )
        two_phase = "two_phase" if self.conn.server_version >= 140000 else "false"
        rows = self.conn.execute(
            f"SELECT slot_type, plugin, {two_phase} FROM pg_catalog.pg_replication_slots "
            f"WHERE slot_name = {literal(self.slot)}",
            "checking the slot",
        )
        if not rows:
            return  # START_REPLICATION says that the slot does not exist
        slot_type, plugin, decodes_prepared = rows[0]
        if slot_type != "logical" or plugin != "pgoutput":
            kind = f"uses output plugin {plugin}" if plugin else f"is a {slot_type} slot"
            raise SlotPluginMismatch(
                f"slot {self.slot!r} {kind}; pgcdc needs a logical slot of plugin pgoutput "
                "(pgcdc slot create NAME makes one)"
            )
        proto = self.options.proto_version or 1
        if decodes_prepared == "t" and proto < 3:
            raise UnsupportedOption(
                f"slot {self.slot!r} decodes prepared transactions (two-phase), which "
                f"needs proto_version 3 or higher; {proto} was requested"
            )

    def confirm(self, lsn: Lsn) -> None:
        """The consumer has durably handled everything up to `lsn` (a delivered end LSN)."""
        self.acks.confirm(lsn)

    @property
    def flush_lsn(self) -> Lsn:
        return self.acks.flush_lsn

    def send_status(self, reply_requested: bool = False) -> None:
        acks = self.acks
        if self.acknowledge and self.before_status is not None:
            self.before_status()
        # Flush 0 leaves the slot where it is (the server ignores a zero flush position).
        flush = acks.flush_lsn if self.acknowledge else INVALID_LSN
        update = StandbyStatusUpdate(
            acks.write_lsn, flush, flush, now_pg_timestamp(), reply_requested
        )
        self.conn.send_copy_data(encode_frame(update))
        self._last_status = time.monotonic()

    def _stop(self) -> None:
        """Stopping at endpos: say which streamed transactions are left open (not confirmed;
        the slot sends each again once it commits)."""
        if self.acks.open_streams:
            xids = ", ".join(map(str, sorted(self.acks.open_streams)))
            plural = "s" if len(self.acks.open_streams) > 1 else ""
            log.warning(
                "stopped at %s with streamed transaction%s %s still open (not committed): "
                "not confirmed; the slot sends %s again, whole, once %s",
                self.endpos,
                plural,
                xids,
                "them" if plural else "it",
                "they commit" if plural else "it commits",
            )

    def __iter__(self) -> Iterator[tuple[XLogData, PgoutputMessage]]:
        """Decoded messages with their XLogData frames, until stopped or past endpos
        (`Acknowledgement.may_stop`).

        With `undecoded_rows`, row changes that arrived together come as one
        `UndecodedChanges` (with its last frame): those libpq holds already are taken
        without waiting for more. A transaction counts as handled by the consumer
        (`Acknowledgement.handled_upto`) once the consumer asks for the message after its end.
        """
        acks = self.acks
        decoder = self.decoder
        read = self.conn.read_copy_data
        read_buffered = self.conn.read_buffered
        row_frame = decoder.row_frame if decoder.undecoded_rows else None
        on_frame = self.on_frame
        endpos = self.endpos
        if acks.may_stop(self.start_lsn, endpos):
            return
        pinged = False
        data: bytes | None = None  # read after a run of row changes, not handled yet
        while not self._stopped and not self.stop_requested:
            if data is None:
                now = time.monotonic()
                wait = self._last_status + self.status_interval - now
                if wait <= 0 or self.status_due:
                    self.status_due = False
                    self.send_status()
                    wait = self.status_interval
                # Wake often enough to see endpos, stop requests, due updates and the timer.
                data = read(min(wait, 0.2), self.on_wait)
                if data is None:
                    if (endpos is not None or self.ping_when_idle) and not pinged:
                        # Ask for a keepalive: it tells where the walsender is once idle.
                        self.send_status(reply_requested=True)
                        pinged = True
                    continue
                pinged = False
                if on_frame is not None:
                    on_frame(data)
            if row_frame is not None and row_frame(data):
                frames = [data]
                size = len(data)
                data = None
                while size < _RUN_BYTES and (data := read_buffered()) is not None:
                    if on_frame is not None:
                        on_frame(data)
                    if not row_frame(data):
                        break
                    frames.append(data)
                    size += len(data)
                    data = None
                last = cast(XLogData, parse_frame(frames[-1]))
                run = UndecodedChanges(frames)
                acks.on_message(run, last.data_start)
                yield last, run
                continue
            frame = parse_frame(data)
            data = None
            if type(frame) is XLogData:
                message = decoder.decode(frame.payload, frame.data_start)
                if message is None:
                    continue
                if (
                    endpos is not None
                    and frame.data_start
                    and acks.may_stop(Lsn(frame.data_start - 1), endpos)
                ):
                    # A message that starts past endpos: everything before it was sent.
                    self._stop()
                    return
                end = acks.on_message(message, frame.data_start)
                yield frame, message
                if end is not None:
                    acks.handled_upto(end)
                    if acks.may_stop(end, endpos):
                        self._stop()
                        return
            elif type(frame) is PrimaryKeepalive:
                acks.on_keepalive(frame.wal_end)
                if frame.reply_requested:
                    self.send_status()
                if acks.may_stop(frame.wal_end, endpos):
                    self._stop()
                    return

    def stop(self) -> None:
        """Report the final position and leave CopyBoth cleanly (CopyDone)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.send_status()
        finally:
            self.conn.end_copy()
