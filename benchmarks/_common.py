"""Helpers the benchmarks share (pipeline.py, sustained.py, stream.py, session.py).

Measuring CPU from ``/proc`` (a walsender's once it exited: the postmaster's reaped
children), pg_recvlogical read through a pipe (the arrival time of each Commit),
percentiles, the load average.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pgcdc.embedded import Database, EmbeddedServer

CLK_TCK = os.sysconf("SC_CLK_TCK")
QUIET = {"spark.ui.showConsoleProgress": "false"}  # no progress bars between our lines


def load() -> str:
    """The 1-minute load average: other work on the machine skews wall times (not CPU)."""
    return f"{os.getloadavg()[0]:.2f}"


# --------------------------------------------------------------------------- measuring CPU


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 on), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_cpu(pid: int) -> float | None:
    """User + system seconds of one live process; None when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(root: int, exclude: tuple[int | None, ...] = ()) -> float:
    """User + system seconds of `root` and every live descendant, each with its reaped
    children, except the subtrees of `exclude`: the JVM, the data source process and Python
    workers under this process, without the PostgreSQL server (also our child)."""
    return sum(_tree(root, exclude).values())


def _tree(
    root: int, exclude: tuple[int | None, ...] = (), *, reaped: bool = True
) -> dict[tuple[int, int], float]:
    """`tree_cpu` per process, by (pid, start time); without `reaped`, each process's own."""
    stats: dict[int, tuple[int, int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        ticks = sum(int(f) for f in fields[11 : 15 if reaped else 13])  # utime, stime, cu, cs
        stats[int(entry.name)] = (int(fields[1]), int(fields[19]), ticks / CLK_TCK)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        if pid in stats:
            found[(pid, stats[pid][1])] = stats[pid][2]
        todo.extend(children.get(pid, ()))
    return found


class TreeCpu:
    """`tree_cpu` as a running total, polled every `interval` seconds by a thread of its own:
    a process that exits between two readings keeps the CPU it used until its last poll. (Two
    plain sums of the tree lose it, and take back what it had used before: Spark's idle
    Python workers exit about a minute after their last task, and the initial copy's took
    3 CPU s out of a step's figure.) Each process's own CPU, not its reaped children's: a
    child the tree reaps was counted while it ran."""

    def __init__(self, root: int, interval: float = 0.5) -> None:
        self.root = root
        self._last: dict[tuple[int, int], float] = {}
        self._gone = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.poll()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="tree-cpu", daemon=True
        )
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.poll()

    def poll(self) -> float:
        """The tree's CPU seconds so far: every process seen, up to its last poll."""
        now = _tree(self.root, reaped=False)
        with self._lock:
            self._gone += sum(v for k, v in self._last.items() if k not in now)
            self._last = now
            return self._gone + sum(now.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- walsenders


def reaped_children_cpu(postmaster_pid: int) -> tuple[float, float]:
    """(user, system) seconds of the postmaster's exited-and-reaped children."""
    stat = Path(f"/proc/{postmaster_pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); cutime and cstime are fields 16 and 17
    return int(fields[13]) / CLK_TCK, int(fields[14]) / CLK_TCK


def wait_walsender_gone(db: Database, slot: str, postmaster_pid: int) -> tuple[float, float]:
    """Wait until the slot is released and its walsender reaped; the reaped-children CPU."""
    deadline = time.monotonic() + 30
    query = "SELECT active FROM pg_replication_slots WHERE slot_name = %s"
    while db.execute(query, (slot,))[0][0]:
        if time.monotonic() > deadline:
            sys.exit(f"slot {slot} still active 30 s after its consumer finished")
        time.sleep(0.02)
    time.sleep(0.2)  # the postmaster reaps on SIGCHLD
    return reaped_children_cpu(postmaster_pid)


# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return float("nan")
    rank = max(1, -(-len(values) * p // 100))
    return values[int(rank) - 1]


# --------------------------------------------------------------------------- pg_recvlogical


class Recvlogical:
    """pg_recvlogical on a pgoutput slot (proto 1), its output read through a pipe: the wall
    time each Commit message arrives, by its commit timestamp (µs since 2000-01-01).

    pg_recvlogical writes each message's bytes and a newline; a Commit is ``C``, flags 0,
    commit LSN, end LSN and the timestamp (8 bytes each). Binary row data could in theory
    look like one, but only timestamps of the driver's commits are ever looked up."""

    COMMIT = re.compile(rb"\nC\x00[\s\S]{16}([\s\S]{8})(?=\n)")

    def __init__(self, server: EmbeddedServer, db: Database, slot: str, publication: str) -> None:
        cmd = [str(server.bindir / "pg_recvlogical"), "-d", db.dsn, "--slot", slot, "--start"]
        cmd += ["-f", "-", "-o", "proto_version=1", "-o", f"publication_names={publication}"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.seen: dict[int, float] = {}
        self.commits = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        tail = b"\n"
        while chunk := os.read(fd, 1 << 16):
            now = time.time()
            data = tail + chunk
            for match in self.COMMIT.finditer(data):
                self.seen.setdefault(int.from_bytes(match.group(1), "big", signed=True), now)
                self.commits.set()
            tail = data[-28:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # pg_recvlogical's clean exit
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(5)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc.stderr.close()
        if self.proc.returncode not in (0, -signal.SIGINT) and err:
            print(f"  pg_recvlogical exited {self.proc.returncode}: {err}")
