"""Failover slots (PostgreSQL 17+) on a real physical standby made with pg_basebackup.

The standby synchronizes the primary's failover slot (`sync_replication_slots`); the primary
sends a failover slot's changes only once the standby has their WAL
(`synchronized_standby_slots`). A `ReplicationClient` streaming under a steady write load, with
a multi-host conninfo that asks for a read-write server, survives the primary's shutdown and
the standby's promotion and goes on on the new primary: every transaction the new primary holds
is delivered exactly once, and every commit the writer saw acknowledged is there.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from pgcdc.embedded import Database, EmbeddedServer, EmbeddedServerError, available_versions
from pgcdc.monitoring import failover_warnings, slot_status
from pgcdc.replication import slots

from .helpers import TailThread, run_cli, unique, wait_active, wait_for

ROWS_PER_TRANSACTION = 3


@pytest.fixture
def primary() -> Iterator[EmbeddedServer]:
    """A server of its own: the standby changes its settings (synchronized_standby_slots)."""
    if 18 not in available_versions():
        pytest.skip("PostgreSQL 18 not installed")
    with EmbeddedServer(18) as server:
        yield server


def synced_slot(standby: EmbeddedServer, slot: str) -> tuple[bool, bool, str] | None:
    """(synced, temporary, confirmed_flush_lsn) of `slot` on the standby, None while absent."""
    rows = standby.query(
        "SELECT synced, temporary, confirmed_flush_lsn::text FROM pg_replication_slots"
        " WHERE slot_name = %s",
        (slot,),
    )
    return rows[0] if rows else None


def wait_until_sync_ready(db: Database, standby: EmbeddedServer, slot: str) -> None:
    """Wait until the standby holds a persistent copy of `slot`.

    The standby keeps its copy temporary while the primary's slot still needs older WAL or an
    older catalog xmin than the standby can guarantee; the primary's slot moves past those
    only by decoding a running-transactions record (logged every 15 s of activity, or at a
    checkpoint). So log one and move the still unused slot over it, again until the copy is
    persistent.
    """

    def ready() -> bool:
        row = synced_slot(standby, slot)
        if row and row[0] and not row[1]:
            return True
        db.execute("SELECT pg_log_standby_snapshot()")
        db.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
        return False

    wait_for(ready, timeout=60, interval=0.5, what=f"a persistent copy of {slot} on the standby")


class Writer(threading.Thread):
    """Commits one transaction of `ROWS_PER_TRANSACTION` rows after another, reconnecting
    through `conninfo` (whichever server is read-write) when a connection breaks. `acked`
    holds the transactions whose COMMIT returned; one cut off mid-way may or may not have
    committed."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(name="writer", daemon=True)
        self.conninfo = conninfo
        self.acked: list[int] = []
        self.failures = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        batch = 0
        try:
            while not self.stopping.is_set():
                try:
                    if conn is None:
                        conn = psycopg.connect(self.conninfo, autocommit=True)
                    batch += 1
                    conn.execute(
                        "INSERT INTO t SELECT %s, i FROM generate_series(1, %s) i",
                        (batch, ROWS_PER_TRANSACTION),
                    )
                    self.acked.append(batch)
                except psycopg.OperationalError:
                    self.failures += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.stopping.wait(0.1)
                    continue
                self.stopping.wait(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            if conn is not None:
                conn.close()


def delivered_batches(tail: TailThread) -> Counter[int]:
    """How often each batch arrived as a whole transaction of the expected rows."""
    counts: Counter[int] = Counter()
    for changes in tail.collector.transactions:
        batches = {change[2][0] for change in changes}
        assert len(batches) == 1 and len(changes) == ROWS_PER_TRANSACTION, changes
        counts[int(batches.pop())] += 1
    return counts


def test_stream_survives_promotion_of_a_standby(primary: EmbeddedServer) -> None:
    db = primary.create_database()
    db.execute("CREATE TABLE t (batch int, i int, PRIMARY KEY (batch, i))")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    with primary.start_standby(dbname=db.dbname) as standby:
        slot = unique("failover")
        slots.create_slot(db.dsn, slot, failover=True)
        assert slots.get_slot(db.dsn, slot).failover is True
        wait_until_sync_ready(db, standby, slot)
        on_standby = slots.get_slot(standby.dsn_for(db.dbname), slot)
        assert (on_standby.synced, on_standby.failover) == (True, True)
        status = slot_status(db.dsn, slot, standby=standby.dsn_for(db.dbname))
        assert status.synchronized_standby_slots == ("pgcdc_standby",)
        assert status.standby is not None
        assert (status.standby.present, status.standby.synced, status.standby.sync_ready) == (
            True,
            True,
            True,
        )
        assert status.standby.confirmed_flush_lsn == on_standby.confirmed_flush_lsn
        assert failover_warnings(status) == []
        shown = run_cli("status", "-d", db.dsn, "-S", slot, "--standby", standby.dsn)
        assert shown.returncode == 0 and "synced, sync-ready" in shown.stdout, shown.stderr
        assert "warning" not in shown.stdout
        shown = run_cli("status", "-d", db.dsn, "-S", slot, "--standby", standby.dsn, "--json")
        as_json = json.loads(shown.stdout)
        assert as_json["failover_warnings"] == [] and as_json["slot"]["standby"]["sync_ready"]
        seen = slot_status(standby.dsn_for(db.dbname), slot)
        assert seen.in_recovery and seen.slot.synced and seen.server_lsn > 0

        both = (
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
            f"dbname={db.dbname} target_session_attrs=read-write connect_timeout=5"
        )
        writer = Writer(both)
        tail = TailThread(both, slot, "pub", reconnect=True, reconnect_timeout=60, max_backoff=0.5)
        writer.start()
        tail.start()
        try:
            wait_active(db, slot)
            wait_for(lambda: len(tail.collector.transactions) >= 50, timeout=30, what="50 txns")
            db.close()
            primary.stop("fast")
            confirmed = tail.client.acks.flush_lsn
            synced = synced_slot(standby, slot)
            standby.promote()
            promoted_at = len(writer.acked)
            wait_for(
                lambda: len(writer.acked) >= promoted_at + 100,
                timeout=60,
                what="100 commits on the promoted standby",
            )
        finally:
            writer.stopping.set()
            writer.join(30)
        assert writer.error is None, writer.error
        assert writer.failures > 0, "the writer never saw the primary go away"

        source = {
            batch for (batch,) in standby.query("SELECT DISTINCT batch FROM t", dbname=db.dbname)
        }
        wait_for(
            lambda: set(delivered_batches(tail)) >= source,
            timeout=60,
            what="every transaction of the new primary to be delivered",
        )
        tail.finish(
            lambda: standby.query(
                "INSERT INTO t SELECT 0, i FROM generate_series(1, %s) i",
                (ROWS_PER_TRANSACTION,),
                dbname=db.dbname,
            ),
            timeout=30,
        )
        assert tail.client.sessions >= 2
        delivered = delivered_batches(tail)
        del delivered[0]  # the transaction that woke the client up to stop
        assert set(writer.acked) <= source, "an acknowledged commit was lost by the failover"
        assert set(delivered) == source
        duplicates = {batch: n for batch, n in delivered.items() if n > 1}
        assert not duplicates, f"delivered more than once: {duplicates}"
        after = slot_status(standby.dsn_for(db.dbname), slot)
        assert not after.in_recovery
        assert after.slot.confirmed_flush_lsn is not None
        assert after.slot.confirmed_flush_lsn > confirmed
        print(
            f"{len(source)} transactions, {len(writer.acked) - promoted_at} after the "
            f"promotion; at the primary's shutdown the client had confirmed {confirmed}, the "
            f"standby's copy of the slot {synced and synced[2]}"
        )


def test_slot_synchronization_needs_17(pg_server: EmbeddedServer) -> None:
    if pg_server.version >= 17:
        pytest.skip("slot synchronization exists from PostgreSQL 17")
    with pytest.raises(EmbeddedServerError, match=f"needs PostgreSQL 17.*{pg_server.version}"):
        pg_server.start_standby()
