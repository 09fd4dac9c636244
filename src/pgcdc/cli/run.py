"""`pgcdc run PIPELINE.toml`: the pipeline with a live progress view.

The view shows changes per second, the lag (bytes of WAL behind the server, seconds since the
last applied commit when changes are pending) and per-target row counts. The first Ctrl-C
finishes the batch in progress and stops cleanly; a second one ends the process at once
(exit status 130, one line).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pgcdc.errors import SlotNotFound
from pgcdc.pipeline import Pipeline, PipelineStats, TableProgress
from pgcdc.pipeline.config import load_config
from pgcdc.protocol import Lsn
from pgcdc.replication.preflight import resume_line
from pgcdc.replication.slots import connect_sql, get_slot

__all__ = ["run_pipeline"]

EXIT_INTERRUPTED = 130


class _Lag:
    """The server's WAL position, sampled at most once a second."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.conn: Any = None
        self.sampled = 0.0
        self.position: Lsn | None = None

    def server_lsn(self) -> Lsn | None:
        if time.monotonic() - self.sampled >= 1.0:
            self.sampled = time.monotonic()
            try:
                if self.conn is None:
                    self.conn = connect_sql(self.conninfo)
                row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                self.position = Lsn.parse(row[0])
            except Exception:  # the view must not stop the pipeline
                self.conn = None
        return self.position

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _view(pipeline: Pipeline, lag: _Lag, rates: list[tuple[float, int]], stopping: bool) -> Table:
    stats: PipelineStats = pipeline.stats
    now = time.monotonic()
    rates.append((now, stats.changes))
    while len(rates) > 2 and now - rates[0][0] > 10:
        rates.pop(0)
    (t0, c0), (t1, c1) = rates[0], rates[-1]
    rate = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
    table = Table(title=f"pgcdc run {pipeline.config.name}", title_justify="left", expand=False)
    table.add_column("target")
    table.add_column("rows applied", justify="right")
    for name in sorted({n for n in stats.per_table} | _target_names(pipeline)):
        table.add_row(name, f"{stats.per_table.get(name, 0):,}")
    server = lag.server_lsn()
    behind = "?"
    if server is not None and stats.last_commit_lsn is not None:
        behind = f"{max(0, server - stats.last_commit_lsn):,} B"
    seconds = "-"
    if stats.last_commit_time is not None:
        from datetime import UTC, datetime

        seconds = f"{(datetime.now(UTC) - stats.last_commit_time).total_seconds():.1f} s"
    if pipeline.copy_progress:
        table.add_section()
        for name, copy in sorted(pipeline.copy_progress.items()):
            table.add_row(f"{name} copy", _copy_text(copy))
    records = pipeline.quarantine.records()
    if records:
        table.add_section()
        for name, record in sorted(records.items()):
            table.add_row(f"[red]{name} {record.status}[/]", record.reason)
    if pipeline.wal_warning:
        table.add_section()
        table.add_row("[yellow]WAL[/]", f"[yellow]{pipeline.wal_warning}[/]")
    state = "finishing the current batch, then stopping" if stopping else "running"
    table.caption = (
        f"{state} · {stats.batches} batches · {stats.changes:,} changes · {rate:,.0f} changes/s"
        f" · lag {behind}, last commit {seconds} ago · Ctrl-C to stop"
    )
    table.caption_justify = "left"
    return table


def _copy_text(copy: TableProgress) -> str:
    if copy.error is not None:
        return f"[red]failed: {copy.error}[/]"
    if copy.chunks_done >= copy.chunks:
        return f"{copy.rows_done:,} rows, done"
    left = copy.seconds_left
    eta = "?" if left is None else f"{left:,.0f} s left"
    return (
        f"{copy.rows_done:,} rows, {copy.chunks_done}/{copy.chunks} chunks, "
        f"{copy.rows_per_second:,.0f} rows/s, {eta}"
    )


def _target_names(pipeline: Pipeline) -> set[str]:
    return {f"{table} {spec.mode}" for table, ts in pipeline.targets.items() for spec, _ in ts}


def _exit_at_once(console: Console) -> None:
    """End the process now, as a kill would (nothing is confirmed that is not durable), with
    one line: unwinding through a Spark call in progress would print py4j's tracebacks."""
    console.show_cursor(True)
    sys.stderr.write("\npgcdc: interrupted\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def _resume_text(pipeline: Pipeline) -> str:
    """Where this run starts (`resume_line`): the slot's confirmed position, and per table
    the lowest watermark of its targets."""
    config = pipeline.config
    try:
        confirmed = get_slot(config.conninfo, config.slot).confirmed_flush_lsn
    except SlotNotFound:
        confirmed = None
    watermarks: dict[str, Lsn | None] = {}
    for table, targets in pipeline.targets.items():
        marks = [target.watermark for _, target in targets]
        watermarks[table] = None if None in marks else Lsn(min(m for m in marks if m is not None))
    # A table without a watermark is copied on a new slot, or beside tables that have one
    # (added since); otherwise the slot holds all of its changes.
    copies = config.snapshot and (confirmed is None or any(watermarks.values()))
    unapplied = "copy pending" if copies else "from the slot's position"
    return resume_line(config.slot, confirmed, watermarks, unapplied=unapplied)


def run_pipeline(path: str, *, console: Console | None = None) -> PipelineStats:
    config = load_config(path)
    console = console or Console(stderr=True)
    console.print(f"[cyan]Starting the pipeline {config.name!r} ...[/]")
    live_view: list[Any] = []

    def on_copy(progress: dict[str, TableProgress]) -> None:
        if live_view:
            live_view[0]()

    pipeline = Pipeline(config, on_copy=on_copy)
    pipeline.prepare()  # before the SIGINT handler: Spark installs one of its own
    console.print(_resume_text(pipeline), highlight=False, soft_wrap=True)
    lag = _Lag(config.conninfo)
    rates: list[tuple[float, int]] = []
    interrupts = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            _exit_at_once(console)
        pipeline.stop()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        with Live(console=console, refresh_per_second=2, transient=False) as live:

            def tick() -> None:
                live.update(_view(pipeline, lag, rates, interrupts > 0))

            live_view.append(tick)

            try:
                stats = pipeline.run(tick=tick)
            finally:
                tick()
    except BaseException:
        console.print()  # the error line goes below the view, not after its last line
        raise
    finally:
        # From here on (Spark's shutdown included) Ctrl-C ends the process at once.
        signal.signal(signal.SIGINT, lambda _signum, _frame: _exit_at_once(console))
        lag.close()
    console.print(
        f"[green]Stopped cleanly[/] after {stats.batches} batches, {stats.changes:,} changes."
    )
    return stats
