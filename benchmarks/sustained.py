"""The pipeline under a steady, open-loop load: freshness, CPU per change, the lake's growth,
against pg_recvlogical on the same load in the same run.

What is measured
    One throwaway PostgreSQL 18 server (``pgcdc.embedded``; ``track_commit_timestamp`` on,
    otherwise its defaults: autovacuum runs) with the tables of benchmarks/_load.py: orders
    (bigint key; numeric, timestamptz, jsonb), line items (composite key), 16 hot counters, a
    30-column table with 1-3 kB text, ``big`` with ``--big-rows`` rows (2,000,000) under
    uniformly random updates, and a heartbeat (one row). All pre-populated, in one
    publication. Then:

    pipeline        ``benchmarks/_run_pipeline.py``: ``Pipeline(config, local_session(),
                    on_batch=...).run()`` in a process (and session) of its own, the tables in
                    mirror mode (``--history``: mirror + history), the trigger left at its
                    defaults (``--interval``, ``--max-changes``, ``--inline-max`` set it). It
                    copies the tables (its initial copy), then streams. ``--runner cli`` runs
                    ``pgcdc run`` instead (the same, without the per-batch phases).
    pg_recvlogical  the baseline: ``pg_recvlogical --start -f - -o proto_version=1 -o
                    publication_names=...`` (plugin pgoutput) on its own slot, created before
                    the pipeline's, its output read through a pipe here.

    The load runs in steps (``--rates``, changes/s, each ``--step-seconds``): ``--clients``
    worker processes send transactions of 1-20 row changes (inserts, updates, deletes over the
    five tables) on a fixed schedule without waiting for anyone (open loop: a server that
    cannot keep up shows as a lower achieved rate, said per step). A thread here updates the
    heartbeat row every 100 ms (``at = clock_timestamp()``). Rate 0 is the idle step: no
    load and no heartbeat. After each step the load pauses, one last heartbeat marks the end,
    both consumers catch up with it, and every target is checked against its table (row by
    row up to ``--exact-rows`` rows, else the aggregates of its integer columns and a sample
    of about ``--sample`` rows value by value, as benchmarks/snapshot.py does).

Freshness: commit to visible
    A heartbeat's commit time is the server's (``pg_xact_commit_timestamp``, the time the
    Commit message carries). It is visible when the first batch whose last commit time is at or
    past it has finished: the pipeline writes a batch's line to its batch log (``time``) after
    the Delta commits of all its targets, so from then on a reader sees that transaction and
    every one before it in every mirror (the measure a reader of several tables needs). The
    batch log gives that to the microsecond and costs the measured machine nothing. Polling
    the heartbeat's own mirror (``--poll-hz N``, a cross-check) sees one table, which can be
    visible before the batch's other tables are written, and only up to 1/N s late; it takes
    CPU from the machine being measured. pg_recvlogical's: the arrival time of the
    heartbeat's Commit message. Reported per step: p50, p95, p99 and max, also without the
    step's first ``max(2, min(10, step/4))`` seconds ("after N s": the first step starts
    right after the copy, and its first batch builds each target's key index); the lag trend
    (the median latency of those first and of the last as many seconds: "bounded" unless the
    end is more than 1.5 times the start plus 0.5 s) and how long the pipeline took to catch
    up once the load stopped.

CPU per change
    Per step, from its start until each consumer caught up with the end marker, from
    ``/proc/PID/stat`` (utime + stime): the pipeline's process tree (driver, apply processes,
    Spark JVM, Python workers; each process polled every 0.5 s, so that one that exits
    within the step keeps what it used: Spark's idle Python workers exit about a minute after
    the copy, and a sum of the tree at the step's two ends took their CPU back), its
    walsender (``active_pid`` of its slot), and the same for pg_recvlogical and its
    walsender; divided by the row changes the pipeline applied in that window (the
    batches'). The idle step gives the pipeline's CPU as % of a core.
    Also shown: the server's CPU (all its processes) and the load workers' (client side).

The lake
    After each step: the bytes on disk of the mirrors (and histories), against the source
    tables' ``pg_total_relation_size``; the bytes the step's Delta commits wrote (the files
    of their ``add`` actions in ``_delta_log``, but for a file added again with a new
    deletion vector only that vector) per byte of change (the batch log's ``bytes``:
    pgoutput's message bytes of the changes) and per byte of WAL written; growth per hour of
    load.

The pipeline's breakdown
    Its ``BatchReport.phases`` summed per step (whatever phases the pipeline reports: today
    plan, job, read, fold, write), the batches' own seconds, and idle = the window minus them.

``--pgbench``: a separate mode. ``pgbench -i -s 20`` (2 M accounts), the pipeline on
    pgbench_accounts, branches, tellers and history (and the heartbeat), then ``pgbench -c 4``
    at full speed for ``--step-seconds``; freshness from the heartbeat, as above.

No timing is asserted: this prints. Numbers from a busy machine are noise; the load
average is printed with each step.

How to run (from the repository root; `nice` on a shared machine)
    .venv/bin/python benchmarks/sustained.py --quick                 # smoke run, minutes
    .venv/bin/python benchmarks/sustained.py                         # 0 .. 30,000/s, 2 M rows
    .venv/bin/python benchmarks/sustained.py --history --rates 1000,10000
    .venv/bin/python benchmarks/sustained.py --big-rows 20000000 --rates 10000,30000
    .venv/bin/python benchmarks/sustained.py --pgbench --step-seconds 120
    ... --json results.json   (everything printed, as JSON)
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from psycopg import sql

import _load
from _common import Recvlogical, TreeCpu, load, percentile, process_cpu
from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.monitoring import BATCH_LOG, BatchRecord
from pgcdc.pipeline.verify import compare_history, compare_mirror
from pgcdc.protocol import datetime_to_pg_timestamp
from pgcdc.targets import DeltaTarget

HERE = Path(__file__).resolve().parent
HEARTBEAT_PERIOD = 0.1
SLOT, RECV_SLOT, PUBLICATION = "pipeline", "recv", "bench_pub"
NAME = "sustained"


# --------------------------------------------------------------------------- the tables


@dataclass(frozen=True, slots=True)
class Check:
    """How a table is checked when it is too big to compare row by row: the sums of these
    integer columns (and the row count) on both sides, then the rows whose `key` is a
    multiple of a step, value by value."""

    table: str
    key: str
    sums: tuple[str, ...]


SUSTAINED_TABLES = (
    Check("orders", "id", ("id", "customer_id")),
    Check("line_items", "order_id", ("order_id", "line_no", "qty")),
    Check("counters", "id", ("id", "n")),
    Check("wide", "id", ("id", "i01", "i05")),
    Check("big", "id", ("id", "v")),
    Check("heartbeat", "id", ("id", "seq")),
)
PGBENCH_TABLES = (
    Check("pgbench_accounts", "aid", ("aid", "bid", "abalance")),
    Check("pgbench_branches", "bid", ("bid", "bbalance")),
    Check("pgbench_tellers", "tid", ("tid", "bid", "tbalance")),
    Check("pgbench_history", "aid", ("tid", "bid", "aid", "delta")),
    Check("heartbeat", "id", ("id", "seq")),
)
HEARTBEAT_SCHEMA = (
    "CREATE TABLE heartbeat (id int PRIMARY KEY, seq bigint NOT NULL, at timestamptz NOT NULL);"
    "INSERT INTO heartbeat VALUES (1, 0, clock_timestamp())"
)
BEAT = (
    "UPDATE heartbeat SET seq = seq + 1, at = clock_timestamp() WHERE id = 1 "
    "RETURNING seq, pg_current_xact_id()::text::bigint"
)


def commit_times(db: Database, xids: list[int]) -> dict[int, datetime]:
    """The server's commit timestamps of transactions (track_commit_timestamp)."""
    rows = db.execute(
        "SELECT x, pg_xact_commit_timestamp(x::text::xid) FROM unnest(%s::bigint[]) AS x",
        (xids,),
    )
    return {int(x): ts for x, ts in rows if ts is not None}


