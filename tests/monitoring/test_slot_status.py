"""`slot_status` and `wal_warnings` against real servers: a slot being streamed, an inactive
one retaining WAL past a configured limit, one that `max_slot_wal_keep_size` invalidates
(unreserved, then lost at a checkpoint), and on PostgreSQL 18 the count-down to
`idle_replication_slot_timeout` and the invalidation it does. The warnings' thresholds are
checked on the real figures moved past them."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import SlotNotFound
from pgcdc.monitoring import failover_warnings, slot_status, wal_warnings
from replication.helpers import unique, wait_for

from .helpers import create_slot, make_wal, streamed_slot


def test_streamed_slot(pg: Database) -> None:
    with streamed_slot(pg) as (slot, _tail, pid):
        pg.execute("INSERT INTO t SELECT generate_series(1, 1000)")
        written = slot_status(pg.dsn, slot).server_lsn
        status = wait_for(
            lambda: (s := slot_status(pg.dsn, slot)).slot.confirmed_flush_lsn >= written and s,
            timeout=20,
            what="the consumer to confirm the insert",
        )
    slot_info = status.slot
    assert (slot_info.active, slot_info.active_pid) == (True, pid)
    assert status.server_lsn >= slot_info.confirmed_flush_lsn >= written
    assert status.lag_bytes == status.server_lsn - slot_info.confirmed_flush_lsn
    assert status.in_recovery is False
    assert status.server_version // 10000 == pg.version
    assert status.idle_timeout_in is None  # active
    assert wal_warnings(status, max_retained_bytes=1 << 30) == []
    if pg.version >= 17:
        assert (slot_info.failover, slot_info.synced, slot_info.inactive_since) == (
            False,
            False,
            None,
        )
    as_json = status.to_json()
    assert as_json["slot_name"] == slot and as_json["active_pid"] == pid
    assert as_json["confirmed_flush_lsn"] == str(slot_info.confirmed_flush_lsn)
    assert json.loads(json.dumps(as_json)) == as_json


def test_inactive_slot_retains_wal_past_the_configured_size(pg: Database) -> None:
    pg.execute("CREATE TABLE t (id int)")
    slot = create_slot(pg)
    before = slot_status(pg.dsn, slot)
    pg.execute("INSERT INTO t SELECT generate_series(1, 20000)")
    status = slot_status(pg.dsn, slot)
    retained = status.slot.retained_bytes
    assert retained is not None and retained > (before.slot.retained_bytes or 0) + 500_000
    assert status.lag_bytes == status.server_lsn - status.slot.confirmed_flush_lsn > 500_000
    assert status.slot.active is False and status.max_slot_wal_keep_size is None
    assert wal_warnings(status, max_retained_bytes=retained) == []
    (warning,) = wal_warnings(status, max_retained_bytes=retained - 1)
    assert f"slot {slot} retains" in warning and "over the configured" in warning
    assert status.critical is False
    if pg.version >= 17:
        assert status.slot.inactive_since is not None
        assert status.slot.inactive_since <= status.server_time


def test_slot_invalidated_by_max_slot_wal_keep_size(small_keep: Database) -> None:
    db = small_keep
    slot = create_slot(db)
    fresh = slot_status(db.dsn, slot)
    assert fresh.max_slot_wal_keep_size == 1 << 20
    assert fresh.slot.wal_status == "reserved" and not fresh.critical

    make_wal(db, 3)
    doomed = slot_status(db.dsn, slot)
    assert doomed.slot.wal_status == "unreserved" and doomed.critical
    (warning,) = wal_warnings(doomed)
    assert "the next checkpoint invalidates it" in warning

    db.execute("CHECKPOINT")
    lost = slot_status(db.dsn, slot)
    assert lost.slot.wal_status == "lost" and lost.slot.invalidated and lost.critical
    assert lost.slot.restart_lsn is None
    if db.version >= 17:
        assert lost.slot.invalidation_reason == "wal_removed"
    (warning,) = wal_warnings(lost, max_retained_bytes=1)
    assert f"slot {slot} is invalidated" in warning


def test_safe_wal_size_low(small_keep: Database) -> None:
    """The real safe_wal_size, against a tenth of max_slot_wal_keep_size moved around it."""
    slot = create_slot(small_keep)
    status = slot_status(small_keep.dsn, slot)
    safe = status.slot.safe_wal_size
    assert safe is not None and safe > 0
    assert wal_warnings(dataclasses.replace(status, max_slot_wal_keep_size=10 * safe)) == []
    (warning,) = wal_warnings(dataclasses.replace(status, max_slot_wal_keep_size=10 * safe + 10))
    assert "more WAL may be written before max_slot_wal_keep_size" in warning


def test_idle_replication_slot_timeout(small_keep: Database) -> None:
    db = small_keep
    slot = create_slot(db)
    status = slot_status(db.dsn, slot)
    if db.version < 18:
        assert status.idle_timeout is None and status.idle_timeout_in is None
        return
    assert status.idle_timeout == 2
    assert status.idle_timeout_in is not None and 0 < status.idle_timeout_in <= 2
    assert wal_warnings(status) == []
    later = timedelta(seconds=status.idle_timeout_in - 0.1)  # 0.1 s left: under a tenth
    near = dataclasses.replace(status, server_time=status.server_time + later)
    (warning,) = wal_warnings(near)
    assert "idle_replication_slot_timeout invalidates it in" in warning and not near.critical

    time.sleep(max(0.0, status.idle_timeout_in) + 0.1)
    overdue = slot_status(db.dsn, slot)
    assert overdue.idle_timeout_in is not None and overdue.idle_timeout_in <= 0
    assert overdue.critical
    (warning,) = wal_warnings(overdue)
    assert "inactive longer than idle_replication_slot_timeout" in warning

    db.execute("CHECKPOINT")
    lost = slot_status(db.dsn, slot)
    assert lost.slot.invalidation_reason == "idle_timeout" and lost.critical
    assert lost.idle_timeout_in is None


def test_failover_slot_without_synchronized_standby_slots(pg: Database) -> None:
    if pg.version < 17:
        pytest.skip("failover slots exist from PostgreSQL 17")
    slot = unique("failover")
    pg.execute(
        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', failover => true)", (slot,)
    )
    status = slot_status(pg.dsn, slot)
    assert status.slot.failover and status.synchronized_standby_slots == ()
    (warning,) = failover_warnings(status)
    assert "synchronized_standby_slots is not set" in warning
    assert failover_warnings(slot_status(pg.dsn, create_slot(pg))) == []


def test_missing_slot(pg: Database) -> None:
    with pytest.raises(SlotNotFound, match='replication slot "nope" does not exist'):
        slot_status(pg.dsn, "nope")
