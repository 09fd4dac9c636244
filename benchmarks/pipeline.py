"""The whole pipeline: PostgreSQL → pgcdc run (spool, Spark tasks) → Delta mirrors.

What is measured
    One throwaway PostgreSQL server (``pgcdc.embedded.EmbeddedServer``, PostgreSQL 18 unless
    ``--pg-version``; autovacuum off, ``track_commit_timestamp`` on) and one local Spark
    session (``pgcdc.spark.session.local_session``), started before anything is timed: its
    start-up (the JVM) is reported on its own line.

    1. Throughput (a backlog, caught up with ``trigger.available_now``). The 5-column
       ``bench`` table of benchmarks/stream.py and a publication on it; two pgoutput slots
       are created before any data is written, so both consumers drain an identical backlog:
       N inserts, N updates (``SET n = n + 1``) and N/2 deletes (every even id, so the mirror
       keeps N/2 rows and can be compared with the source), in transactions of ``--batch``
       rows (default 10,000); N = ``--rows`` (default 1,000,000). The end position is
       ``pg_current_wal_lsn()`` after the workload.

       pg_recvlogical  the baseline, exactly as in benchmarks/stream.py: ``pg_recvlogical
                       -f /dev/null --no-loop --endpos LSN -o proto_version=1
                       -o publication_names=pub`` (the server's own C client: no decoding,
                       it writes the bytes away; the server's walsender is the limit).
       pipeline        ``Pipeline(parse_config({...}), spark).run()`` with
                       ``trigger = {available_now = true, max_changes_per_batch = M}``
                       (M = ``--max-changes``, default 1,000,000) and ``tables =
                       {"public.bench" = "mirror"}``, into a Delta table in a temp dir. Timed
                       from ``run()`` until it returns (caught up, slot confirmed). Before
                       it, unless ``--cold``, a warm-up ``run()`` on an empty slot absorbs
                       Spark's first-job costs; after it, one more on an empty slot measures
                       the fixed cost of a run, printed with the ratio that remains without it.

       Reported: wall seconds and row changes/s of both, the ratio pipeline/pg_recvlogical
       of wall times, the CPU both spent per change (pg_recvlogical: ``wait4`` rusage; the
       pipeline: this process and all its descendants: the JVM and the Python workers; the
       server's walsender from the postmaster's reaped-children counters), and where the
       pipeline's time went (``BatchReport.phases``): per batch the driver's planning, the
       Spark job, and inside its tasks reading the spool into the envelope, folding per key
       and typing, and writing Delta; and the CPU of the replication session thread, which
       receives, assembles and spools meanwhile. Finally the mirror is read back and
       compared row by row with the source table (``pgcdc.pipeline.verify``).

    2. Freshness (a steady workload, the pipeline running continuously with
       ``trigger.interval = --interval``, default 0.5 s). A ``live`` table like ``bench``
       with its own publication and two slots (pipeline, baseline). Once a first
       transaction has gone through both consumers, a driver thread with one psycopg
       connection commits ``--rate`` row changes per second (default 2,000; repeat the
       part with ``--rate 10000``) on a fixed schedule, in transactions of ``--txn-rows``
       rows (default 20: half inserts, a fifth deletes, the rest updates of rows of earlier
       transactions), each sent in one round trip: for ``--warmup`` seconds (default 5, not
       counted), then for ``--freshness-seconds`` (default 60); ``--live-rows`` fills the
       table (and the mirror) with that many rows first. The server's commit timestamp of
       every transaction (``pg_xact_commit_timestamp``, the same value the Commit message
       carries) is the start of its latency.

       pipeline        visible = the wall time at which ``Pipeline(on_batch=...)`` is called
                       for the first batch whose ``last_commit_time`` is at or past the
                       transaction's commit time: on_batch runs after the Delta commits,
                       the moment the rows become visible to any reader of the table.
       pg_recvlogical  the reference: ``pg_recvlogical -f - -o proto_version=1`` on its
                       own pgoutput slot, read through a pipe; visible = the wall time the
                       transaction's Commit message (found by its commit timestamp) arrives
                       here, at the same time as the pipeline.

       Reported: p50, p95, p99 and max latency in seconds for both, the ratio of their
       p50s, the pipeline's p50/p99 per 10 s (a drift shows there), the achieved change rate
       and the driver's worst delay against its schedule, the batches' sizes and apply
       times, the CPU the pipeline's processes used, and the mirror compared with the
       source.

    3. Many tables (``--tables T``, default 100; 0 skips it). T tables like ``bench`` in one
       publication, two slots, and the throughput part's backlog of ``--rows`` changes
       spread evenly over them, each transaction touching ten tables. Both consumers drain
       it as in part 1; reported: the ratio pipeline/pg_recvlogical, µs per change, and that
       ratio against part 1's (one table; run part 1 with the same ``--rows``): how much a
       change costs more when the tables are many. Every mirror is compared with its table.

    No timing is asserted anywhere. Every part prints the 1-minute load average: other work
    on the machine stretches wall times.

How to run (from the repository root)
    .venv/bin/python benchmarks/pipeline.py --rows 20000 --freshness-seconds 10 --tables 10
    .venv/bin/python benchmarks/pipeline.py                    # 2.5 M changes + 60 s live
    .venv/bin/python benchmarks/pipeline.py --only freshness --rate 10000
    .venv/bin/python benchmarks/pipeline.py --only many-tables --rows 300000
    .venv/bin/python benchmarks/pipeline.py --only throughput --master spark://127.0.0.1:7077 \
        --conf spark.driver.host=127.0.0.1 --conf spark.executor.memory=1g
        (a standalone cluster: its tasks get each batch's changes inside their work; the
        lake, in a temporary directory here, must be one the workers see)
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

import stream  # benchmarks/stream.py: this directory is first on sys.path for a script
from _common import QUIET, Recvlogical, load, percentile, tree_cpu
from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.pipeline import BatchReport, Pipeline
from pgcdc.pipeline.config import PipelineConfig, parse_config
from pgcdc.pipeline.verify import compare_mirror
from pgcdc.protocol import Lsn, datetime_to_pg_timestamp
from pgcdc.spark.session import classic_session, local_session
from pgcdc.targets import DeltaTarget

SCHEMA = "CREATE TABLE {table} (id bigint PRIMARY KEY, n int, t text, ts timestamptz, amt numeric)"
INSERT = (
    "INSERT INTO {table} SELECT g, g % 1000, md5(g::text) || 'abcdefgh', now(), "
    "(g * 1.25)::numeric(12,2) FROM generate_series({lo}, {hi}) AS g"
)
UPDATE = "UPDATE {table} SET n = n + 1 WHERE id BETWEEN {lo} AND {hi}"
DELETE = "DELETE FROM {table} WHERE id BETWEEN {lo} AND {hi} AND id % 2 = 0"
DELETE_RANGE = "DELETE FROM {table} WHERE id BETWEEN {lo} AND {hi}"
TARGET_RATIO = 2.5
TARGET_P99 = 1.0


@dataclass
class Result:
    consumer: str
    wall: float
    client_cpu: float
    server_cpu: float


# --------------------------------------------------------------------------- the pipeline


def pipeline_config(
    db: Database,
    name: str,
    slot: str,
    publication: str,
    table: str | list[str],
    path: Path,
    *,
    available_now: bool,
    max_changes: int,
    interval: str = "1 second",
    inline_max: int | None = None,
) -> PipelineConfig:
    tables = [table] if isinstance(table, str) else table
    trigger: dict[str, object] = {
        "available_now": available_now,
        "interval": interval,
        "max_changes_per_batch": max_changes,
    }
    if inline_max is not None:
        trigger["inline_max_changes"] = inline_max
    return parse_config(
        {
            "name": name,
            "source": {"conninfo": db.dsn, "publication": publication, "slot": slot},
            "target": {"path": str(path)},
            "trigger": trigger,
            "tables": {f"public.{t}": "mirror" for t in tables},
        }
    )


@dataclass
class Batch:
    """One on_batch call: the report and the wall clock just after the Delta commit."""

    report: BatchReport
    at: float  # time.time()
    since_start: float  # time.perf_counter() - the run's start


def verify_all(db: Database, config: PipelineConfig) -> bool:
    """Compare every mirror with its source table, row by row; one line for all."""
    t0 = time.perf_counter()
    verdicts = []
    for spec in config.targets():
        mirror = DeltaTarget(spec.path, "mirror", app_id=config.app_id).to_arrow()
        verdicts.append(compare_mirror(db.dsn, spec.table, mirror))
    different = [v for v in verdicts if not v.equal]
    rows = sum(v.source_rows for v in verdicts)
    took = time.perf_counter() - t0
    if not different:
        print(f"  mirror check ({took:.1f} s): all {len(verdicts)} identical ({rows:,} rows)")
    for v in different[:5]:
        print(f"  mirror check: {v}")
    return not different


def verify(db: Database, config: PipelineConfig, table: str) -> bool:
    """Compare the mirror with the source table, row by row."""
    t0 = time.perf_counter()
    (spec,) = config.targets()
    delta = DeltaTable(spec.path)
    shape = f"Delta version {delta.version()}, {len(delta.file_uris())} files"
    mirror = DeltaTarget(spec.path, "mirror", app_id=config.app_id).to_arrow()
    verdict = compare_mirror(db.dsn, f"public.{table}", mirror)
    took = time.perf_counter() - t0
    print(f"  mirror check ({shape}; {took:.1f} s): {verdict}")
    for row in verdict.missing + verdict.extra:
        print(f"    {row}")
    return verdict.equal


# --------------------------------------------------------------------------- 1. throughput


def workload(db: Database, rows: int, batch: int) -> int:
    """Inserts, updates, deletes of the even ids; the number of row changes."""
    changes = 0
    for name, sql in (("insert", INSERT), ("update", UPDATE), ("delete", DELETE)):
        t0 = time.perf_counter()
        count = 0
        for lo in range(1, rows + 1, batch):
            hi = min(lo + batch - 1, rows)
            count += hi - lo + 1 if name != "delete" else hi // 2 - (lo - 1) // 2
            db.execute(sql.format(table="bench", lo=lo, hi=hi))
        took = time.perf_counter() - t0
        print(f"  {name} {count:,} rows in {took:5.1f} s ({count / took:,.0f} rows/s)", flush=True)
        changes += count
    return changes


def run_recvlogical(
    server: EmbeddedServer, db: Database, slot: str, endpos: Lsn, publication: str = "pub"
) -> Result:
    """benchmarks/stream.py's pg_recvlogical run (proto 1, to /dev/null), summed up."""
    mode = dataclasses.replace(stream.MODES[0], publication=publication)
    run = stream.run_recvlogical(server, db, slot, mode, endpos)
    client = run.client_user + run.client_sys
    return Result("pg_recvlogical", run.wall, client, run.server_user + run.server_sys)