class Heartbeat:
    """Updates the heartbeat row every 100 ms (while `beating`); keeps (seq, xid) of each."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.beats: list[tuple[int, int]] = []
        self.beating = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def beat(self) -> tuple[int, int]:
        with self._lock:
            row = self.conn.execute(BEAT).fetchone()
            assert row is not None
            self.beats.append((int(row[0]), int(row[1])))
            return self.beats[-1]

    def _run(self) -> None:
        due = time.monotonic()
        try:
            while not self._stop.is_set():
                if self.beating.is_set():
                    self.beat()
                due = max(due + HEARTBEAT_PERIOD, time.monotonic() - HEARTBEAT_PERIOD)
                self._stop.wait(max(0.0, due - time.monotonic()))
        except BaseException as exc:
            self.error = exc

    def pause(self) -> None:
        self.beating.clear()
        with self._lock:  # a beat in flight ends first
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()


# --------------------------------------------------------------------------- the pipeline

#: How many of a step's slowest batches the report shows.
SLOWEST = 3


@dataclass(slots=True)
class Batch:
    """One batch: its batch log line, and its phases from the runner's report."""

    number: int
    at: float  # when it finished (time.time()): its rows are visible from then on
    changes: int
    bytes: int
    last_commit: datetime | None
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    #: Per table: the seconds its work took (the batch log's targets).
    tables: dict[str, float] = field(default_factory=dict)


