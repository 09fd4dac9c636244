"""A slot's health as the server sees it, and the warnings that come before the server
invalidates it.

`slot_status` reads everything in one short session (and, given a standby, the standby's copy
of a failover slot); `wal_warnings` judges it without I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgcdc.errors import MonitoringError, SlotNotFound
from pgcdc.monitoring.units import format_bytes, format_seconds
from pgcdc.protocol import Lsn
from pgcdc.replication.slots import (
    SlotInfo,
    connect_sql,
    in_recovery,
    read_slots,
    wal_position_sql,
)

__all__ = ["SlotStatus", "StandbyCopy", "failover_warnings", "slot_status", "wal_warnings"]

#: `safe_wal_size` below this share of `max_slot_wal_keep_size` is worth a warning; so is an
#: inactive slot with less than this share of `idle_replication_slot_timeout` left.
LOW_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class StandbyCopy:
    """A failover slot's copy on a physical standby (PostgreSQL 17+), read on the standby."""

    #: The standby holds a copy of the slot.
    present: bool
    #: The copy is kept in sync with the primary's slot (`pg_replication_slots.synced`).
    synced: bool = False
    #: Persistent, so usable after a promotion (the standby keeps a new copy temporary until
    #: the primary's slot has moved past what the standby can guarantee).
    sync_ready: bool = False
    confirmed_flush_lsn: Lsn | None = None
    #: The primary's confirmed_flush_lsn minus the copy's: what a consumer resuming on the
    #: promoted standby from the slot's own position (not its own) would receive again.
    behind_bytes: int | None = None
    invalidation_reason: str | None = None


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """A slot and the server figures it is judged against, read in one session."""

    slot: SlotInfo
    #: `server_version_num`, e.g. 180004.
    server_version: int
    #: The server is a standby.
    in_recovery: bool
    #: The server's WAL position (written on a primary, received on a standby).
    server_lsn: Lsn
    #: The server's clock when this was read.
    server_time: datetime
    #: `max_slot_wal_keep_size` in bytes; None when unlimited.
    max_slot_wal_keep_size: int | None
    #: `idle_replication_slot_timeout` in seconds (PostgreSQL 18+); None when off or absent.
    idle_timeout: int | None
    #: `synchronized_standby_slots` (PostgreSQL 17+): the physical slots of the standbys
    #: that must have WAL before a failover slot's changes are sent.
    synchronized_standby_slots: tuple[str, ...] = ()
    #: The slot's copy on a standby, when a standby was asked.
    standby: StandbyCopy | None = None

    @property
    def lag_bytes(self) -> int | None:
        """WAL written since the position the consumer confirmed."""
        confirmed = self.slot.confirmed_flush_lsn
        return None if confirmed is None else max(0, self.server_lsn - confirmed)

    @property
    def idle_timeout_in(self) -> float | None:
        """Seconds before `idle_replication_slot_timeout` invalidates this inactive slot (the
        server does it at the first checkpoint after that; negative: overdue); None when it
        does not apply (no timeout, active, invalidated, reserving no WAL, or a copy a standby
        keeps in sync)."""
        slot = self.slot
        if (
            not self.idle_timeout
            or slot.active
            or slot.inactive_since is None
            or slot.invalidated
            or slot.restart_lsn is None
            or (slot.synced and self.in_recovery)
        ):
            return None
        idle_for = (self.server_time - slot.inactive_since).total_seconds()
        return self.idle_timeout - idle_for

    @property
    def critical(self) -> bool:
        """The slot is lost, or will be at the next checkpoint unless read."""
        left = self.idle_timeout_in
        return (
            self.slot.invalidated
            or self.slot.wal_status == "unreserved"
            or (left is not None and left <= 0)
        )

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON values: LSNs as ``X/Y``, times in ISO 8601, sizes in bytes."""
        fields = {f.name: getattr(self.slot, f.name) for f in dataclasses.fields(self.slot)}
        fields |= {
            "server_version": self.server_version,
            "in_recovery": self.in_recovery,
            "server_lsn": self.server_lsn,
            "server_time": self.server_time,
            "max_slot_wal_keep_size": self.max_slot_wal_keep_size,
            "lag_bytes": self.lag_bytes,
            "idle_replication_slot_timeout": self.idle_timeout,
            "idle_timeout_in": self.idle_timeout_in,
            "synchronized_standby_slots": list(self.synchronized_standby_slots),
            "standby": None if self.standby is None else dataclasses.asdict(self.standby),
        }
        return _jsonable(fields)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Lsn):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def slot_status(conninfo: str, slot: str, *, standby: str | None = None) -> SlotStatus:
    """The status of `slot` on the server of `conninfo`; with `standby` (a conninfo), also
    its copy there. SlotNotFound when the slot does not exist."""
    with connect_sql(conninfo) as conn:
        found = read_slots(conn, slot)
        if not found:
            raise SlotNotFound(f'replication slot "{slot}" does not exist')
        version = conn.info.server_version
        recovery = in_recovery(conn)
        row = conn.execute(
            f"""SELECT {wal_position_sql(recovery)}::text, clock_timestamp(),
                       pg_size_bytes(current_setting('max_slot_wal_keep_size')),
                       (SELECT setting::int FROM pg_settings
                        WHERE name = 'idle_replication_slot_timeout'),
                       current_setting('synchronized_standby_slots', true)"""
        ).fetchone()
    assert row is not None
    position, now, keep, idle_timeout, standby_slots = row
    info = found[0]
    return SlotStatus(
        slot=info,
        server_version=version,
        in_recovery=recovery,
        server_lsn=Lsn.parse(position) if position else Lsn(0),
        server_time=now,
        max_slot_wal_keep_size=None if keep < 0 else int(keep),
        idle_timeout=idle_timeout or None,
        synchronized_standby_slots=tuple(
            name.strip() for name in (standby_slots or "").split(",") if name.strip()
        ),
        standby=None if standby is None else _standby_copy(standby, info),
    )


def _standby_copy(conninfo: str, primary: SlotInfo) -> StandbyCopy:
    with connect_sql(conninfo) as conn:
        if not in_recovery(conn):
            raise MonitoringError("the server given as the standby is not in recovery")
        if conn.info.server_version < 170000:
            return StandbyCopy(present=False)
        found = read_slots(conn, primary.slot_name)
    if not found:
        return StandbyCopy(present=False)
    copy = found[0]
    behind = None
    if copy.confirmed_flush_lsn is not None and primary.confirmed_flush_lsn is not None:
        behind = max(0, primary.confirmed_flush_lsn - copy.confirmed_flush_lsn)
    return StandbyCopy(
        present=True,
        synced=bool(copy.synced),
        sync_ready=bool(copy.synced) and not copy.temporary,
        confirmed_flush_lsn=copy.confirmed_flush_lsn,
        behind_bytes=behind,
        invalidation_reason=copy.invalidation_reason,
    )


def wal_warnings(status: SlotStatus, max_retained_bytes: int | None = None) -> list[str]:
    """What endangers the slot, most urgent first; [] when nothing does.

    Invalidation (the slot is lost); `wal_status` unreserved (lost at the next checkpoint);
    retained WAL over `max_retained_bytes` (the pipeline's configured limit, None: none);
    `safe_wal_size` below a tenth of `max_slot_wal_keep_size`; an inactive slot with less
    than a tenth of `idle_replication_slot_timeout` left, or none.
    """
    slot = status.slot
    name = slot.slot_name
    if slot.invalidated:
        reason = slot.invalidation_reason or f"wal_status {slot.wal_status}"
        return [
            f"slot {name} is invalidated ({reason}): the server no longer has the WAL of "
            "its changes; the tables must be copied anew"
        ]
    warnings = []
    if slot.wal_status == "unreserved":
        warnings.append(
            f"slot {name} retains more WAL than max_slot_wal_keep_size "
            f"({format_bytes(status.max_slot_wal_keep_size)}): the next checkpoint "
            "invalidates it unless it is read"
        )
    retained = slot.retained_bytes
    if max_retained_bytes is not None and retained is not None and retained > max_retained_bytes:
        warnings.append(
            f"slot {name} retains {format_bytes(retained)} of WAL, over the configured "
            f"{format_bytes(max_retained_bytes)}"
        )
    keep = status.max_slot_wal_keep_size
    safe = slot.safe_wal_size
    if keep is not None and safe is not None and 0 <= safe < keep * LOW_SHARE:
        warnings.append(
            f"slot {name}: only {format_bytes(safe)} more WAL may be written before "
            f"max_slot_wal_keep_size ({format_bytes(keep)}) invalidates it"
        )
    left = status.idle_timeout_in
    if left is not None and status.idle_timeout is not None:
        if left <= 0:
            warnings.append(
                f"slot {name} has been inactive longer than idle_replication_slot_timeout "
                f"({format_seconds(status.idle_timeout)}): the next checkpoint invalidates it"
            )
        elif left < status.idle_timeout * LOW_SHARE:
            warnings.append(
                f"slot {name} is inactive: idle_replication_slot_timeout invalidates it in "
                f"{format_seconds(left)}"
            )
    return warnings


def failover_warnings(status: SlotStatus) -> list[str]:
    """What a failover to a standby would cost this failover slot; [] for other slots.

    Without `synchronized_standby_slots` a consumer can receive changes that no standby has
    yet (lost by a failover, though the consumer applied them); a standby asked (`standby`)
    that has no copy, or only a temporary one, loses the slot in a failover."""
    if not status.slot.failover or status.in_recovery:
        return []
    warnings = []
    if not status.synchronized_standby_slots:
        warnings.append(
            "synchronized_standby_slots is not set: the consumer may receive changes that no "
            "standby has yet, which a failover would then lose"
        )
    standby = status.standby
    if standby is not None and not standby.present:
        warnings.append("the standby has no copy of the slot: a failover to it loses the slot")
    elif standby is not None and not standby.sync_ready:
        warnings.append(
            "the standby's copy of the slot is not sync-ready yet (temporary): a failover to "
            "it now loses the slot"
        )
    return warnings