@dataclass
class PipelineRun:
    result: Result
    batches: list[Batch]
    session_cpu: float  # the replication session thread's CPU seconds (driver)
    caught_up: float  # seconds from run() to the last batch's Delta commit


def run_pipeline(
    server: EmbeddedServer,
    db: Database,
    spark: Any,
    config: PipelineConfig,
) -> PipelineRun:
    """Catch up with available-now."""
    batches: list[Batch] = []
    t0 = 0.0

    def on_batch(report: BatchReport) -> None:
        batches.append(Batch(report, time.time(), time.perf_counter() - t0))

    pipeline = Pipeline(config, spark, on_batch=on_batch)
    pm = server.pid
    assert pm is not None
    s_user0, s_sys0 = stream.reaped_children_cpu(pm)
    cpu0 = tree_cpu(os.getpid(), (pm,))
    t0 = time.perf_counter()
    pipeline.run()
    wall = time.perf_counter() - t0
    session_cpu = pipeline.spooler.cpu_seconds if pipeline.spooler is not None else 0.0
    cpu1 = tree_cpu(os.getpid(), (pm,))
    s_user1, s_sys1 = stream.wait_walsender_gone(db, config.slot, pm)
    last = batches[-1].since_start if batches else wall
    server_cpu = s_user1 - s_user0 + s_sys1 - s_sys0
    result = Result("pipeline", wall, cpu1 - cpu0, server_cpu)
    return PipelineRun(result, batches, session_cpu, last)