class JsonLines:
    """New complete lines of a file another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


class BatchLogLines:
    """New records of a pipeline's batch log: a directory of numbered segments, each written
    whole again as it grows, the oldest removed (`pgcdc.monitoring.BatchLog`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.segment: str | None = None  # the one read last, and how far
        self.offset = 0

    def read(self) -> list[BatchRecord]:
        names = (
            sorted(p.name for p in self.directory.glob("*.jsonl"))
            if self.directory.exists()
            else []
        )
        records = []
        for name in names:
            if self.segment is not None and name < self.segment:
                continue
            if name != self.segment:
                self.segment, self.offset = name, 0
            try:
                data = (self.directory / name).read_bytes()
            except FileNotFoundError:
                continue
            complete = data[self.offset : data.rfind(b"\n") + 1]
            self.offset += len(complete)
            lines = complete.splitlines()
            records += [BatchRecord.from_json(json.loads(line)) for line in lines if line.strip()]
        return records


class PipelineProcess:
    """The pipeline in its own process group, and what it reports: the batch log (every
    runner) and the per-batch phases (``_run_pipeline.py`` only)."""

    def __init__(self, config_path: Path, state: Path, work: Path, runner: str, cores: str):
        reports = work / "reports.jsonl"
        if runner == "cli":
            pgcdc = Path(sys.executable).with_name("pgcdc")
            cmd = [str(pgcdc if pgcdc.exists() else "pgcdc"), "run", str(config_path)]
        else:
            script = HERE / "_run_pipeline.py"
            cmd = [sys.executable, str(script), str(config_path), str(reports), "--cores", cores]
        self.log_path = work / "pipeline.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the process runs)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop it cleanly
        )
        self._log_lines = BatchLogLines(state / BATCH_LOG)
        self._reports = JsonLines(reports)
        self._phases: dict[int, dict[str, float]] = {}
        self.batches: list[Batch] = []
        self.last_commit: datetime | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> None:
        """Read what is new; raise if the process has ended."""
        for record in self._log_lines.read():
            self.batches.append(
                Batch(
                    record.batch,
                    record.time.timestamp(),
                    record.changes,
                    record.bytes,
                    record.last_commit_time,
                    record.seconds,
                    dict(record.phases),
                    {
                        name.rsplit(" ", 1)[0]: float(target.get("seconds", 0.0))
                        for name, target in record.targets.items()
                    },
                )
            )
            if record.last_commit_time is not None:
                self.last_commit = record.last_commit_time
        for data in self._reports.read():
            self._phases[int(data["batch"])] = {k: float(v) for k, v in data["phases"].items()}
        for batch in self.batches[-50:]:
            if not batch.phases and batch.number in self._phases:
                batch.phases = self._phases.pop(batch.number)
        if self.proc.poll() is not None:
            raise PipelineDied(f"the pipeline exited ({self.proc.returncode}): {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n    ".join(["", *text[-lines:]]) if text else "(no output)"

    def seen(self, commit: datetime) -> bool:
        return self.last_commit is not None and self.last_commit >= commit

    def stop(self) -> None:
        """SIGINT (the batch in progress finishes), then the process group's SIGTERM and
        SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                    try:
                        os.killpg(self.proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        self.proc.wait(wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        with suppress(ProcessLookupError, PermissionError):  # a JVM or worker left over
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


class PipelineDied(RuntimeError):
    pass


def pipeline_toml(args: argparse.Namespace, dsn: str, lake: Path, tables: list[str]) -> str:
    """The pipeline's configuration (strings as JSON strings: valid TOML basic strings)."""
    q = json.dumps
    modes = '["mirror", "history"]' if args.history else '"mirror"'
    lines = [
        f"name = {q(NAME)}",
        "[source]",
        f"conninfo = {q(dsn)}",
        f"publication = {q(PUBLICATION)}",
        f"slot = {q(SLOT)}",
        "create_slot = true",
        "[target]",
        f"path = {q(str(lake))}",
        "[trigger]",
    ]
    if args.interval is not None:
        lines.append(f"interval = {q(args.interval)}")
    if args.max_changes is not None:
        lines.append(f"max_changes_per_batch = {args.max_changes}")
    if args.inline_max is not None:
        lines.append(f"inline_max_changes = {args.inline_max}")
    if args.apply_processes is not None:
        lines.append(f"apply_processes = {args.apply_processes}")
    lines.append("[tables]")
    lines += [f'"public.{t}" = {modes}' for t in tables]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the load


@dataclass(slots=True)
class LoadResult:
    """What the load did in one step."""

    asked: float | None  # changes/s (None: as fast as it goes)
    committed: int  # row changes committed
    transactions: int
    failed: int = 0
    late: int = 0
    max_behind: float = 0.0
    behind_at_end: float = 0.0
    client_cpu: float = 0.0
    note: str = ""


class Workers:
    """The open-loop load: `clients` processes of `_load.worker_main`."""

    def __init__(self, dsn: str, clients: int, sizes: _load.Sizes, seed: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = []
        self.procs = []
        for index in range(clients):
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=_load.worker_main,
                args=(dsn, index, clients, sizes, seed, theirs),
                name=f"load-{index}",
                daemon=True,
            )
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)
        for pipe in self.pipes:
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError("a load worker did not start")

    def run(self, rate: float, start: float, seconds: float) -> LoadResult:
        for pipe in self.pipes:
            pipe.send(("run", rate / len(self.pipes), start, seconds))
        stats = []
        for pipe in self.pipes:
            if not pipe.poll(seconds + 120):
                raise RuntimeError("a load worker did not finish its step")
            stats.append(pipe.recv())
        errors = [s["error"] for s in stats if "error" in s]
        if errors:
            raise RuntimeError(f"a load worker failed: {errors[0]}")
        return LoadResult(
            asked=rate,
            committed=sum(s["changes"] for s in stats),
            transactions=sum(s["transactions"] for s in stats),
            failed=sum(s["failed"] for s in stats),
            late=sum(s["late"] for s in stats),
            max_behind=max(s["max_behind"] for s in stats),
            behind_at_end=max(s["behind_at_end"] for s in stats),
            client_cpu=sum(s["cpu"] for s in stats),
        )

    def close(self) -> None:
        for pipe in self.pipes:
            with suppress(OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


class Pgbench:
    """``pgbench -c 4`` at full speed: 3 updates and an insert per transaction."""

    TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")
    PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
    FAILED = re.compile(r"number of failed transactions: (\d+)")

    def __init__(self, server: EmbeddedServer, db: Database, clients: int) -> None:
        self.cmd = [str(server.bindir / "pgbench"), "-n", "-c", str(clients), db.dsn]
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, rate: float, start: float, seconds: float) -> LoadResult:
        time.sleep(max(0.0, start - time.time()))
        cmd = [*self.cmd[:-1], "-T", str(max(1, round(seconds))), self.cmd[-1]]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = self.proc.communicate()
        text = out.decode(errors="replace")
        processed = self.PROCESSED.search(text)
        if self.proc.returncode != 0 or processed is None:
            raise RuntimeError(f"pgbench exited {self.proc.returncode}: {text.strip()[-500:]}")
        failed = self.FAILED.search(text)
        tps = self.TPS.search(text)
        return LoadResult(
            asked=None,
            committed=4 * int(processed.group(1)),
            transactions=int(processed.group(1)),
            failed=int(failed.group(1)) if failed else 0,
            note=f"pgbench: {float(tps.group(1)) if tps else float('nan'):,.0f} tps",
        )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


# --------------------------------------------------------------------------- the lake


def dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


class Lake:
    """The targets on disk, and what their Delta commits added since the last look."""

    def __init__(self, targets: list[tuple[str, str, Path]]) -> None:
        self.targets = targets  # (table, mode, path)
        self.read_up_to = {path: -1 for _, _, path in targets}

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, mode, path in self.targets:
            out[mode] = out.get(mode, 0) + dir_size(path)
        return out

    def written(self) -> tuple[int, int, int]:
        """(bytes of data files added, bytes of log written, commits) since the last call."""
        added = log_bytes = commits = 0
        for _, _, path in self.targets:
            log = path / "_delta_log"
            if not log.is_dir():
                continue
            last = self.read_up_to[path]
            for entry in sorted(log.iterdir()):
                version = entry.name.split(".", 1)[0]
                if not version.isdigit() or int(version) <= last:
                    continue
                log_bytes += entry.stat().st_size
                if entry.name.endswith(".json"):
                    commits += 1
                    added += _commit_written(entry)
                    self.read_up_to[path] = max(self.read_up_to[path], int(version))
        return added, log_bytes, commits


def _commit_written(entry: Path) -> int:
    """Bytes of data one commit wrote: the files it added, and its deletion vectors' files.
    A file removed and added again in the same commit only got a new deletion vector (its
    data was not written again)."""
    actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    written = 0
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        if add["path"] not in removed:
            written += int(add.get("size", 0))
        dv = add.get("deletionVector")
        if dv and dv.get("storageType") != "i":
            written += int(dv.get("sizeInBytes", 0))
    return written


# --------------------------------------------------------------------------- checking


def delta_query(path: Path, query: str) -> pa.Table:
    """`query` over the Delta table at `path` (registered as ``t``), through DataFusion."""
    return pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute(query))


