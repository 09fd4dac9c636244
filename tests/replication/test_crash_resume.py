"""Exactly-once delivery to a durable consumer across kill -9 and server restarts.

The consumer (consumer.py, a separate process) appends every committed transaction to a file
and fsyncs before confirming it; on restart it passes its file's high-water mark as start_lsn.
Whatever happens to the consumer or the server, the union of its file must equal the source's
committed transactions: each one exactly once, in commit order.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.protocol import Lsn
from pgcdc.replication import ReplicationConnection

from .helpers import HERE, PYTHON, Proc, confirmed_flush, spawn, wait_for

CONSUMER = str(HERE / "consumer.py")
PUB = "crash_pub"
Change = tuple[Any, ...]


def make_plan(count: int) -> list[list[Change]]:
    """`count` transactions: 1-4 inserts each (ids 1, 2, ...), an update every 7th, a delete
    every 11th. Every change carries the transaction number k, so each transaction is unique."""
    alive: list[int] = []
    next_id = 1
    plan = []
    for k in range(1, count + 1):
        changes: list[Change] = []
        for _ in range(1 + k % 4):
            changes.append(("I", next_id, k))
            alive.append(next_id)
            next_id += 1
        if k % 7 == 0:
            changes.append(("U", alive[(k * 31) % len(alive)], k))
        if k % 11 == 0:
            changes.append(("D", alive.pop((k * 17) % len(alive))))
        plan.append(changes)
    return plan


def transaction_sql(k: int, changes: list[Change]) -> str:
    """One simple-protocol query: an implicit transaction that also logs k in `txlog`."""
    statements = []
    inserts = [c for c in changes if c[0] == "I"]
    if inserts:
        statements.append(
            "INSERT INTO items VALUES " + ", ".join(f"({i}, {v})" for _, i, v in inserts)
        )
    for change in changes:
        if change[0] == "U":
            statements.append(f"UPDATE items SET v = {change[2]} WHERE id = {change[1]}")
        elif change[0] == "D":
            statements.append(f"DELETE FROM items WHERE id = {change[1]}")
    statements.append(f"INSERT INTO txlog VALUES ({k})")
    return "; ".join(statements)


class Workload(threading.Thread):
    """Runs the plan one transaction at a time. When the connection breaks (a server restart),
    it reconnects and redoes transaction k only if `txlog` shows it did not commit, so every
    planned transaction commits exactly once."""

    def __init__(self, dsn: str, plan: list[list[Change]], pace: float) -> None:
        super().__init__(name="workload", daemon=True)
        self.dsn, self.plan, self.pace = dsn, plan, pace
        self.done = 0
        self.retries = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def _connect(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + 60
        while True:
            try:
                return psycopg.connect(self.dsn, autocommit=True)
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.stop.is_set():
                    raise
                time.sleep(0.1)

    def run(self) -> None:
        try:
            conn = self._connect()
            for k, changes in enumerate(self.plan, 1):
                while not self.stop.is_set():
                    try:
                        conn.execute(transaction_sql(k, changes))
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        self.retries += 1
                        conn.close()
                        conn = self._connect()
                        if conn.execute("SELECT 1 FROM txlog WHERE k = %s", (k,)).fetchone():
                            break
                if self.stop.is_set():
                    return
                self.done = k
                if self.pace:
                    time.sleep(self.pace)
            conn.close()
        except BaseException as exc:
            self.error = exc

    def finish(self, timeout: float) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"workload stuck at transaction {self.done}"
        if self.error is not None:
            raise self.error
        assert self.done == len(self.plan)


def setup(db: Database) -> str:
    db.execute(
        f"""CREATE TABLE items (id int PRIMARY KEY, v int);
            CREATE TABLE txlog (k int PRIMARY KEY);
            CREATE PUBLICATION {PUB} FOR TABLE items;"""
    )
    slot = f"{db.dbname}_crash"
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    return slot


def consumer_args(db: Database, slot: str, out: Path, *extra: str) -> list[str]:
    args = [PYTHON, CONSUMER, "--dsn", db.dsn, "--slot", slot, "--publication", PUB]
    return [*args, "--out", str(out), *extra]


def records(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]


def line_count(out: Path) -> int:
    return out.read_bytes().count(b"\n") if out.exists() else 0


def wait_lines(out: Path, count: int, proc: Proc, timeout: float = 60) -> None:
    """Wait until the consumer has written `count` transactions; fail early if it died."""

    def progressed() -> bool:
        if line_count(out) >= count:
            return True
        assert proc.running(), (
            f"consumer exited {proc.popen.returncode} before writing {count} transactions "
            f"(has {line_count(out)})\n--- stderr ---\n{proc.stderr[-3000:]}"
        )
        return False

    wait_for(progressed, timeout=timeout, what=f"{count} transactions on file")


def check_exactly_once(out: Path, plan: list[list[Change]]) -> list[Lsn]:
    got = records(out)
    ends = [Lsn.parse(r["end"]) for r in got]
    duplicates = len(ends) - len(set(ends))
    assert duplicates == 0, f"{duplicates} transactions were handed over twice"
    assert ends == sorted(ends), "transactions on file are out of commit order"
    expected = [[list(c) for c in changes] for changes in plan]
    changes = [r["changes"] for r in got]
    if changes != expected:
        missing = [i + 1 for i, c in enumerate(expected) if c not in changes]
        extra = [c for c in changes if c not in expected]
        raise AssertionError(
            f"file has {len(changes)} transactions, the source committed {len(expected)}; "
            f"missing k={missing[:10]}, unexpected {extra[:3]}"
        )
    return ends


def run_with_kills(
    pg: Database, out: Path, plan: list[list[Change]], kills: list[int], *extra: str
) -> tuple[str, int]:
    """Run the workload while the consumer is killed -9 once it has written each of `kills`
    transactions, then drain with --until-idle. Returns the slot and the number of restarts
    at which the file was ahead of the slot's confirmed_flush_lsn."""
    slot = setup(pg)
    workload = Workload(pg.dsn, plan, pace=0.002)
    workload.start()
    lagging_restarts = 0
    try:
        for point in kills:
            with spawn(consumer_args(pg, slot, out, *extra)) as consumer:
                wait_lines(out, point, consumer)
                consumer.kill9()
            # What is on file may be ahead of what the server had been told; the restart
            # must not hand those transactions over again.
            on_file = max((Lsn.parse(r["end"]) for r in records(out)), default=Lsn(0))
            if confirmed_flush(pg, slot) < on_file:
                lagging_restarts += 1
        workload.finish(timeout=120)
        with spawn(consumer_args(pg, slot, out, "--until-idle", *extra)) as consumer:
            assert consumer.wait(120) == 0, consumer.stderr
            assert "Traceback" not in consumer.stderr
    finally:
        workload.stop.set()
        workload.join(30)
    return slot, lagging_restarts