def throughput(
    server: EmbeddedServer, db: Database, spark: Any, args: argparse.Namespace, work: Path
) -> None:
    print("\n== 1. throughput: catching up with a backlog ==", flush=True)
    db.execute(SCHEMA.format(table="bench"))
    db.execute("CREATE PUBLICATION pub FOR TABLE bench")
    for slot in ("recvlogical", "pipeline"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    print(
        f"workload: {args.rows:,} inserts + updates, {args.rows // 2:,} deletes (even ids), "
        f"{args.batch:,} rows per transaction; 2 slots",
        flush=True,
    )
    total = workload(db, args.rows, args.batch)
    endpos = Lsn.parse(str(db.execute("SELECT pg_current_wal_lsn()")[0][0]))
    (wal_bytes,) = db.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), min(restart_lsn)) FROM pg_replication_slots"
    )[0]
    db.execute("CHECKPOINT")
    print(f"  endpos {endpos}, {float(wal_bytes) / 2**20:,.0f} MiB of WAL per slot")
    print(f"  load average before the runs: {load()} on {os.cpu_count()} CPUs\n")

    print("draining recvlogical with pg_recvlogical (proto 1) ...", end=" ", flush=True)
    base = run_recvlogical(server, db, "recvlogical", endpos)
    print(f"{base.wall:.2f} s", flush=True)

    def run_empty(name: str) -> Result:
        """Pipeline.run() on a slot with nothing to send: the fixed cost of a run (query
        start, the data source's processes, query stop)."""
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        config = pipeline_config(
            db, name, name, "pub", "bench", work / name, available_now=True, max_changes=1
        )
        return run_pipeline(server, db, spark, config).result

    if not args.cold:
        print("warm-up: Pipeline.run() on an empty slot ...", end=" ", flush=True)
        warm = run_empty("warmup")
        print(f"{warm.wall:.2f} s, {warm.client_cpu:.1f} CPU s (Spark's first query)")

    config = pipeline_config(
        db,
        "bench",
        "pipeline",
        "pub",
        "bench",
        work / "throughput",
        available_now=True,
        max_changes=args.max_changes,
        inline_max=args.inline_max,
    )
    print(
        f"draining pipeline with Pipeline.run() (available_now, max_changes_per_batch "
        f"{args.max_changes:,}) ...",
        end=" ",
        flush=True,
    )
    run = run_pipeline(server, db, spark, config)
    result, batches, caught_up = run.result, run.batches, run.caught_up
    print(f"{result.wall:.2f} s", flush=True)
    applied = sum(b.report.changes for b in batches)
    if applied != total:
        print(f"  !! the pipeline's batches held {applied:,} changes, expected {total:,}")
    print("Pipeline.run() on an empty slot ...", end=" ", flush=True)
    fixed = run_empty("empty")
    print(f"{fixed.wall:.2f} s, {fixed.client_cpu:.1f} CPU s (the fixed cost of a run)")

    print(
        f"\nresults: {total:,} row changes; CPU per row = (user + system) / rows"
        "\n  consumer         wall s      rows/s   client CPU µs/row   server CPU µs/row"
    )
    for r in (base, result):
        print(
            f"  {r.consumer:<15} {r.wall:7.2f} {total / r.wall:>11,.0f}"
            f"   {r.client_cpu / total * 1e6:12.2f}      {r.server_cpu / total * 1e6:12.2f}"
        )
    ratio = result.wall / base.wall
    verdict = "OK" if ratio <= TARGET_RATIO else "MISSES the target"
    print(
        f"\n  pipeline/pg_recvlogical wall-time ratio {ratio:.2f} (target <= {TARGET_RATIO:g}) "
        f"{verdict}"
    )
    print(
        f"  the last batch was committed to Delta {caught_up:.2f} s after run() started "
        f"(ratio {caught_up / base.wall:.2f}); run() returned {result.wall - caught_up:.2f} s "
        f"later (query stop, slot advance)"
    )
    marginal = result.wall - fixed.wall
    if marginal > 0:
        print(
            f"  without the fixed cost of a run ({fixed.wall:.2f} s): {marginal:.2f} s, "
            f"{total / marginal:,.0f} rows/s, ratio {marginal / base.wall:.2f}"
        )
    print(
        f"  floor from the pipeline's own CPU time ({result.client_cpu:.1f} s over "
        f"{os.cpu_count()} CPUs): ratio >= "
        f"{result.client_cpu / (os.cpu_count() or 1) / base.wall:.2f} even on an idle machine"
    )
    MEASURED.update(
        {
            "one table ratio": ratio,
            "one table cpu": result.client_cpu / total * 1e6,
            "one table rows": total,
        }
    )
    breakdown(run)
    print(f"  load average at the end: {load()} on {os.cpu_count()} CPUs")
    verify(db, config, "bench")