def check_target(
    db: Database, check: Check, mode: str, path: Path, exact_rows: int, sample: int
) -> tuple[bool, str]:
    """One target against its table: (identical?, one line)."""
    table = f"public.{check.table}"
    name = f"{check.table} {mode}"
    if not DeltaTable.is_deltatable(str(path)):
        return False, f"{name}: no Delta table at {path}"
    current = ' WHERE "__END_AT" IS NULL' if mode == "history" else ""
    rows = delta_query(path, "SELECT count(*) AS n FROM t").column(0)[0].as_py()
    if rows <= exact_rows:
        kind = "history" if mode == "history" else "mirror"
        target = DeltaTarget(str(path), kind, app_id=f"pgcdc:{NAME}").to_arrow()
        compare = compare_history if mode == "history" else compare_mirror
        verdict = compare(db.dsn, table, target)
        return verdict.equal, f"{verdict} ({mode}, row by row)"
    sums = ", ".join(f"sum({c})" for c in check.sums)
    want = [int(v or 0) for v in db.execute(f"SELECT count(*), {sums} FROM {check.table}")[0]]
    got = [
        int(c[0].as_py() or 0)
        for c in delta_query(path, f"SELECT count(*), {sums} FROM t{current}").columns
    ]
    if want != got:
        return False, (
            f"{name}: DIFFERENT aggregates (count, {', '.join(check.sums)}): source {want}, "
            f"target {got}"
        )
    step = max(1, want[0] // max(1, sample))
    where = f"{check.key} % {step} = 0"
    picked = delta_query(path, f"SELECT * FROM t WHERE {where}{current.replace('WHERE', 'AND')}")
    verdict = compare_mirror(db.dsn, table, picked, sql.SQL(where))
    how = f"aggregates of {want[0]:,} rows, {verdict.source_rows:,} rows value by value"
    if mode == "history":
        how += f" (current versions of {rows:,})"
    if not verdict.equal:
        return False, f"{verdict} ({mode}; {how})"
    return True, f"{name}: identical ({how})"


# --------------------------------------------------------------------------- a step


@dataclass(slots=True)
class Latency:
    count: int
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Latency:
        values = sorted(values)
        return cls(len(values), *(percentile(values, p) for p in (50, 95, 99, 100)))


@dataclass(slots=True)
class StepResult:
    label: str
    rate: float | None
    seconds: float
    load: LoadResult
    achieved: float
    load_average: str
    changes: int = 0  # the pipeline's batches in the window
    batches: int = 0
    pipeline: Latency | None = None
    #: The pipeline's beats of the step minus its first seconds (`warm_after`): what a step
    #: that starts cold (right after the copy: the first batch builds each target's key
    #: index) shows once that is done.
    warm: Latency | None = None
    warm_after: float = 0.0
    recv: Latency | None = None
    poll: Latency | None = None
    lag_start: float | None = None
    lag_end: float | None = None
    lag_trend: str = ""
    drain: float = 0.0  # seconds from the load's end to the pipeline's catching up
    recv_drain: float = 0.0
    pipeline_cpu: float = 0.0  # from the start until it caught up with the end marker
    pipeline_window: float = 0.0
    load_cpu: float = 0.0  # from the start until the load stopped (`seconds`)
    load_walsender_cpu: float | None = None
    walsender_cpu: float | None = None
    recv_cpu: float = 0.0
    recv_walsender_cpu: float | None = None
    server_cpu: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    #: Per table: the seconds of its work summed over the step's batches.
    table_seconds: dict[str, float] = field(default_factory=dict)
    batch_seconds: float = 0.0
    #: The step's slowest batches (what makes the latency's tail): seconds, changes, phases.
    slowest: list[dict[str, Any]] = field(default_factory=list)
    change_bytes: int = 0
    wal_bytes: int = 0
    lake: dict[str, int] = field(default_factory=dict)
    lake_growth: dict[str, int] = field(default_factory=dict)
    source_bytes: int = 0
    data_written: int = 0
    log_written: int = 0
    delta_commits: int = 0
    verified: bool = True
    verdicts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def per_change(self, cpu: float | None) -> float | None:
        return None if cpu is None or not self.changes else cpu / self.changes * 1e6


class Bench:
    """Everything a run holds: the server, the pipeline, pg_recvlogical, the load."""

    def __init__(
        self,
        args: argparse.Namespace,
        server: EmbeddedServer,
        db: Database,
        pipeline: PipelineProcess,
        recv: Recvlogical,
        heartbeat: Heartbeat,
        driver: Workers | Pgbench,
        lake: Lake,
        checks: tuple[Check, ...],
    ) -> None:
        self.args, self.server, self.db = args, server, db
        self.pipeline, self.recv, self.heartbeat = pipeline, recv, heartbeat
        self.driver, self.lake, self.checks = driver, lake, checks
        self.lake_before = lake.sizes()
        self.poller: HeartbeatPoller | None = None
        #: CPU samples (process, walsender) taken when each consumer caught up.
        self.samples: dict[str, tuple[float, float | None]] = {}
        #: The CPU of the pipeline's process tree and of the server's, as running totals.
        self.pipeline_cpu = TreeCpu(pipeline.pid)
        self.server_cpu = TreeCpu(server.pid or 0)

    def close(self) -> None:
        self.pipeline_cpu.stop()
        self.server_cpu.stop()

    def walsender(self, slot: str) -> int | None:
        rows = self.db.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        return rows[0][0] if rows and rows[0][0] else None

    def wal_lsn(self) -> int:
        return int(self.db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])

    def mark(self) -> datetime:
        """One heartbeat (the load paused): its commit time."""
        _, xid = self.heartbeat.beat()
        return commit_times(self.db, [xid])[xid]

    def catch_up(self, commit: datetime, timeout: float) -> tuple[float | None, float | None]:
        """Wait until both consumers have `commit`: when each did (time.time()), None for a
        consumer that did not within `timeout`; the CPU samples are taken at those times."""
        deadline = time.monotonic() + timeout
        key = datetime_to_pg_timestamp(commit)
        pipe_at = recv_at = None
        while (pipe_at is None or recv_at is None) and time.monotonic() < deadline:
            self.pipeline.poll()
            now = time.time()
            if pipe_at is None and self.pipeline.seen(commit):
                pipe_at = now
                self.samples["pipeline"] = self.sample_pipeline()
            if recv_at is None and key in self.recv.seen:
                recv_at = now
                self.samples["recv"] = self.sample_recv()
            time.sleep(0.02)
        return pipe_at, recv_at

    def sample_pipeline(self) -> tuple[float, float | None]:
        pid = self.walsender(SLOT)
        return self.pipeline_cpu.poll(), None if pid is None else process_cpu(pid)

    def sample_recv(self) -> tuple[float, float | None]:
        pid = self.walsender(RECV_SLOT)
        recv = process_cpu(self.recv.proc.pid) or 0.0
        return recv, None if pid is None else process_cpu(pid)

    def step(self, label: str, rate: float | None, seconds: float) -> StepResult:
        """One step of load at `rate` (0: idle, no heartbeat; None: pgbench's full speed),
        then the catch-up and the checks."""
        self.pipeline.poll()
        first_batch = len(self.pipeline.batches)
        beats_before = len(self.heartbeat.beats)
        pipe_ws, recv_ws = self.walsender(SLOT), self.walsender(RECV_SLOT)
        start = time.time() + 0.3
        time.sleep(max(0.0, start - time.time()))
        self.samples = {}
        base_pipe, base_recv = self.sample_pipeline(), self.sample_recv()
        base_server = self.server_cpu.poll()
        wal0 = self.wal_lsn()
        self.lake.written()  # what came before belongs to the step before
        if rate != 0:
            self.heartbeat.beating.set()
        if rate == 0:
            done = LoadResult(asked=0.0, committed=0, transactions=0)
            self._wait(start + seconds)
        else:
            outcome: list[LoadResult | BaseException] = []

            def drive() -> None:
                try:
                    outcome.append(self.driver.run(rate or 0.0, start, seconds))
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=drive, name="load", daemon=True)
            thread.start()
            self._wait(start + seconds, thread)
            thread.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            done = outcome[0]
        ended = time.time()
        at_end = self.sample_pipeline()  # the idle step's figure: without the end marker
        self.heartbeat.pause()
        if self.heartbeat.error is not None:
            raise RuntimeError(f"the heartbeat failed: {self.heartbeat.error}")
        marker = self.mark()
        timeout = max(300.0, 3 * seconds)
        pipe_at, recv_at = self.catch_up(marker, timeout)
        time.sleep(0.2)  # the runner reports a batch's phases just after its batch log line
        self.pipeline.poll()
        server_cpu = self.server_cpu.poll() - base_server
        wal_bytes = self.wal_lsn() - wal0
        span = ended - start
        result = StepResult(
            label,
            rate,
            span,
            done,
            done.committed / span,
            load(),
            server_cpu=server_cpu,
            wal_bytes=wal_bytes,
        )
        if done.asked and result.achieved < 0.95 * done.asked:
            result.notes.append(
                f"the load reached {result.achieved:,.0f} of {done.asked:,.0f} changes/s "
                f"(server and {len(getattr(self.driver, 'procs', []))} clients on "
                f"{os.cpu_count()} CPUs; the workers used {done.client_cpu / span:.2f} cores)"
            )
        if pipe_at is None:
            result.notes.append(f"the pipeline did not catch up within {timeout:.0f} s")
        if recv_at is None:
            result.notes.append(f"pg_recvlogical did not catch up within {timeout:.0f} s")
        window_end = pipe_at if pipe_at is not None else time.time()
        batches = [
            b for b in self.pipeline.batches[first_batch:] if start < b.at <= window_end + 1e-3
        ]
        self._cpu(result, base_pipe, base_recv, pipe_ws, recv_ws, window_end - start)
        result.load_cpu = at_end[0] - base_pipe[0]
        if at_end[1] is not None and base_pipe[1] is not None:
            result.load_walsender_cpu = at_end[1] - base_pipe[1]
        result.changes = sum(b.changes for b in batches)
        result.batches = len(batches)
        result.change_bytes = sum(b.bytes for b in batches)
        result.batch_seconds = sum(b.seconds for b in batches)
        for batch in batches:
            for phase, value in batch.phases.items():
                result.phases[phase] = result.phases.get(phase, 0.0) + value
            for table, value in batch.tables.items():
                result.table_seconds[table] = result.table_seconds.get(table, 0.0) + value
        result.slowest = [
            {"seconds": b.seconds, "changes": b.changes, "phases": b.phases, "tables": b.tables}
            for b in sorted(batches, key=lambda b: b.seconds, reverse=True)[:SLOWEST]
        ]
        visible = next((b.at for b in batches if b.last_commit and b.last_commit >= marker), None)
        result.drain = 0.0 if visible is None else max(0.0, visible - ended)
        result.recv_drain = 0.0 if recv_at is None else max(0.0, recv_at - ended)
        expected = done.committed + len(self.heartbeat.beats) - beats_before
        if pipe_at is not None and result.changes != expected:
            result.notes.append(
                f"the pipeline's batches held {result.changes:,} changes in the window; the "
                f"load and heartbeat committed {expected:,}"
            )
        self._freshness(result, beats_before, start, ended)
        self._lake(result)
        if not self.args.no_verify:
            self._verify(result)
        return result

    def _wait(self, until: float, thread: threading.Thread | None = None) -> None:
        """Sleep until `until` (or the load thread's end), watching the pipeline."""
        while (now := time.time()) < until or (thread is not None and thread.is_alive()):
            self.pipeline.poll()
            time.sleep(min(0.5, max(0.05, until - now)))

    def _cpu(
        self,
        result: StepResult,
        base_pipe: tuple[float, float | None],
        base_recv: tuple[float, float | None],
        pipe_ws: int | None,
        recv_ws: int | None,
        window: float,
    ) -> None:
        pipe = self.samples.get("pipeline") or self.sample_pipeline()
        recv = self.samples.get("recv") or self.sample_recv()
        result.pipeline_cpu = pipe[0] - base_pipe[0]
        result.pipeline_window = window
        result.recv_cpu = recv[0] - base_recv[0]
        for name, now, before, pid, slot in (
            ("walsender_cpu", pipe[1], base_pipe[1], pipe_ws, SLOT),
            ("recv_walsender_cpu", recv[1], base_recv[1], recv_ws, RECV_SLOT),
        ):
            if now is None or before is None or self.walsender(slot) != pid:
                result.notes.append(f"the walsender of slot {slot} changed: its CPU is not shown")
                continue
            setattr(result, name, now - before)

    def _freshness(self, result: StepResult, beats_before: int, start: float, ended: float) -> None:
        beats = self.heartbeat.beats[beats_before:-1]  # the last one is the end marker
        if not beats:
            return
        commits = commit_times(self.db, [x for _, x in beats])
        batches = [b for b in self.pipeline.batches if b.last_commit is not None]
        pipe: list[tuple[float, float]] = []  # (commit time, latency)
        recv: list[float] = []
        i = 0
        for _, xid in beats:
            commit = commits.get(xid)
            if commit is None:
                continue
            at = commit.timestamp()
            while i < len(batches) and batches[i].last_commit < commit:  # type: ignore[operator]
                i += 1
            if i < len(batches):
                pipe.append((at, batches[i].at - at))
            arrived = self.recv.seen.get(datetime_to_pg_timestamp(commit))
            if arrived is not None:
                recv.append(arrived - at)
        if pipe:
            result.pipeline = Latency.of([x for _, x in pipe])
            edge = max(2.0, min(10.0, (ended - start) / 4))
            warm = [x for t, x in pipe if t >= start + edge]
            if warm:
                result.warm, result.warm_after = Latency.of(warm), edge
            head = [x for t, x in pipe if t < start + edge]
            tail = [x for t, x in pipe if t >= ended - edge]
            if head and tail:
                result.lag_start = statistics.median(head)
                result.lag_end = statistics.median(tail)
                grows = result.lag_end > 1.5 * result.lag_start + 0.5
                result.lag_trend = "GROWS" if grows else "bounded"
        if recv:
            result.recv = Latency.of(recv)
        if self.poller is not None:
            polled = [
                seen - commit.timestamp()
                for seq, xid in beats
                if (commit := commits.get(xid)) is not None
                and (seen := self.poller.visible(seq)) is not None
            ]
            if polled:
                result.poll = Latency.of(polled)

    def _lake(self, result: StepResult) -> None:
        sizes = self.lake.sizes()
        result.lake = sizes
        result.lake_growth = {m: sizes[m] - self.lake_before.get(m, 0) for m in sizes}
        self.lake_before = sizes
        result.data_written, result.log_written, result.delta_commits = self.lake.written()
        names = [c.table for c in self.checks]
        result.source_bytes = int(
            self.db.execute(
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c", (names,)
            )[0][0]
        )

    def _verify(self, result: StepResult) -> None:
        t0 = time.perf_counter()
        for check in self.checks:
            for table, mode, path in self.lake.targets:
                if table != check.table:
                    continue
                ok, line = check_target(
                    self.db, check, mode, path, self.args.exact_rows, self.args.sample
                )
                result.verified &= ok
                result.verdicts.append(line)
        if result.verified:
            result.verdicts.insert(
                0,
                f"all {len(self.lake.targets)} targets identical to their tables "
                f"({time.perf_counter() - t0:.0f} s)",
            )


