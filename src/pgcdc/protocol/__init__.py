"""Sans-I/O codec for the pgoutput logical replication protocol (versions 1-4).

Bytes in, typed messages out, and back: nothing here opens a socket or a file.
"""

from pgcdc.protocol.decoder import MAX_PROTO_VERSION, Decoder, StreamingMode
from pgcdc.protocol.encoder import encode, encode_tuple
from pgcdc.protocol.frames import (
    PrimaryKeepalive,
    StandbyStatusUpdate,
    UndecodedChanges,
    XLogData,
    encode_frame,
)
from pgcdc.protocol.lsn import INVALID_LSN, Lsn, datetime_to_pg_timestamp, pg_timestamp_to_datetime
from pgcdc.protocol.messages import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgoutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    UndecodedChange,
    Update,
)
from pgcdc.protocol.speedups import parse_frame

__all__ = [
    "INVALID_LSN",
    "MAX_PROTO_VERSION",
    "Begin",
    "BeginPrepare",
    "Column",
    "Commit",
    "CommitPrepared",
    "Decoder",
    "Delete",
    "Insert",
    "Lsn",
    "Message",
    "Origin",
    "PgoutputMessage",
    "Prepare",
    "PrimaryKeepalive",
    "Relation",
    "RollbackPrepared",
    "StandbyStatusUpdate",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "StreamingMode",
    "Truncate",
    "TupleData",
    "Type",
    "UndecodedChange",
    "UndecodedChanges",
    "Update",
    "XLogData",
    "datetime_to_pg_timestamp",
    "encode",
    "encode_frame",
    "encode_tuple",
    "parse_frame",
    "pg_timestamp_to_datetime",
]