PHASES = ("plan", "inline", "job", "read", "fold", "write", "maintain")


def breakdown(run: PipelineRun) -> None:
    """Where the time went: the driver's session thread and planning, the Spark jobs, and
    inside the tasks reading the spool into the envelope, folding and typing, Delta commits."""
    batches = [b.report for b in run.batches]
    sums = {p: sum(b.phases.get(p, 0.0) for b in batches) for p in PHASES}
    print(
        "\n  where the time went (seconds; read, fold, write: CPU-bound work in the tasks, "
        "summed over tables)"
        "\n    batch     changes    plan  inline     job    read    fold   write  maint  batch"
    )
    shown = {b.batch_id for b in batches[:5] + batches[-5:]}
    for b in batches:
        if b.batch_id in shown:
            cells = " ".join(f"{b.phases.get(p, 0.0):7.2f}" for p in PHASES)
            print(f"    {b.batch_id:>5} {b.changes:>11,} {cells} {b.seconds:6.2f}")
        elif b.batch_id == batches[5].batch_id:
            print(f"    ... ({len(batches) - 10} more)")
    in_batches = sum(b.seconds for b in batches)
    print(
        f"    total: {in_batches:.2f} s in {len(batches)} batches of {run.result.wall:.2f} s: "
        f"driver planning {sums['plan']:.2f}, applied by the driver {sums['inline']:.2f}, "
        f"by Spark jobs {sums['job']:.2f} (in the tasks: read {sums['read']:.2f}, fold "
        f"{sums['fold']:.2f}, write {sums['write']:.2f}, maintain {sums['maintain']:.2f}); the "
        f"replication session thread used {run.session_cpu:.2f} CPU s meanwhile (receive, "
        "decode headers, assemble, spool)"
    )