def test_kill9_consumer_exactly_once(pg: Database, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    out = tmp_path / "changes.jsonl"
    plan = make_plan(2000)
    kills = sorted(rng.sample(range(40, len(plan) - 40), rng.randint(3, 5)))
    context = f"seed={seed} kill points={kills}"
    slot, lagging_restarts = run_with_kills(pg, out, plan, kills)
    ends = check_exactly_once(out, plan)
    assert lagging_restarts >= 1, f"no restart had to skip anything ({context})"
    assert confirmed_flush(pg, slot) >= ends[-1], "the final drain did not confirm everything"


def test_kill9_control_without_high_water_mark(pg: Database, tmp_path: Path) -> None:
    """Negative control: a consumer that resumes from the slot alone (no start_lsn) gets the
    transactions that were durable but not yet confirmed a second time, and the check above
    sees it. Shows that the exactly-once test can fail and why start_lsn matters."""
    out = tmp_path / "changes.jsonl"
    plan = make_plan(400)
    _, lagging_restarts = run_with_kills(pg, out, plan, [100, 250], "--no-start-lsn")
    assert lagging_restarts >= 1
    with pytest.raises(AssertionError, match="handed over twice"):
        check_exactly_once(out, plan)


@pytest.fixture(scope="module")
def own_server(pg_server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """A private server of the same version: this module restarts it."""
    server = EmbeddedServer(pg_server.version).start()
    try:
        yield server
    finally:
        server.stop()


def test_server_restart_mid_stream_exactly_once(own_server: EmbeddedServer, tmp_path: Path) -> None:
    db = own_server.create_database()
    try:
        slot = setup(db)
        out = tmp_path / "changes.jsonl"
        sentinel = 0  # ids of the plan start at 1
        plan = make_plan(1500)
        plan.append([("I", sentinel, len(plan) + 1)])
        workload = Workload(db.dsn, plan, pace=0.002)
        args = consumer_args(db, slot, out, "--reconnect", "--stop-at-id", str(sentinel))
        with spawn(args) as consumer:
            workload.start()
            try:
                wait_lines(out, 300, consumer)
                own_server.restart("fast")
                wait_lines(out, 700, consumer)
                own_server.restart("immediate")  # a crash: recovery, slot state from disk
                wait_lines(out, 1100, consumer)
                workload.finish(timeout=120)
            finally:
                workload.stop.set()
                workload.join(30)
            assert consumer.wait(120) == 0, consumer.stderr
            stderr = consumer.stderr
        assert "Traceback" not in stderr
        assert stderr.count("consumer: connected") >= 3, f"it did not reconnect twice:\n{stderr}"
        assert workload.retries >= 1, "the restarts did not interrupt the workload"
        check_exactly_once(out, plan)
    finally:
        db.drop()
