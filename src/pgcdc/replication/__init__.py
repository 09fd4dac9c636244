"""The edges that touch PostgreSQL: walsender sessions, acknowledgement, slots, publications."""

from pgcdc.replication.acknowledgement import Acknowledgement, Phase, end_lsn_of
from pgcdc.replication.client import ReplicationClient
from pgcdc.replication.connection import (
    DEFAULT_SESSION_SETTINGS,
    CreatedSlot,
    ReplicationConnection,
    SystemIdentity,
)
from pgcdc.replication.options import OriginFilter, StreamOptions, max_proto_version
from pgcdc.replication.stream import LogicalStream

__all__ = [
    "DEFAULT_SESSION_SETTINGS",
    "Acknowledgement",
    "CreatedSlot",
    "LogicalStream",
    "Phase",
    "OriginFilter",
    "ReplicationClient",
    "ReplicationConnection",
    "StreamOptions",
    "SystemIdentity",
    "end_lsn_of",
    "max_proto_version",
]