# --------------------------------------------------------------------------- 2. freshness


@dataclass
class Driver:
    """The steady workload: transaction i at start + i / tps, one round trip each."""

    dsn: str
    rate: float
    txn_rows: int
    seconds: float
    xids: list[int] = field(default_factory=list)
    changes: int = 0
    worst_delay: float = 0.0
    late: int = 0
    error: BaseException | None = None

    def statements(self, i: int) -> str:
        ins = (self.txn_rows + 1) // 2
        dels = self.txn_rows // 5
        upd = self.txn_rows - ins - dels
        base = i * ins + 1  # transaction i inserts ids base .. base + ins - 1
        sql = ["BEGIN", INSERT.format(table="live", lo=base, hi=base + ins - 1)]
        changes = ins
        if i >= 1 and upd:  # the first rows of the previous transaction
            sql.append(UPDATE.format(table="live", lo=base - ins, hi=base - ins + upd - 1))
            changes += upd
        if i >= 2 and dels:  # the last rows of the one before (never updated)
            hi = base - ins - 1
            sql.append(DELETE_RANGE.format(table="live", lo=hi - dels + 1, hi=hi))
            changes += dels
        sql += ["SELECT pg_current_xact_id()::text::bigint", "COMMIT"]
        self.changes += changes
        return "; ".join(sql)

    def run(self) -> None:
        import psycopg

        tps = self.rate / self.txn_rows
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                start = time.monotonic()
                i = 0
                while (due := i / tps) < self.seconds:
                    delay = time.monotonic() - start - due
                    if delay < 0:
                        time.sleep(-delay)
                    elif delay > 0.005:
                        self.late += 1
                        self.worst_delay = max(self.worst_delay, delay)
                    cur = conn.execute(self.statements(i))
                    while cur.description is None and cur.nextset():
                        pass
                    row = cur.fetchone()
                    assert row is not None
                    self.xids.append(int(row[0]))
                    i += 1
        except BaseException as exc:
            self.error = exc