class HeartbeatPoller:
    """--poll-hz: reads the heartbeat mirror N times a second. A beat is visible from the
    first read that shows its seq or a later one (the mirror holds only the latest)."""

    def __init__(self, path: Path, hz: float) -> None:
        self.path, self.period = path, 1.0 / hz
        self.shown: list[tuple[int, float]] = []  # (seq, when first read), seq increasing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        table: DeltaTable | None = None
        while not self._stop.wait(self.period):
            try:
                if table is None:
                    table = DeltaTable(str(self.path))
                else:
                    table.update_incremental()
                reader = QueryBuilder().register("t", table).execute("SELECT seq FROM t")
                now = time.time()
                seqs = [int(v) for batch in reader for v in batch.column(0).to_pylist()]
            except Exception:  # not created yet, or a commit being written
                continue
            if seqs and (not self.shown or max(seqs) > self.shown[-1][0]):
                self.shown.append((max(seqs), now))

    def visible(self, seq: int) -> float | None:
        """When the mirror first showed `seq` (or a later beat)."""
        i = bisect.bisect_left(self.shown, (seq, float("-inf")))
        return self.shown[i][1] if i < len(self.shown) else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --------------------------------------------------------------------------- output


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def print_step(result: StepResult) -> None:
    r = result
    asked = "full speed" if r.rate is None else f"{r.rate:,.0f}/s"
    print(
        f"\n-- step {r.label}: asked {asked}, achieved {r.achieved:,.0f} changes/s "
        f"({r.load.transactions:,} transactions, {r.load.failed} failed"
        f"{', ' + r.load.note if r.load.note else ''}); load average {r.load_average}"
    )
    if r.load.asked:
        print(
            f"   open loop: {r.load.late:,} transactions sent > 50 ms late, worst "
            f"{r.load.max_behind:.2f} s behind, {r.load.behind_at_end:.2f} s behind at the end; "
            f"the clients used {r.load.client_cpu / r.seconds:.2f} cores"
        )
    warm = f"after {r.warm_after:.0f} s"
    for name, lat in (
        ("pipeline", r.pipeline),
        (warm, r.warm),
        ("pg_recvlogical", r.recv),
        ("Delta poll", r.poll),
    ):
        if lat is not None:
            print(
                f"   commit to visible, {name:<14} {lat.count:>5} beats: p50 {lat.p50:6.3f}  "
                f"p95 {lat.p95:6.3f}  p99 {lat.p99:6.3f}  max {lat.max:6.3f} s"
            )
    if r.lag_trend:
        print(
            f"   lag {r.lag_start:.2f} s at the start, {r.lag_end:.2f} s at the end: "
            f"{r.lag_trend}; caught up {r.drain:.2f} s after the load stopped "
            f"(pg_recvlogical {r.recv_drain:.2f} s)"
        )
    window = r.pipeline_window or 1.0
    if r.rate == 0:
        walsender = "-" if r.load_walsender_cpu is None else f"{r.load_walsender_cpu:.2f} s"
        print(
            f"   idle: the pipeline used {r.load_cpu:.2f} CPU s in {r.seconds:.0f} s, "
            f"{100 * r.load_cpu / r.seconds:.1f}% of a core; its walsender {walsender}"
        )
    else:
        print(
            f"   pipeline: {r.batches} batches, {r.changes:,} changes in {window:.1f} s (until it "
            f"caught up); CPU {r.pipeline_cpu:.1f} s, {r.pipeline_cpu / window:.2f} cores"
        )
        print(
            f"   µs per change: pipeline {_us(r.per_change(r.pipeline_cpu))}, its walsender "
            f"{_us(r.per_change(r.walsender_cpu))}; pg_recvlogical {_us(r.per_change(r.recv_cpu))}"
            f", its walsender {_us(r.per_change(r.recv_walsender_cpu))}; the server (all its "
            f"processes) {_us(r.per_change(r.server_cpu))}"
        )
    if r.batches:
        idle = max(0.0, window - r.batch_seconds)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items())
        print(
            f"   batches: {r.batch_seconds:.2f} s of {window:.1f} s (idle {idle:.1f} s), "
            f"{r.changes / r.batches:,.0f} changes each"
            + (f"; phases summed: {phases}" if phases else "")
        )
    if r.table_seconds:
        tables = sorted(r.table_seconds.items(), key=lambda t: -t[1])
        print("   tables, seconds summed: " + ", ".join(f"{t} {v:.2f}" for t, v in tables))
    lake = ", ".join(
        f"{m} {_mb(v)} MB (+{_mb(r.lake_growth.get(m, 0))}, "
        f"{_mb(int(r.lake_growth.get(m, 0) * 3600 / r.seconds))} MB/h)"
        for m, v in r.lake.items()
    )
    written = (
        f"{_mb(r.data_written)} MB of data files and {_mb(r.log_written)} MB of log in "
        f"{r.delta_commits} Delta commits"
    )
    if r.change_bytes and r.rate != 0:
        written += (
            f": {r.data_written / r.change_bytes:.1f} bytes per byte of change "
            f"({_mb(r.change_bytes)} MB), {r.data_written / max(1, r.wal_bytes):.2f} per byte of "
            f"WAL ({_mb(r.wal_bytes)} MB)"
        )
    print(f"   lake: {lake}; the source tables {_mb(r.source_bytes)} MB")
    print(f"   written: {written}")
    for line in r.verdicts[:1] if r.verified else r.verdicts:  # all of them in the JSON
        print(f"   check: {line}")
    for note in r.notes:
        print(f"   !! {note}")
    sys.stdout.flush()


