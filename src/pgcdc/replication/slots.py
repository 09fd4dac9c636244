"""Replication slots: create, drop, and list with the health facts that matter.

A logical slot pins WAL from its restart_lsn; a consumer that stops (or a slot nobody reads)
makes WAL pile up until the disk fills or `max_slot_wal_keep_size` invalidates the slot.
`list_slots` shows exactly that: retained bytes, wal_status, safe_wal_size, invalidation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from pgcdc.errors import SlotNotFound
from pgcdc.protocol import Lsn
from pgcdc.replication.connection import (
    DEFAULT_SESSION_SETTINGS,
    CreatedSlot,
    ReplicationConnection,
    connection_error,
    parse_conninfo,
)

__all__ = [
    "SlotInfo",
    "connect_sql",
    "create_slot",
    "drop_slot",
    "get_slot",
    "in_recovery",
    "list_slots",
    "read_slots",
    "wal_position_sql",
]


def connect_sql(conninfo: str, *, pinned_settings: bool = False) -> psycopg.Connection:
    """An ordinary autocommit connection, with the same error style as the walsender's.

    With `pinned_settings`, the session prints values exactly as a walsender session of
    pgcdc's does (`DEFAULT_SESSION_SETTINGS`: DateStyle, extra_float_digits, ...)."""
    parse_conninfo(conninfo)  # a malformed string: one line, before psycopg's traceback
    try:
        conn = psycopg.connect(conninfo, autocommit=True, application_name="pgcdc")
    except psycopg.OperationalError as exc:
        raise connection_error(str(exc), conninfo) from None
    if pinned_settings:
        for name, value in DEFAULT_SESSION_SETTINGS.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    return conn


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot_name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    #: WAL kept for this slot: current WAL position minus restart_lsn.
    retained_bytes: int | None
    wal_status: str | None
    safe_wal_size: int | None
    two_phase: bool | None = None
    failover: bool | None = None
    #: On a standby: a copy of a primary's failover slot, kept in sync by the standby (17+).
    synced: bool | None = None
    conflicting: bool | None = None
    invalidation_reason: str | None = None
    inactive_since: datetime | None = None

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.invalidation_reason is not None


# (column, minimum server_version_num)
_OPTIONAL_COLUMNS = [
    ("two_phase", 140000),
    ("failover", 170000),
    ("synced", 170000),
    ("conflicting", 160000),
    ("invalidation_reason", 170000),
    ("inactive_since", 170000),
]


def list_slots(conninfo: str, name: str | None = None) -> list[SlotInfo]:
    with connect_sql(conninfo) as conn:
        return read_slots(conn, name)


def read_slots(conn: psycopg.Connection, name: str | None = None) -> list[SlotInfo]:
    """The slots (or the one named) on the server of an open connection."""
    version = conn.info.server_version
    optional = [c for c, since in _OPTIONAL_COLUMNS if version >= since]
    query = f"""
        SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
               restart_lsn::text, confirmed_flush_lsn::text,
               pg_wal_lsn_diff({wal_position_sql(in_recovery(conn))}, restart_lsn)::bigint,
               wal_status, safe_wal_size {"".join(", " + c for c in optional)}
        FROM pg_replication_slots
        {"WHERE slot_name = %s" if name else ""}
        ORDER BY slot_name"""
    rows = conn.execute(query, (name,) if name else None).fetchall()
    slots = []
    for row in rows:
        fixed = list(row[:12])
        fixed[7] = Lsn.parse(fixed[7]) if fixed[7] else None
        fixed[8] = Lsn.parse(fixed[8]) if fixed[8] else None
        extra = dict(zip(optional, row[12:], strict=True))
        slots.append(SlotInfo(*fixed, **extra))
    return slots


def in_recovery(conn: psycopg.Connection) -> bool:
    """Whether the server is a standby (in recovery)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def wal_position_sql(recovery: bool) -> str:
    """The SQL for the server's WAL position: written WAL on a primary, received on a standby
    (in `recovery`)."""
    return "pg_last_wal_receive_lsn()" if recovery else "pg_current_wal_lsn()"


def create_slot(
    conninfo: str,
    name: str,
    *,
    two_phase: bool = False,
    failover: bool = False,
) -> CreatedSlot:
    """Create a persistent pgoutput slot (for a temporary one or an exported snapshot, use a
    `ReplicationConnection`: both live only as long as that connection)."""
    with ReplicationConnection.connect(conninfo) as conn:
        return conn.create_slot(name, two_phase=two_phase, failover=failover)


def drop_slot(conninfo: str, name: str, *, wait: bool = False) -> None:
    """Drop a slot; with `wait`, wait for the process using it to let go instead of failing."""
    with ReplicationConnection.connect(conninfo) as conn:
        conn.drop_slot(name, wait=wait)


def get_slot(conninfo: str, name: str) -> SlotInfo:
    found = list_slots(conninfo, name)
    if not found:
        raise SlotNotFound(f'replication slot "{name}" does not exist')
    return found[0]