def freshness(
    server: EmbeddedServer, db: Database, spark: Any, args: argparse.Namespace, work: Path
) -> None:
    print("\n== 2. freshness: a steady workload, the pipeline running continuously ==")
    db.execute(SCHEMA.format(table="live"))
    db.execute("CREATE PUBLICATION pub_live FOR TABLE live")
    db.execute("SELECT pg_create_logical_replication_slot('live', 'pgoutput')")
    db.execute("SELECT pg_create_logical_replication_slot('live_recv', 'pgoutput')")
    config = pipeline_config(
        db,
        "live",
        "live",
        "pub_live",
        "live",
        work / "freshness",
        available_now=False,
        max_changes=args.max_changes,
        interval=args.interval,
    )
    batches: list[Batch] = []

    def on_batch(report: BatchReport) -> None:
        batches.append(Batch(report, time.time(), 0.0))

    pipeline = Pipeline(config, spark, on_batch=on_batch)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run()
        except BaseException as exc:
            failure.append(exc)

    runner = threading.Thread(target=run, name="pipeline", daemon=True)
    runner.start()
    recv = Recvlogical(server, db, "live_recv", "pub_live")

    # Rows (negative ids) and one transaction through both first: the query's start, the
    # first batch (which creates the Delta table) and the pre-filled rows are not measured.
    t0 = time.perf_counter()
    for lo in range(-args.live_rows, 0, args.batch):
        db.execute(INSERT.format(table="live", lo=lo, hi=min(lo + args.batch - 1, -1)))
    db.execute("INSERT INTO live VALUES (0, 0, 'first', now(), 0)")
    (first_ts,) = db.execute("SELECT timestamp FROM pg_last_committed_xact()")[0]
    deadline = time.monotonic() + 120 + args.live_rows / 5000
    while True:
        seen = pipeline.stats.last_commit_time
        if seen and seen >= first_ts and datetime_to_pg_timestamp(first_ts) in recv.seen:
            break
        if failure or time.monotonic() > deadline:
            pipeline.stop()
            recv.stop()
            sys.exit(f"the first transaction did not go through: {failure or 'timeout'}")
        time.sleep(0.05)
    what = f"{args.live_rows:,} rows and a" if args.live_rows else "a"
    print(
        f"{what} first transaction went through both in {time.perf_counter() - t0:.1f} s "
        f"(query start, first batch, Delta table created)"
    )
    warmup, seconds = args.warmup, args.freshness_seconds
    driver = Driver(db.dsn, args.rate, args.txn_rows, warmup + seconds)
    tps = args.rate / args.txn_rows
    print(
        f"driving {args.rate:,.0f} row changes/s for {warmup:g} + {seconds:g} s (warm-up, not "
        f"counted + measured): {tps:,.0f} transactions/s of {args.txn_rows} rows; trigger "
        f"interval {args.interval!r}; load average {load()} on {os.cpu_count()} CPUs",
        flush=True,
    )
    thread = threading.Thread(target=driver.run, name="driver")
    thread.start()
    time.sleep(warmup)
    others = (server.pid, recv.proc.pid)
    cpu0, cpu_t0 = tree_cpu(os.getpid(), others), time.monotonic()
    thread.join()
    cpu, cpu_span = tree_cpu(os.getpid(), others) - cpu0, time.monotonic() - cpu_t0
    if driver.error is not None:
        pipeline.stop()
        recv.stop()
        raise driver.error
    commit_ts: dict[int, datetime] = dict(
        db.execute(
            "SELECT x, pg_xact_commit_timestamp(x::text::xid) FROM unnest(%s::bigint[]) AS x",
            (driver.xids,),
        )
    )
    last_ts = commit_ts[driver.xids[-1]]
    last_us = datetime_to_pg_timestamp(last_ts)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not failure:
        seen = pipeline.stats.last_commit_time
        if seen is not None and seen >= last_ts and last_us in recv.seen:
            break
        time.sleep(0.05)
    pipeline.stop()
    runner.join(60)
    recv.stop()
    if failure:
        print(f"  !! the pipeline failed: {failure[0]}")

    measured = driver.xids[int(warmup * tps + 0.5) :] or driver.xids
    first = commit_ts[measured[0]]
    span = (last_ts - first).total_seconds() or 1.0
    changes = driver.changes * len(measured) / len(driver.xids)
    print(
        f"  measured {len(measured):,} transactions, ~{changes:,.0f} row changes in "
        f"{span:.1f} s: {changes / span:,.0f} changes/s, {len(measured) / span:,.0f} "
        f"transactions/s; the driver started {driver.late} of {len(driver.xids):,} "
        f"transactions > 5 ms late, the worst {driver.worst_delay * 1000:.0f} ms"
    )
    visible_ts = [b.report.last_commit_time for b in batches]
    pipe_lat: list[tuple[float, float]] = []  # (seconds into the measurement, latency)
    recv_lat: list[float] = []
    missing = 0
    for xid in measured:
        ts = commit_ts[xid]
        at = ts.timestamp()
        i = bisect.bisect_left(visible_ts, ts)  # type: ignore[type-var]
        if i < len(batches):
            pipe_lat.append(((ts - first).total_seconds(), batches[i].at - at))
        else:
            missing += 1
        arrived = recv.seen.get(datetime_to_pg_timestamp(ts))
        if arrived is not None:
            recv_lat.append(arrived - at)
    if missing:
        print(f"  !! {missing} transactions never became visible in the mirror")
    lat = sorted(x for _, x in pipe_lat)
    recv_lat.sort()
    print(
        "\nresults: commit (server timestamp) to visible, seconds"
        "\n  consumer          txns     p50     p95     p99     max"
    )
    for name, values in (("pipeline", lat), ("pg_recvlogical", recv_lat)):
        print(
            f"  {name:<15} {len(values):>6,} "
            + " ".join(f"{percentile(values, p):7.3f}" for p in (50, 95, 99, 100))
        )
    p99 = percentile(lat, 99)
    verdict = "OK" if p99 <= TARGET_P99 else "MISSES the target"
    print(f"\n  pipeline p99 {p99:.2f} s (target <= {TARGET_P99:g} s) {verdict}")
    base = percentile(recv_lat, 50)
    if base > 0:
        print(
            f"  pipeline/pg_recvlogical p50 ratio {percentile(lat, 50) / base:,.0f} "
            f"(pg_recvlogical p50 {base * 1000:.1f} ms; trigger interval {args.interval})"
        )
    windows: dict[int, list[float]] = {}
    for offset, x in pipe_lat:
        windows.setdefault(int(offset // 10), []).append(x)
    print(
        "  pipeline p50/p99 per 10 s of the measurement: "
        + ", ".join(
            f"{percentile(sorted(v), 50):.2f}/{percentile(sorted(v), 99):.2f}"
            for _, v in sorted(windows.items())
        )
    )
    live = [b for b in batches if b.at >= first.timestamp()]
    if live:
        sizes = [b.report.changes for b in live]
        applies = [b.report.seconds for b in live]
        gaps = [b.at - a.at for a, b in itertools.pairwise(live)]
        print(
            f"  {len(live)} micro-batches, {sum(sizes) / len(live):,.0f} changes each on average"
            f" (max {max(sizes):,}), one every {sum(gaps) / max(1, len(gaps)):.2f} s; pgcdc "
            f"apply (typing + Delta MERGE) {sum(applies) / len(live):.3f} s per batch, first "
            f"ten {sum(applies[:10]) / len(applies[:10]):.3f} s, last ten "
            f"{sum(applies[-10:]) / len(applies[-10:]):.3f} s"
        )
    if live:
        phases = {p: sum(b.report.phases.get(p, 0.0) for b in live) / len(live) for p in PHASES}
        print(
            "  per batch, mean: "
            + ", ".join(f"{p} {phases[p]:.3f} s" for p in PHASES)
            + " (plan: the driver; job: the Spark job; read/fold/write: in its tasks)"
        )
    print(
        f"  the pipeline's processes used {cpu:.1f} CPU s in {cpu_span:.0f} s "
        f"({cpu / cpu_span:.2f} cores of {os.cpu_count()})"
    )
    print(f"  load average at the end: {load()} on {os.cpu_count()} CPUs")
    verify(db, config, "live")


# --------------------------------------------------------------------------- 3. many tables


def many_workload(db: Database, tables: list[str], rows: int, batch: int) -> int:
    """Part 1's inserts, updates and deletes of the even ids, `rows` in all spread over
    `tables`, each transaction touching ten of them; the number of row changes."""
    per_table = max(1, rows // len(tables))
    step = max(1, batch // 10)
    changes = 0
    for name, sql in (("insert", INSERT), ("update", UPDATE), ("delete", DELETE)):
        t0 = time.perf_counter()
        count = 0
        for group in (tables[i : i + 10] for i in range(0, len(tables), 10)):
            for lo in range(1, per_table + 1, step):
                hi = min(lo + step - 1, per_table)
                n = hi - lo + 1 if name != "delete" else hi // 2 - (lo - 1) // 2
                db.execute("; ".join(sql.format(table=t, lo=lo, hi=hi) for t in group))
                count += n * len(group)
        took = time.perf_counter() - t0
        print(f"  {name} {count:,} rows in {took:5.1f} s ({count / took:,.0f} rows/s)", flush=True)
        changes += count
    return changes


def many_tables(
    server: EmbeddedServer, db: Database, spark: Any, args: argparse.Namespace, work: Path
) -> None:
    count = args.tables
    print(f"\n== 3. many tables: a backlog spread over {count} tables ==", flush=True)
    tables = [f"many{i:03d}" for i in range(count)]
    db.execute("; ".join(SCHEMA.format(table=t) for t in tables))
    db.execute(f"CREATE PUBLICATION pub_many FOR TABLE {', '.join(tables)}")
    for slot in ("many_recv", "many"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    print(
        f"workload: {args.rows:,} inserts + updates, {args.rows // 2:,} deletes over {count} "
        "tables, ten tables per transaction; 2 slots",
        flush=True,
    )
    total = many_workload(db, tables, args.rows, args.batch)
    endpos = Lsn.parse(str(db.execute("SELECT pg_current_wal_lsn()")[0][0]))
    db.execute("CHECKPOINT")
    print(f"  load average before the runs: {load()} on {os.cpu_count()} CPUs\n")
    print("draining many_recv with pg_recvlogical (proto 1) ...", end=" ", flush=True)
    base = run_recvlogical(server, db, "many_recv", endpos, "pub_many")
    print(f"{base.wall:.2f} s", flush=True)
    config = pipeline_config(
        db,
        "many",
        "many",
        "pub_many",
        tables,
        work / "many",
        available_now=True,
        max_changes=args.max_changes,
    )
    print(f"draining many with Pipeline.run() ({count} tables) ...", end=" ", flush=True)
    run = run_pipeline(server, db, spark, config)
    print(f"{run.result.wall:.2f} s", flush=True)
    applied = sum(b.report.changes for b in run.batches)
    if applied != total:
        print(f"  !! the pipeline's batches held {applied:,} changes, expected {total:,}")
    ratio = run.result.wall / base.wall
    per_change = run.result.client_cpu / total * 1e6
    print(
        f"\n  {count} tables: pipeline {run.result.wall:.2f} s, pg_recvlogical {base.wall:.2f} s: "
        f"ratio {ratio:.2f}; pipeline CPU {per_change:.2f} µs per change"
    )
    if MEASURED.get("one table ratio"):
        print(
            f"  against one table (part 1, {MEASURED['one table rows']:,} changes): ratio "
            f"{ratio / MEASURED['one table ratio']:.2f} times part 1's, CPU per change "
            f"{per_change / MEASURED['one table cpu']:.2f} times part 1's"
        )
    breakdown(run)
    print(f"  load average at the end: {load()} on {os.cpu_count()} CPUs")
    verify_all(db, config)


#: Part 1's figures, for part 3's comparison.
MEASURED: dict[str, float] = {}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="The Spark/Delta pipeline against pg_recvlogical: catch-up throughput "
        "and commit-to-visible freshness."
    )
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="N: inserts and updates; N/2 deletes (1e6)"
    )
    parser.add_argument("--batch", type=int, default=10_000, help="rows per transaction (10000)")
    parser.add_argument(
        "--max-changes",
        type=int,
        default=1_000_000,
        help="trigger.max_changes_per_batch (1000000)",
    )
    parser.add_argument(
        "--inline-max",
        type=int,
        help="trigger.inline_max_changes of the drain (the pipeline's default)",
    )
    parser.add_argument(
        "--freshness-seconds", type=float, default=60, help="live workload duration (60)"
    )
    parser.add_argument(
        "--warmup", type=float, default=5, help="live workload before the measurement (5)"
    )
    parser.add_argument(
        "--live-rows",
        type=int,
        default=0,
        help="rows in the live table before the measurement (0): the mirror's size",
    )
    parser.add_argument("--rate", type=float, default=2000, help="live row changes/s (2000)")
    parser.add_argument("--txn-rows", type=int, default=20, help="rows per live transaction (20)")
    parser.add_argument(
        "--interval", default="0.5 seconds", help="trigger.interval when live ('0.5 seconds')"
    )
    parser.add_argument(
        "--tables", type=int, default=100, help="tables of the many-tables part (100; 0: skip)"
    )
    parser.add_argument(
        "--only", choices=("throughput", "freshness", "many-tables"), help="run one part"
    )
    parser.add_argument("--pg-version", type=int, default=18, help="PostgreSQL major (18)")
    parser.add_argument("--cores", default="*", help="Spark's local[cores] (*)")
    parser.add_argument(
        "--master",
        help="a classic session on this master (spark://host:7077) instead of local[cores]: "
        "the executors' CPU is then not in the figures",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for --master's session (repeat it)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up run before the measured one: it then includes Spark's first query",
    )
    args = parser.parse_args(argv)

    settings: dict[str, str | int | bool] = {
        "autovacuum": False,
        "max_wal_size": "50GB",
        "checkpoint_timeout": "1h",
        "track_commit_timestamp": True,
    }
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-pipeline-"))
    try:
        with EmbeddedServer(args.pg_version, settings=settings) as server:
            db = server.create_database("bench")
            t0 = time.perf_counter()
            if args.master:
                conf = dict(setting.split("=", 1) for setting in args.conf)
                spark = classic_session("pgcdc-bench", args.master, {**QUIET, **conf})
            else:
                spark = local_session("pgcdc-bench", cores=args.cores, **QUIET)
            jvm = time.perf_counter() - t0
            master = args.master or f"local[{args.cores}]"
            print(
                f"PostgreSQL {server.version_string}; Spark {spark.version} {master} "
                f"started in {jvm:.1f} s (not measured below); {os.cpu_count()} CPUs",
                flush=True,
            )
            if args.only in (None, "throughput"):
                throughput(server, db, spark, args, work)
            if args.only in (None, "freshness"):
                freshness(server, db, spark, args, work)
            if args.only in (None, "many-tables") and args.tables > 0:
                many_tables(server, db, spark, args, work)
            spark.stop()
            db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