def print_summary(results: list[StepResult]) -> None:
    print(
        "\n== summary: commit to visible (s), CPU per change (µs), pg_recvlogical on the same "
        "load in the same run =="
    )
    print(
        f"{'asked/s':>9} {'got/s':>7} {'p50':>6} {'p99':>6} {'lag start>end':>15} "
        f"{'pipe µs':>8} {'cores':>5} {'walsnd':>7} {'recv µs':>7} {'r.wsnd':>7} {'r.p99':>6} "
        f"{'check':>5} {'lake MB':>8} {'w/chg':>5}"
    )
    for r in results:
        asked = "pgbench" if r.rate is None else f"{r.rate:,.0f}"
        lag = "-" if not r.lag_trend else f"{r.lag_start:.1f}>{r.lag_end:.1f} {r.lag_trend[:5]}"
        p50, p99 = (r.pipeline.p50, r.pipeline.p99) if r.pipeline else (None, None)
        recv_p99 = r.recv.p99 if r.recv else None
        idle = r.rate == 0
        amp = f"{r.data_written / r.change_bytes:.1f}" if r.change_bytes and not idle else "-"
        cores = (r.load_cpu / r.seconds) if idle else r.pipeline_cpu / (r.pipeline_window or 1)

        def us(cpu: float | None, r: StepResult = r) -> str:
            return "-" if r.rate == 0 else _us(r.per_change(cpu))

        print(
            f"{asked:>9} {r.achieved:>7,.0f} {_ms(p50):>6} {_ms(p99):>6} {lag:>15} "
            f"{us(r.pipeline_cpu):>8} {cores:>5.2f} {us(r.walsender_cpu):>7} "
            f"{us(r.recv_cpu):>7} {us(r.recv_walsender_cpu):>7} {_ms(recv_p99):>6} "
            f"{'ok' if r.verified else 'DIFF':>5} {_mb(sum(r.lake.values())):>8} {amp:>5}"
        )
    print(
        "  (lag: median latency of the step's first and last seconds; cores: the pipeline's, "
        "until it caught up;\n   walsnd: its walsender; r.: pg_recvlogical's; w/chg: Delta "
        "bytes written per byte of change)"
    )
    print("\nratios against pg_recvlogical (pipeline / pg_recvlogical):")
    for r in results:
        if not r.changes or r.rate == 0:
            continue
        parts = []
        if r.recv_cpu:
            parts.append(f"CPU per change {r.pipeline_cpu / r.recv_cpu:,.0f}x")
        if r.walsender_cpu and r.recv_walsender_cpu:
            parts.append(f"its walsender's {r.walsender_cpu / r.recv_walsender_cpu:.2f}x")
        if r.pipeline and r.recv and r.recv.p50 > 0:
            parts.append(
                f"freshness p50 {r.pipeline.p50 / r.recv.p50:,.0f}x, p99 "
                f"{r.pipeline.p99 / max(r.recv.p99, 1e-6):,.0f}x"
            )
        asked = "pgbench" if r.rate is None else f"{r.rate:,.0f}/s"
        print(f"  {asked:>10}: " + ", ".join(parts))
    phases = list(dict.fromkeys(p for r in results for p in r.phases))
    print(
        "\nthe pipeline's batches per step (seconds summed over the step's batches; idle: the "
        "window without a batch)"
    )
    print(
        f"{'asked/s':>9} {'batches':>7} {'chg/batch':>9} {'window':>7} {'batches':>7} "
        f"{'idle':>6} " + " ".join(f"{p:>7}" for p in phases).rstrip()
    )
    for r in results:
        asked = "pgbench" if r.rate is None else f"{r.rate:,.0f}"
        window = r.pipeline_window
        per = f"{r.changes / r.batches:,.0f}" if r.batches else "-"
        print(
            f"{asked:>9} {r.batches:>7} {per:>9} {window:>7.1f} {r.batch_seconds:>7.2f} "
            f"{max(0.0, window - r.batch_seconds):>6.1f} "
            + " ".join(f"{r.phases.get(p, 0.0):>7.2f}" for p in phases).rstrip()
        )
    print(f"\nthe {SLOWEST} slowest batches of each step (seconds; phases as above)")
    for r in results:
        asked = "pgbench" if r.rate is None else f"{r.rate:,.0f}/s"
        for b in r.slowest:
            spent = ", ".join(f"{k} {v:.2f}" for k, v in b["phases"].items() if v >= 0.005)
            tables = sorted(b["tables"].items(), key=lambda t: -t[1])[:2]
            slowest = "; ".join(f"{t} {v:.2f}" for t, v in tables)
            print(
                f"{asked:>11} {b['seconds']:6.2f} s, {b['changes']:>7,} changes: {spent}"
                + (f"; slowest tables {slowest}" if slowest else "")
            )


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The pipeline under a steady open-loop load, against pg_recvlogical."
    )
    parser.add_argument(
        "--rates",
        help="changes/s per step, comma-separated; 0 is the idle step "
        "(0,1000,2000,5000,10000,20000,30000; --quick 0,1000,5000)",
    )
    parser.add_argument("--step-seconds", type=float, help="seconds per step (60; --quick 10)")
    parser.add_argument("--big-rows", type=int, help="rows of big (2000000; --quick 10000)")
    parser.add_argument("--history", action="store_true", help="mirror and history targets")
    parser.add_argument("--pgbench", action="store_true", help="pgbench -c 4 mode instead")
    parser.add_argument("--scale", type=int, help="pgbench -i -s (20; --quick 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes, short steps")
    parser.add_argument("--clients", type=int, default=4, help="load connections (4)")
    parser.add_argument("--interval", help="trigger.interval (the pipeline's default)")
    parser.add_argument(
        "--inline-max", type=int, help="trigger.inline_max_changes (the pipeline's default)"
    )
    parser.add_argument(
        "--apply-processes",
        type=int,
        help="trigger.apply_processes (the pipeline's default; 0: threads of the driver)",
    )
    parser.add_argument(
        "--max-changes", type=int, help="trigger.max_changes_per_batch (the pipeline's default)"
    )
    parser.add_argument(
        "--runner",
        choices=("pipeline", "cli"),
        default="pipeline",
        help="Pipeline with on_batch (phases) or `pgcdc run` (pipeline)",
    )
    parser.add_argument("--cores", default="*", help="Spark's local[cores] (*)")
    parser.add_argument("--poll-hz", type=float, default=0, help="also poll the heartbeat mirror")
    parser.add_argument(
        "--exact-rows", type=int, default=200_000, help="row-by-row check up to (200000)"
    )
    parser.add_argument("--sample", type=int, default=20_000, help="rows checked beyond (20000)")
    parser.add_argument("--no-verify", action="store_true", help="skip the checks")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg-version", type=int, default=18)
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.rates is None:
        args.rates = "0,1000,5000" if quick else "0,1000,2000,5000,10000,20000,30000"
    try:
        args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rates: numbers separated by commas (got {args.rates!r})")
    if not args.rate_list or any(r < 0 for r in args.rate_list):
        parser.error("--rates: at least one rate, none negative")
    args.step_seconds = args.step_seconds or (10.0 if quick else 60.0)
    args.big_rows = args.big_rows if args.big_rows is not None else 10_000 if quick else 2_000_000
    args.orders, args.wide = (2_000, 300) if quick else (100_000, 20_000)
    args.scale = args.scale or (2 if quick else 20)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    return args


