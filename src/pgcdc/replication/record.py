"""Recording a replication session into a capture file (`pgcdc record`)."""

from __future__ import annotations

import time
from pathlib import Path

from pgcdc import __version__
from pgcdc.capture import CaptureHeader, CaptureWriter
from pgcdc.output_file import OutputFile
from pgcdc.protocol import Lsn
from pgcdc.replication.acknowledgement import end_lsn_of
from pgcdc.replication.client import ReplicationClient
from pgcdc.replication.stream import LogicalStream, now_pg_timestamp

__all__ = ["record"]

SYNC_INTERVAL = 1.0


def _header(stream: LogicalStream, note: str) -> CaptureHeader:
    options = stream.options
    return CaptureHeader(
        proto_version=options.proto_version or 1,
        streaming=str(options.streaming),
        binary=options.binary,
        messages=options.messages,
        two_phase=options.two_phase,
        origin=None if options.origin is None else str(options.origin),
        publication_names=list(options.publication_names),
        server_version=stream.conn.server_version,
        slot=stream.slot,
        system_id=stream.identity.systemid if stream.identity else "",
        start_lsn=str(stream.start_lsn),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        pgcdc_version=__version__,
        note=note,
    )


def record(client: ReplicationClient, path: Path | OutputFile, note: str = "") -> int:
    """Write every frame `client` receives to `path` (a file opened already: closed when
    done); returns the number of messages.

    The capture is the durable sink: a transaction is confirmed to the server only after the
    file holding it was made durable (`OutputFile.sync`: fsynced; a device or a pipe, which
    cannot be, is said once and confirmed as written). One session only (the client must not
    reconnect: a new session re-sends Relation messages and would make the capture describe
    two sessions).
    """
    if client.reconnect:
        raise ValueError("record() needs a client with reconnect=False")
    # Appending, and emptied only once the session started: a run that fails to start
    # leaves an existing file as it was.
    with path if isinstance(path, OutputFile) else OutputFile(path) as output:
        writer: CaptureWriter | None = None

        def on_frame(frame: bytes) -> None:
            assert writer is not None
            with output.reporting():
                writer.write(frame, now_pg_timestamp())

        def on_session(stream: LogicalStream) -> None:
            nonlocal writer
            output.empty()
            with output.reporting():
                writer = CaptureWriter(output.file, _header(stream, note))

        client.on_frame, client.on_session = on_frame, on_session
        count = 0
        last_sync = time.monotonic()
        pending: Lsn | None = None
        with client:
            try:
                for _frame, message in client:
                    count += 1
                    end = end_lsn_of(message)
                    if end is None:
                        continue
                    pending = end
                    if time.monotonic() - last_sync > SYNC_INTERVAL:
                        output.sync()
                        last_sync = time.monotonic()
                        client.confirm(pending)
            finally:
                # Durable first, then confirmed: leaving `with client` reports the position.
                # After a failed write nothing more is: the slot stays at the last sync.
                if writer is not None and not output.failed:
                    with output.reporting():
                        writer.close()
                    output.sync()
                    if pending is not None and client.stream is not None:
                        client.confirm(pending)
    return count
