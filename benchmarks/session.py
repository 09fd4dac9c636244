"""The replication session alone: what the pipeline's session thread costs per change.

What is measured
    The pipeline's session (`pgcdc.spool.Spooler`: the replication client, the transaction
    assembler and the spool's writer, one thread of the driver) without the rest of the
    pipeline, against pg_recvlogical on the same slot data. The load is pgbench's: 3 updates
    and an insert per transaction, a publication on the four pgbench tables, on a throwaway
    server (``pgbench -i -s --scale``, 1). Two runs:

    backlog  ``--transactions`` (40,000) transactions written before either consumer
             starts, each slot made before them; each consumer drains its slot to the end
             position. The session's thread CPU (`Spooler.cpu_seconds`), its wall time and
             pg_recvlogical's (``--endpos``; CPU from ``wait4``).
    live     ``pgbench -R --rate`` (3,000 tps) for ``--seconds`` (30), both consumers
             attached while it runs. The spool is confirmed and released every
             ``--confirm`` seconds (0.5), as the pipeline's batches would. The session's
             thread CPU and pg_recvlogical's (``/proc``, the process's user + system).

    Each run also gives the walsenders' CPU and the keepalives the session received: the
    walsender sends one before it waits for WAL whenever the client's reported positions
    lag what it sent, so a client that confirms only at its batches gets about one per
    transaction under a steady load of small ones (pg_recvlogical gets them too).

    Reported: the session's thread CPU per row change against pg_recvlogical's (the whole
    process), the ratio, the keepalives per transaction. Nothing here is asserted.

How to run (from the repository root)
    .venv/bin/python benchmarks/session.py                       # about 2 minutes
    .venv/bin/python benchmarks/session.py --rate 5000 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _common import Recvlogical, load, process_cpu, reaped_children_cpu, wait_walsender_gone
from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.protocol import Lsn
from pgcdc.replication import StreamOptions
from pgcdc.replication.acknowledgement import Acknowledgement
from pgcdc.spool import Spool, Spooler

PUBLICATION = "bench_pub"
TABLES = "pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history"
#: pgbench's options for the load (no vacuum first: it would only add WAL).
CLIENTS = ("-n", "-c", "4")


@dataclass(slots=True)
class Run:
    consumer: str
    changes: int
    wall: float
    cpu: float
    walsender_cpu: float | None
    keepalives: int | None = None
    transactions: int = 0

    def line(self) -> str:
        per = self.cpu / max(self.changes, 1) * 1e6
        walsender = (
            "?"
            if self.walsender_cpu is None
            else f"{self.walsender_cpu / max(self.changes, 1) * 1e6:.1f}"
        )
        text = (
            f"  {self.consumer:<15} {self.changes:>9,} changes  wall {self.wall:6.2f} s  "
            f"CPU {self.cpu:6.2f} s = {per:5.2f} µs/change  walsender {walsender} µs/change"
        )
        if self.keepalives is not None:
            per_txn = self.keepalives / max(self.transactions, 1)
            text += f"  keepalives {self.keepalives:,} ({per_txn:.2f} per transaction)"
        return text


class KeepaliveCount:
    """Counts the keepalives every session of this process receives."""

    def __init__(self) -> None:
        self.count = 0
        self._original = Acknowledgement.on_keepalive

    def __enter__(self) -> KeepaliveCount:
        original = self._original

        def counted(acks: Acknowledgement, wal_end: Lsn) -> None:
            self.count += 1
            original(acks, wal_end)

        Acknowledgement.on_keepalive = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        Acknowledgement.on_keepalive = self._original  # type: ignore[method-assign]


def walsender_pid(db: Database, slot: str) -> int | None:
    rows = db.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return rows[0][0] if rows else None


def current_lsn(db: Database) -> Lsn:
    return Lsn(db.execute("SELECT pg_current_wal_lsn()::text")[0][0])


def spooler(db: Database, slot: str) -> tuple[Spooler, Spool]:
    # (the spool removes its directory when the session stops)
    spool = Spool(Path(tempfile.gettempdir()) / f"pgcdc-bench-session-{os.getpid()}-{slot}")
    options = StreamOptions((PUBLICATION,), proto_version=4)
    return Spooler(db.dsn, slot, options, spool), spool


def drained(session: Spooler, spool: Spool, end: Lsn) -> bool:
    """Whether the session has spooled everything up to `end` (or is idle past it)."""
    session.check()
    return (spool.last_lsn or Lsn(0)) >= end or session.server_position >= end


def drain_session(server: EmbeddedServer, db: Database, slot: str, end: Lsn) -> Run:
    """The session drains `slot` to `end` (the spool keeps everything: nothing released)."""
    assert server.pid is not None
    before = reaped_children_cpu(server.pid)
    session, spool = spooler(db, slot)
    with KeepaliveCount() as keepalives:
        started = time.perf_counter()
        session.start()
        while not drained(session, spool, end):
            time.sleep(0.005)
        wall = time.perf_counter() - started
        changes = spool.pending(Lsn(0))
        transactions = spool.batch(Lsn(0), end).transactions
        session.stop()
    after = wait_walsender_gone(db, slot, server.pid)
    return Run(
        "pgcdc session",
        changes,
        wall,
        session.cpu_seconds,
        sum(after) - sum(before),
        keepalives.count,
        transactions,
    )


def drain_recvlogical(
    server: EmbeddedServer, db: Database, slot: str, end: Lsn, changes: int
) -> Run:
    assert server.pid is not None
    before = reaped_children_cpu(server.pid)
    cmd = [str(server.bindir / "pg_recvlogical"), "-d", db.dsn, "--slot", slot, "--start"]
    cmd += ["-f", "/dev/null", "--no-loop", "--endpos", str(end)]
    cmd += ["-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace").strip()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"pg_recvlogical failed: {err}")
    after = wait_walsender_gone(db, slot, server.pid)
    cpu = usage.ru_utime + usage.ru_stime
    return Run("pg_recvlogical", changes, wall, cpu, sum(after) - sum(before))


def backlog(server: EmbeddedServer, db: Database, transactions: int) -> list[Run]:
    for slot in ("session_backlog", "recv_backlog"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    pgbench(server, db, *CLIENTS, "-t", str(transactions // 4))
    end = current_lsn(db)
    session = drain_session(server, db, "session_backlog", end)
    recv = drain_recvlogical(server, db, "recv_backlog", end, session.changes)
    return [session, recv]


def live(
    server: EmbeddedServer, db: Database, rate: int, seconds: int, confirm: float
) -> list[Run]:
    for slot in ("session_live", "recv_live"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    session, spool = spooler(db, "session_live")
    recv = Recvlogical(server, db, "recv_live", PUBLICATION)
    stop = threading.Event()
    counted = {"changes": 0, "transactions": 0}

    def release() -> None:  # as the pipeline's batches would: confirm what is spooled
        done = Lsn(0)
        while not stop.wait(confirm):
            last = spool.last_lsn
            if last is not None and last > done:
                batch = spool.batch(done, last)
                counted["changes"] += batch.changes
                counted["transactions"] += batch.transactions
                session.confirm(last)
                done = last

    with KeepaliveCount() as keepalives:
        session.start()
        releaser = threading.Thread(target=release, daemon=True)
        releaser.start()
        time.sleep(1.0)  # both attached
        session_ws, recv_ws = walsender_pid(db, "session_live"), walsender_pid(db, "recv_live")
        ws_before = [process_cpu(p) if p else None for p in (session_ws, recv_ws)]
        recv_before = process_cpu(recv.proc.pid) or 0.0
        started = time.perf_counter()
        pgbench(server, db, *CLIENTS, "-R", str(rate), "-T", str(seconds))
        end = current_lsn(db)
        while not drained(session, spool, end):
            time.sleep(0.01)
        time.sleep(confirm * 2)  # the last release
        wall = time.perf_counter() - started
        ws_after = [process_cpu(p) if p else None for p in (session_ws, recv_ws)]
        recv_cpu = (process_cpu(recv.proc.pid) or 0.0) - recv_before
        stop.set()
        releaser.join()
        session.stop()
        recv.stop()
    walsender = [
        None if a is None or b is None else a - b for a, b in zip(ws_after, ws_before, strict=True)
    ]
    changes = counted["changes"]
    return [
        Run(
            "pgcdc session",
            changes,
            wall,
            session.cpu_seconds,
            walsender[0],
            keepalives.count,
            counted["transactions"],
        ),
        Run("pg_recvlogical", changes, wall, recv_cpu, walsender[1]),
    ]


def pgbench(server: EmbeddedServer, db: Database, *args: str) -> None:
    cmd = [str(server.bindir / "pgbench"), *args, db.dsn]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pgbench failed: {done.stderr.strip()[-500:]}")


def report(title: str, runs: list[Run]) -> None:
    print(title)
    for run in runs:
        print(run.line())
    session, recv = runs
    ratio = (session.cpu / max(session.changes, 1)) / max(recv.cpu / max(recv.changes, 1), 1e-9)
    print(f"  CPU per change, session / pg_recvlogical: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=40_000, help="backlog (40,000)")
    parser.add_argument("--rate", type=int, default=3_000, help="live pgbench -R (3,000)")
    parser.add_argument("--seconds", type=int, default=30, help="live pgbench -T (30)")
    parser.add_argument("--confirm", type=float, default=0.5, help="live release (0.5 s)")
    parser.add_argument("--scale", type=int, default=1, help="pgbench -i -s (1)")
    parser.add_argument("--pg-version", type=int, help="(newest installed)")
    args = parser.parse_args()
    settings = {"track_commit_timestamp": "on", "max_wal_size": "4GB", "autovacuum": "off"}
    with EmbeddedServer(args.pg_version, settings=settings) as server:
        db = server.create_database("bench")
        pgbench(server, db, "-i", "-q", "-s", str(args.scale))
        db.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLES}")
        db.execute("CHECKPOINT")
        print(f"PostgreSQL {server.version}; {os.cpu_count()} CPUs; load average {load()}")
        runs = backlog(server, db, args.transactions)
        report(f"backlog of {args.transactions:,} pgbench transactions:", runs)
        print(f"  wall, session / pg_recvlogical: {runs[0].wall / runs[1].wall:.2f}x")
        runs = live(server, db, args.rate, args.seconds, args.confirm)
        report(
            f"live, pgbench -R {args.rate:,} for {args.seconds} s, released every "
            f"{args.confirm} s (load average {load()}):",
            runs,
        )


if __name__ == "__main__":
    main()
