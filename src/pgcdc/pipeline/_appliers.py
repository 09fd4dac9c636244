"""The processes that apply the batches the driver keeps (`ApplierPool`): long-lived, each
table pinned to one of them, which keeps that table's targets open between batches (their
Delta logs read on from where they were, their key indexes and decoded columns kept).

Processes (``[trigger] apply_processes``, 2 by default; 0: threads of the driver), because
the driver's interpreter also runs the replication session, and threads share it: the apply
and the session take turns for the one lock (at 10,000 changes/s with a history, the
pipeline used 0.6 of 2 cores with batches running back to back). Each process starts in a
session of its own (``setsid``), so that Linux's autogroup scheduling gives the processes a
share of their own rather than a part of the driver's: sharing it, they starved the
replication thread whenever the machine was busy. Measured on 2 cores shared with the source
(`benchmarks/sustained.py --apply-processes`), commit to visible under ``pgbench -c 4`` at
full speed, p99: threads 2.5-3.2 s (three runs); processes in the driver's session 4.9-8.9 s
(four runs) while the pipeline's walsender kept up with the WAL (its ``sent_lsn``), so the
delay was the driver's; processes in sessions of their own 1.14 and 2.39 s (p50 0.54 and
0.59 s against about 1.0 s). At 10,000 changes/s with mirrors and histories, after the
first 10 s: p99 1.31 s (threads), 1.06 s (processes in the driver's session) and 1.19 s
(in their own), one run each.

A process applies the tables pinned to it one after the other; a table is pinned on its
first batch, or when it is read ahead before it, to the process with the least apply and
read-ahead time so far, and stays there for the run (its targets, their key indexes and
decoded columns, are open there).

Starting a process costs about a second of CPU (its imports), so a pool outlives the run
that started it: `ApplierPool.lease` gives a run the pool the last run of this process gave
back (`give_back`: its processes forget their targets and decoded columns first), when it has
as many processes and the environment is the same (they got it when they started); otherwise
that pool is closed and a new one started. At most one pool waits so (a pool given back
closes the one waiting), and it is closed when this process exits.

A process runs `serve` (``python -c``, so that it imports only what applying needs) and
answers the driver's commands on a socket, in order:

* ``("apply", [TableWork, ...])`` -> ``("ok", [TableOutcome, ...])``;
* ``("maintain", None)`` -> ``("ok", ran)``: one pass of a target it keeps open that is due;
* ``("forget", None)`` -> ``("ok", None)``: its open targets and decoded columns dropped;
* any error outside a table's own (they are in its outcome) -> ``("error", line)``.

Being in a session of its own, it gets neither the terminal's Ctrl-C nor a signal to the
driver's process group (and ignores SIGINT besides): the driver decides (the first Ctrl-C
finishes the batch in progress). It ends when the driver closes its socket, after the
command in progress, and at once when the driver's process ends however it ends (a pipe only
the driver holds the writing end of reaches its end; a thread waits on it): no process of a
killed driver writes on to its targets.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pgcdc.errors import first_line
from pgcdc.pipeline._dispatch import DispatchError
from pgcdc.pipeline._work import TableOutcome, TableWork

__all__ = ["ApplierPool", "serve"]

log = logging.getLogger(__name__)

#: Seconds `close` waits for a process to finish its command before killing it.
CLOSE_WAIT = 30.0

#: The pool the last run of this process gave back, for the next run (`ApplierPool.lease`):
#: at most one.
_GIVEN_BACK: list[ApplierPool] = []
_GIVEN_BACK_LOCK = threading.Lock()


class _Applier:
    """One process and the driver's end of its socket."""

    def __init__(self, index: int, alive: int) -> None:
        ours, theirs = socket.socketpair()
        code = f"from pgcdc.pipeline._appliers import serve; serve({theirs.fileno()}, {alive})"
        env = dict(os.environ)
        # the same pgcdc as the driver's, whatever its sys.path was made of
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=2,  # (what it prints must not mix with the driver's view)
                pass_fds=(theirs.fileno(), alive),
                env=env,
                start_new_session=True,  # (see the module: a scheduling group of its own)
            )
        except OSError as exc:
            ours.close()
            what = f"cannot start an apply process ({sys.executable}): {exc}"
            raise DispatchError(what) from None
        finally:
            theirs.close()
        self.index = index
        self.connection = Connection(ours.detach())
        #: Seconds its tables took, summed over the batches (for pinning new tables).
        self.seconds = 0.0

    def send(self, command: str, argument: Any) -> None:
        try:
            self.connection.send((command, argument))
        except OSError as exc:
            raise DispatchError(self._ended(exc)) from None

    def receive(self) -> Any:
        try:
            status, value = self.connection.recv()
        except (EOFError, OSError) as exc:
            raise DispatchError(self._ended(exc)) from None
        if status != "ok":
            raise DispatchError(f"apply process {self.index}: {value}")
        return value

    def _ended(self, exc: BaseException) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        code = self.process.returncode
        how = "is gone" if code is None else f"ended (exit status {code})"
        return f"apply process {self.index} (pid {self.process.pid}) {how}: {exc or 'no answer'}"

    def close(self, wait: float) -> None:
        self.connection.close()  # it ends after its command in progress
        try:
            self.process.wait(wait)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ApplierPool:
    """`processes` apply processes, started now; `apply` runs a batch's tables on them.
    Not thread-safe: the driver's loop alone uses it. `close` (or the context) ends them."""

    def __init__(self, processes: int) -> None:
        # The reading end of a pipe whose writing end only this process holds: each applier
        # watches it, and ends when it reaches its end, that is when this process has.
        self._alive_read, self._alive_write = os.pipe()
        self._appliers: list[_Applier] = []
        try:
            for index in range(max(1, processes)):
                self._appliers.append(_Applier(index, self._alive_read))
        except BaseException:
            self.close()
            raise
        finally:
            os.close(self._alive_read)
        #: The environment its processes started with.
        self.environment = dict(os.environ)
        #: The process each table is pinned to.
        self._pinned: dict[str, _Applier] = {}
        #: Seconds and changes applied so far (at first: 20 µs a change).
        self._seconds, self._changes = 20e-6, 1
        #: A command was sent and not every answer read (an interrupted run).
        self._asking = False

    @classmethod
    def lease(cls, processes: int) -> ApplierPool:
        """A pool of `processes` for one run (see the module): one given back by an earlier
        run of this process, or a new one. `give_back` when the run ends."""
        with _GIVEN_BACK_LOCK:
            waiting = list(_GIVEN_BACK)
            _GIVEN_BACK.clear()
        for pool in waiting:
            if pool.processes == max(1, processes) and pool.environment == os.environ:
                return pool
            pool.close(wait=5.0)
        return cls(processes)

    def give_back(self) -> None:
        """The run is done with the pool: its processes forget their targets and decoded
        columns, and wait for the next run of this process. A pool whose run was interrupted
        during a command, or one of whose processes failed, is closed instead."""
        if not self._appliers:
            return
        if self._asking:
            self.close(wait=0.0)
            return
        try:
            self._ask({a: ("forget", None) for a in self._appliers})
        except DispatchError:
            self.close(wait=0.0)
            return
        self._pinned.clear()
        for applier in self._appliers:
            applier.seconds = 0.0
        with _GIVEN_BACK_LOCK:
            waiting = list(_GIVEN_BACK)
            _GIVEN_BACK[:] = [self]
        for pool in waiting:
            pool.close(wait=5.0)

    @property
    def processes(self) -> int:
        return len(self._appliers)

    def pin(self, table: str, changes: int = 0) -> int:
        """The process that applies `table`, pinned now if new: to the one with the least
        apply time so far (then the fewest tables), which is charged at once the time
        `changes` take at the mean rate seen so far, so that the tables new in one batch
        spread over the processes."""
        applier = self._pinned.get(table)
        if applier is None:
            tables = {a.index: 0 for a in self._appliers}
            for pinned in self._pinned.values():
                tables[pinned.index] += 1
            applier = min(self._appliers, key=lambda a: (a.seconds, tables[a.index], a.index))
            self._pinned[table] = applier
            applier.seconds += changes * self._seconds / max(self._changes, 1)
        return applier.index

    def apply(self, works: Sequence[TableWork]) -> list[TableOutcome]:
        """Each work applied by the process its table is pinned to (the largest first:
        pinning follows the apply time, which a new table has none of yet), the processes in
        parallel; the outcomes in the works' order. Raises `DispatchError` when a process
        fails outside its tables' own errors, or ends."""
        ordered = sorted(works, key=lambda w: -w.changes)
        per: dict[int, list[TableWork]] = {}
        for work in ordered:
            per.setdefault(self.pin(work.table, work.changes), []).append(work)
        answers = self._ask({self._appliers[i]: ("apply", w) for i, w in per.items()})
        outcomes: dict[str, TableOutcome] = {}
        for applier, got in answers.items():
            for outcome in got:
                applier.seconds += outcome.seconds
                self._seconds += outcome.seconds
                self._changes += outcome.changes
                outcomes[outcome.table] = outcome
        return [outcomes[work.table] for work in works]

    def maintain(self) -> bool:
        """One maintenance pass in each process that keeps a target due for one, the
        processes in parallel; whether one ran."""
        return any(self._ask({a: ("maintain", None) for a in self._appliers}).values())

    def warm(self, works: Sequence[TableWork]) -> None:
        """Each work's targets read ahead (`warm_tables`) by the process its table is
        pinned to, the processes in parallel. A process is charged the seconds it took: a
        table with no changes seen yet weighs what reading it ahead did (its size, about),
        so that the tables read ahead one after the other spread over the processes."""
        per: dict[int, list[TableWork]] = {}
        for work in works:
            per.setdefault(self.pin(work.table), []).append(work)
        answers = self._ask({self._appliers[i]: ("warm", w) for i, w in per.items()})
        for applier, seconds in answers.items():
            applier.seconds += seconds

    def _ask(self, commands: dict[_Applier, tuple[str, Any]]) -> dict[_Applier, Any]:
        """Each applier's answer to its command, the processes working in parallel. Every
        answer is read before a failure is raised, so that no answer is left for the next
        command to read."""
        failure: DispatchError | None = None
        asked = []
        self._asking = True
        for applier, (command, argument) in commands.items():
            try:
                applier.send(command, argument)
                asked.append(applier)
            except DispatchError as exc:
                failure = failure or exc
        answers = {}
        for applier in asked:
            try:
                answers[applier] = applier.receive()
            except DispatchError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        self._asking = False
        return answers

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Each process finishes its command in progress and ends (killed after `wait` s)."""
        with _GIVEN_BACK_LOCK:
            if self in _GIVEN_BACK:
                _GIVEN_BACK.remove(self)
        appliers, self._appliers = self._appliers, []
        try:
            for applier in appliers:
                applier.close(wait)
        finally:
            if self._alive_write >= 0:
                os.close(self._alive_write)
                self._alive_write = -1

    def __enter__(self) -> ApplierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _close_given_back() -> None:
    with _GIVEN_BACK_LOCK:
        pools = list(_GIVEN_BACK)
        _GIVEN_BACK.clear()
    for pool in pools:
        pool.close(wait=5.0)


# --------------------------------------------------------------------------- the process


def serve(fd: int, alive: int) -> None:
    """An apply process's loop: the driver's commands from the socket `fd`, until it closes
    it; ends at once when the pipe `alive` reaches its end (the driver's process ended)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with_driver, args=(alive,), daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format="pgcdc apply process: %(message)s")
    from pgcdc.pipeline._work import apply_tables, forget_open_targets, maintain_open, warm_tables
    from pgcdc.targets import decoded_columns

    connection = Connection(fd)
    while True:
        try:
            command, argument = connection.recv()
        except EOFError:
            return
        try:
            if command == "apply":
                answer: tuple[str, Any] = ("ok", apply_tables(argument))
            elif command == "maintain":
                answer = ("ok", maintain_open())
            elif command == "warm":
                answer = ("ok", warm_tables(argument))
            elif command == "forget":
                forget_open_targets()
                decoded_columns().budget = 0  # (the next apply sets it again)
                answer = ("ok", None)
            else:
                answer = ("error", f"unknown command {command!r}")
        except Exception as exc:
            line = first_line(exc)
            log.debug("%s", line, exc_info=True)
            answer = ("error", f"{type(exc).__name__}: {line}")
        connection.send(answer)


def _end_with_driver(alive: int) -> None:
    while os.read(alive, 1):
        pass
    os._exit(0)