@contextmanager
def interrupted_cleanly() -> Iterator[None]:
    """SIGTERM as Ctrl-C, so both unwind through the cleanup."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def prepare_source(args: argparse.Namespace, server: EmbeddedServer, db: Database) -> list[str]:
    """Create and fill the tables and the publication; the tables' names."""
    t0 = time.perf_counter()
    db.execute(HEARTBEAT_SCHEMA)
    if args.pgbench:
        subprocess.run(
            [str(server.bindir / "pgbench"), "-i", "-q", "-s", str(args.scale), db.dsn],
            check=True,
            capture_output=True,
        )
        tables = [c.table for c in PGBENCH_TABLES]
        what = f"pgbench -i -s {args.scale}"
    else:
        db.execute(_load.SCHEMA)
        for statement in _load.fill_statements(args.orders, args.wide, args.big_rows):
            db.execute(statement)
        tables = [c.table for c in SUSTAINED_TABLES]
        what = (
            f"{args.orders:,} orders ({3 * args.orders:,} line items), {args.wide:,} wide rows, "
            f"{args.big_rows:,} big rows"
        )
    db.execute("VACUUM ANALYZE")
    db.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(tables)}")
    size = db.execute("SELECT pg_database_size(current_database())")[0][0]
    print(f"source: {what}; {_mb(size)} MB; {time.perf_counter() - t0:.0f} s", flush=True)
    return tables


