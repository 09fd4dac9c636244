"""Runs an output plugin on a slot: startup, the replication client, the assembler, shutdown.

The plugin's startup decides what pgoutput is asked for (streaming and two-phase only when the
plugin has those callbacks and keeps them enabled; messages when it has a message callback;
``origin 'none'`` on 16+ when it wants only local changes). A position is confirmed to the
server only after the callback that finished its transaction returned and the sink made the
output durable (`on_durable`), or, with ``auto_confirm=False``, when the consumer says so
(`confirm`); the client's `Acknowledgement` caps it by the prepared transactions held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

from pgcdc.decoding.assembler import AssemblerStats, TransactionAssembler
from pgcdc.decoding.catalog import Catalog
from pgcdc.decoding.context import DecodingContext, OutputWrite
from pgcdc.decoding.plugin import OutputPlugin, OutputPluginOptions, capabilities, load_plugin
from pgcdc.decoding.spill import DEFAULT_MEMORY_LIMIT, SpillPool
from pgcdc.protocol import Begin, CommitPrepared, Lsn, StreamCommit, StreamingMode
from pgcdc.replication.client import ReplicationClient
from pgcdc.replication.options import OriginFilter, StreamOptions
from pgcdc.replication.stream import LogicalStream

__all__ = ["PluginRunner"]

#: The messages after which the changes of a committed transaction are delivered (their xid:
#: its): a Begin, a streamed or a prepared transaction's commit (the assembler delivers one
#: held until then). Not a prepare: that transaction is not visible before its commit.
_COMMITTED = frozenset({Begin, StreamCommit, CommitPrepared})


class PluginRunner:
    """One plugin instance fed from one slot.

    `stream_options` holds the user's requests; `streaming=None` there means "on when the
    plugin streams". The rest of the keyword arguments go to `ReplicationClient`.
    """

    def __init__(
        self,
        conninfo: str,
        slot: str,
        plugin: type[OutputPlugin] | str,
        stream_options: StreamOptions,
        *,
        plugin_options: dict[str, str | None] | None = None,
        sink: Callable[[OutputWrite], None] | None = None,
        on_durable: Callable[[], None] | None = None,
        is_init: bool = False,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        spill_dir: str | None = None,
        streaming: StreamingMode | str | None = None,
        auto_confirm: bool = True,
        on_session: Callable[[LogicalStream], None] | None = None,
        **client_options: object,
    ) -> None:
        self.plugin_class = load_plugin(plugin) if isinstance(plugin, str) else plugin
        self.caps = capabilities(self.plugin_class)
        self.conninfo = conninfo
        self.slot = slot
        self.requested = stream_options
        self.streaming_request = None if streaming is None else StreamingMode(streaming)
        self.on_durable = on_durable
        self.auto_confirm = auto_confirm
        self.on_session = on_session
        self.client_options = client_options
        self.catalog = Catalog(conninfo)
        server_version = int(self.catalog.query("SHOW server_version_num")[0][0])
        self.ctx = DecodingContext(
            options=dict(plugin_options or {}),
            slot_name=slot,
            server_version=server_version,
            catalog=self.catalog,
            streaming=self.caps.streaming and server_version >= 140000,
            two_phase=self.caps.two_phase and server_version >= 150000,
            sink=sink,
        )
        self.plugin = self.plugin_class()
        self.plugin_options = OutputPluginOptions()
        self.pool = SpillPool(memory_limit, spill_dir)
        self.client: ReplicationClient | None = None
        self._only_local = False
        self._started = False
        self._is_init = is_init
        self.assembler: TransactionAssembler | None = None

    def _startup(self) -> StreamOptions:
        ctx = self.ctx
        self.plugin.startup(ctx, self.plugin_options, self._is_init)
        self._started = True
        ctx.output_type = self.plugin_options.output_type
        requested = self.requested
        if self.streaming_request is not None:
            streaming = self.streaming_request
        elif ctx.streaming:
            streaming = StreamingMode.ON
        else:
            streaming = StreamingMode.OFF
        ctx.streaming = ctx.streaming and streaming is not StreamingMode.OFF
        ctx.two_phase = ctx.two_phase and requested.two_phase
        origin = requested.origin
        local = self.plugin_options.only_local
        if local and ctx.server_version >= 160000:
            origin = OriginFilter.NONE
        self._only_local = local and ctx.server_version < 160000
        return replace(
            requested,
            binary=requested.binary or self.plugin_options.binary,
            messages=requested.messages
            or self.caps.has("message")
            or self.caps.has("stream_message"),
            streaming=streaming,
            origin=origin,
        )

    def run(self) -> AssemblerStats:
        """Stream until endpos, `stop()` or an error; shutdown always runs after startup."""
        try:
            options = self._startup()
            self.client = client = ReplicationClient(
                self.conninfo,
                self.slot,
                options,
                on_session=self._session_started,
                undecoded_rows=self.plugin_class.undecoded_rows,
                **self.client_options,  # type: ignore[arg-type]
            )
            self.assembler = assembler = TransactionAssembler(
                self.plugin,
                self.ctx,
                pool=self.pool,
                only_local=self._only_local,
                acks=client.acks,
            )
            catalog = self.catalog
            with client:
                for frame, message in client:
                    if type(message) in _COMMITTED:  # (a prepared one is not visible yet)
                        catalog.committed(cast(Begin | StreamCommit | CommitPrepared, message).xid)
                    end = assembler.feed(message, frame.data_start)
                    if end is not None and self.auto_confirm and end > client.acks.durable:
                        if self.on_durable is not None:
                            self.on_durable()
                        client.confirm(end)
            return assembler.stats
        finally:
            self.close()

    def _session_started(self, stream: LogicalStream) -> None:
        if self.assembler is not None:
            self.assembler.reset()
        if self.on_session is not None:
            self.on_session(stream)

    def confirm(self, lsn: Lsn) -> None:
        """With ``auto_confirm=False``: the consumer made everything up to `lsn` (a delivered
        transaction's end) durable; the slot moves at once. Safe to call from another thread,
        also while the client reconnects."""
        client = self.client
        if client is None:
            return  # nothing was received yet: the slot is where it was
        # Durable up to `lsn` is durable up to what the server sent, if that is less.
        client.confirm(min(Lsn(lsn), client.acks.received))
        stream = client.stream
        if stream is not None:
            stream.status_due = True

    def stop(self) -> None:
        if self.client is not None:
            self.client.stop()

    def close(self) -> None:
        try:
            if self._started:
                self._started = False
                self.plugin.shutdown(self.ctx)
        finally:
            if self.assembler is not None:
                self.assembler.close()
            else:
                self.pool.close()
            self.catalog.close()