def run(args: argparse.Namespace, stack: ExitStack, work: Path, results: list[StepResult]) -> None:
    settings: dict[str, str | int | bool | float] = {
        "track_commit_timestamp": True,
        "max_wal_size": "4GB",
    }
    server = stack.enter_context(EmbeddedServer(args.pg_version, settings=settings))
    db = server.create_database("bench")
    stack.callback(db.close)
    print(f"PostgreSQL {server.version_string}; {os.cpu_count()} CPUs; load average {load()}")
    tables = prepare_source(args, server, db)
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (RECV_SLOT,))
    lake_path = work / "lake"
    config_path = work / "pipeline.toml"
    config_path.write_text(pipeline_toml(args, db.dsn, lake_path, tables))
    targets = [
        (t, m, lake_path / f"public.{t}{'' if m == 'mirror' else '__' + m}")
        for t in tables
        for m in (("mirror", "history") if args.history else ("mirror",))
    ]
    heartbeat = Heartbeat(db.dsn)
    stack.callback(heartbeat.close)
    t0 = time.perf_counter()
    pipeline = PipelineProcess(
        config_path, lake_path / "_pgcdc" / NAME, work, args.runner, args.cores
    )
    stack.callback(pipeline.stop)
    print(
        f"the pipeline ({args.runner} runner, pid {pipeline.pid}) copies the tables ...", flush=True
    )
    deadline = time.monotonic() + 600 + args.big_rows / 5_000
    while pipeline.last_commit is None:  # a beat each second: those before the slot are copied
        if time.monotonic() > deadline:
            raise PipelineDied(f"no first batch after {time.perf_counter() - t0:.0f} s")
        heartbeat.beat()
        for _ in range(5):
            pipeline.poll()
            time.sleep(0.2)
    print(
        f"  copied and streaming in {time.perf_counter() - t0:.0f} s (Spark start-up, the copy, "
        "the first batch)",
        flush=True,
    )
    recv = Recvlogical(server, db, RECV_SLOT, PUBLICATION)
    stack.callback(recv.stop)
    checks = PGBENCH_TABLES if args.pgbench else SUSTAINED_TABLES
    driver: Workers | Pgbench
    if args.pgbench:
        driver = Pgbench(server, db, 4)
    else:
        sizes = _load.Sizes(args.orders, args.wide, args.big_rows)
        driver = Workers(db.dsn, args.clients, sizes, args.seed)
    stack.callback(driver.close)
    bench = Bench(args, server, db, pipeline, recv, heartbeat, driver, Lake(targets), checks)
    stack.callback(bench.close)
    if args.poll_hz > 0:
        bench.poller = HeartbeatPoller(lake_path / "public.heartbeat", args.poll_hz)
        stack.callback(bench.poller.close)
    # Both consumers have everything so far before the first step.
    if None in bench.catch_up(bench.mark(), 120):
        raise PipelineDied("a consumer did not catch up before the first step")
    modes = "mirror + history" if args.history else "mirror"
    print(
        f"targets: {len(targets)} ({modes}); pg_recvlogical on slot {RECV_SLOT}; "
        f"{args.step_seconds:g} s per step",
        flush=True,
    )
    steps: list[tuple[str, float | None]]
    if args.pgbench:
        steps = [("pgbench -c 4", None)]
    else:
        steps = [(f"{r:,.0f}/s" if r else "idle", r) for r in args.rate_list]
    for label, rate in steps:
        result = bench.step(label, rate, args.step_seconds)
        print_step(result)
        results.append(result)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-sustained-"))
    results: list[StepResult] = []
    status = 0
    try:
        with interrupted_cleanly(), ExitStack() as stack:
            run(args, stack, work, results)
            print_summary(results)
    except KeyboardInterrupt:
        print("\ninterrupted: servers and processes stopped", file=sys.stderr)
        status = 130
    except (PipelineDied, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"sustained: {exc}", file=sys.stderr)
        status = 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json is not None and results:
        document = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cpus": os.cpu_count(),
            "steps": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(document, indent=2, default=str))
        print(f"results written to {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
