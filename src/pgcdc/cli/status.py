"""`pgcdc status`: a list of sections, each a small table for people (with its warnings in
yellow, or red when the slot is lost or about to be) and an entry of one JSON object.

`status_sections` gives the slot's sections (slot, WAL, failover) and, with a batch log, the
pipeline's batches; a pipeline adds its own (targets, initial copy, quarantined tables) and
hands the list to `print_sections`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pgcdc.monitoring import (
    BATCH_LOG,
    BatchLog,
    BatchRecord,
    SlotStatus,
    current_lag,
    failover_warnings,
    format_bytes,
    format_seconds,
    plot_batches,
    read_lag,
    slot_status,
    throughput,
    wal_warnings,
)
from pgcdc.protocol import Lsn
from pgcdc.storage import FileIO, open_file_io

__all__ = [
    "Section",
    "batch_section",
    "pipeline_sections",
    "plot_section",
    "print_sections",
    "slot_sections",
    "status_sections",
]


@dataclass(slots=True)
class Section:
    """One block of the status. `rows` are (label, value) for people; `key` and `data` its
    entry in the JSON object (a section without a key shows facts another one holds)."""

    title: str
    rows: list[tuple[str, str]]
    key: str | None = None
    data: Any = None
    warnings: list[str] = field(default_factory=list)
    #: The warnings say something is lost or will be soon (red rather than yellow).
    critical: bool = False


def status_sections(
    conninfo: str,
    slot: str,
    *,
    standby: str | None = None,
    max_retained_bytes: int | None = None,
    batch_log: Path | None = None,
    plot: Path | None = None,
) -> list[Section]:
    """Everything `pgcdc status -d CONNINFO -S SLOT` shows."""
    status = slot_status(conninfo, slot, standby=standby)
    sections = slot_sections(status, max_retained_bytes)
    if batch_log is not None:
        records = BatchLog.at(batch_log).read()
        sections.append(batch_section(records, status.server_time))
        if plot is not None:
            sections.append(plot_section(records, plot, title=f"pgcdc slot {slot}"))
    return sections


def plot_section(records: list[BatchRecord], plot: Path, *, title: str) -> Section:
    """Draw `records` into `plot`; the section says what was drawn."""
    drawn = plot_batches(records, plot, title=title)
    points = ", ".join(f"{name} ({count})" for name, count in drawn.items())
    return Section(
        "Plot",
        [("file", str(plot)), ("series (points)", points)],
        key="plot",
        data={"path": str(plot), "series": drawn},
    )


def _ago(then: datetime, now: datetime) -> str:
    return f"{then:%Y-%m-%d %H:%M:%S %Z} ({format_seconds((now - then).total_seconds())} ago)"


def _yes(value: bool | None) -> str:
    return "" if value is None else "yes" if value else "no"


def slot_sections(status: SlotStatus, max_retained_bytes: int | None = None) -> list[Section]:
    """The slot, its WAL (with `wal_warnings`) and, for a failover slot, its standby copy."""
    slot = status.slot
    now = status.server_time
    if slot.active:
        state = f"active (pid {slot.active_pid})"
    elif slot.inactive_since is not None:
        state = f"inactive since {_ago(slot.inactive_since, now)}"
    else:
        state = "inactive"
    rows = [
        ("slot", f"{slot.slot_name} ({slot.slot_type}, plugin {slot.plugin or '-'})"),
        ("database", slot.database or ""),
        ("state", state),
        ("restart_lsn", str(slot.restart_lsn or "")),
        ("confirmed_flush_lsn", str(slot.confirmed_flush_lsn or "")),
        ("two_phase", _yes(slot.two_phase)),
    ]
    if slot.invalidated:
        rows.append(("invalidated", slot.invalidation_reason or f"wal_status {slot.wal_status}"))
    sections = [Section("Slot", rows, key="slot", data=status.to_json())]

    keep = status.max_slot_wal_keep_size
    limit = f" (warn over {format_bytes(max_retained_bytes)})" if max_retained_bytes else ""
    wal_rows = [
        ("server WAL position", f"{status.server_lsn} at {now:%Y-%m-%d %H:%M:%S %Z}"),
        ("lag", f"{format_bytes(status.lag_bytes)} behind the server"),
        ("retained WAL", format_bytes(slot.retained_bytes) + limit),
        ("wal_status", slot.wal_status or ""),
        ("safe_wal_size", format_bytes(slot.safe_wal_size) or "unlimited"),
        ("max_slot_wal_keep_size", format_bytes(keep) if keep is not None else "unlimited"),
    ]
    if status.server_version >= 180000:
        timeout = status.idle_timeout
        left = status.idle_timeout_in
        idle = "off" if timeout is None else format_seconds(timeout)
        if left is not None:
            idle += f"; invalidates this inactive slot in {format_seconds(max(left, 0))}"
        wal_rows.append(("idle_replication_slot_timeout", idle))
    warnings = wal_warnings(status, max_retained_bytes)
    sections.append(
        Section(
            "WAL",
            wal_rows,
            key="wal_warnings",
            data=warnings,
            warnings=warnings,
            critical=status.critical,
        )
    )

    standby = status.standby
    if slot.failover or standby is not None:
        failover_rows = [
            ("failover", _yes(slot.failover)),
            ("synchronized_standby_slots", ", ".join(status.synchronized_standby_slots)),
        ]
        if standby is not None and not standby.present:
            failover_rows.append(("on the standby", "no copy"))
        elif standby is not None:
            ready = "sync-ready" if standby.sync_ready else "temporary: not usable after failover"
            failover_rows.append(
                (
                    "on the standby",
                    f"{'synced' if standby.synced else 'not synced'}, {ready}, "
                    f"confirmed_flush_lsn {standby.confirmed_flush_lsn or '-'} "
                    f"({format_bytes(standby.behind_bytes)} behind)",
                )
            )
        warned = failover_warnings(status)
        sections.append(
            Section(
                "Failover", failover_rows, key="failover_warnings", data=warned, warnings=warned
            )
        )
    return sections


def batch_section(records: list[BatchRecord], now: datetime, lag: float | None = None) -> Section:
    """The pipeline's batches: how many, the last one, lag (`lag`: seconds behind now,
    `pgcdc.monitoring.lag.current_lag`) and throughput."""
    if not records:
        return Section("Batches", [("batches", "none recorded")], key="batches", data={})
    last = records[-1]
    rates = [rate for _, rate in throughput(records)]
    span = (last.time - records[0].time).total_seconds()
    changes = sum(r.changes for r in records)
    average = changes / span if span > 0 else None
    peak = max(rates, default=None)
    data = {
        "count": len(records),
        "first": records[0].time.isoformat(),
        "last": last.to_json(),
        "changes": changes,
        "changes_per_second": average,
        "peak_changes_per_second": peak,
        "lag_seconds": lag,
    }
    lag_seconds = "" if last.lag_seconds is None else f", {last.lag_seconds:.1f} s"
    rows = [
        ("batches", f"{len(records)} since {_ago(records[0].time, now)}"),
        ("last batch", f"#{last.batch} at {_ago(last.time, now)}"),
        (
            "last batch size",
            f"{last.changes} changes, {format_bytes(last.bytes)}, {last.seconds:.2f} s",
        ),
        ("lag after it", f"{format_bytes(last.lag_bytes) or '-'}{lag_seconds}"),
        ("lag now", "-" if lag is None else ("caught up" if lag == 0 else format_seconds(lag))),
        (
            "changes",
            f"{changes} ({average or 0:.0f}/s on average, peak {peak or 0:.0f}/s)",
        ),
    ]
    for target, applied in sorted(last.targets.items()):
        rows.append((f"  {target}", f"{applied['rows']} rows in {applied['seconds']:.2f} s"))
    return Section("Batches", rows, key="batches", data=data)


def print_sections(sections: list[Section], *, as_json: bool) -> None:
    """The sections on stdout: one JSON object, or a table each with its warnings."""
    if as_json:
        print(json.dumps({s.key: s.data for s in sections if s.key is not None}))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120)
    for section in sections:
        table = Table(title=section.title, title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for label, value in section.rows:
            table.add_row(label, value)
        console.print(table)
        style = "bold red" if section.critical else "yellow"
        for warning in section.warnings:
            console.print(
                f"warning: {warning}", style=style, markup=False, highlight=False, soft_wrap=True
            )


def pipeline_sections(path: Path, *, plot: Path | None = None) -> list[Section]:
    """Everything `pgcdc status PIPELINE.toml` shows: the slot's sections (with the
    pipeline's WAL limit), its batches (and a plot of them), every target's watermark, last
    commit and rows, the initial copy's progress and any table quarantined."""
    from pgcdc.pipeline import Quarantine
    from pgcdc.pipeline.config import load_config

    config = load_config(path)
    state = open_file_io(config.state_path, config.storage_options)
    state.check()
    status = slot_status(config.conninfo, config.slot)
    sections = slot_sections(status, config.max_retained_wal)
    records = BatchLog(state.child(BATCH_LOG)).read()
    lag = current_lag(
        read_lag(state),
        status.server_time,
        records[-1].last_commit_time if records else None,
        status.lag_bytes,
    )
    sections.append(batch_section(records, status.server_time, lag))
    if plot is not None:
        sections.append(plot_section(records, plot, title=f"pgcdc pipeline {config.name}"))
    sections.append(_target_section(config, status.server_time))
    copy = _copy_section(state, config)
    if copy is not None:
        sections.append(copy)
    stopped = Quarantine(state).records()
    if stopped:
        listed = sorted(stopped.items())
        sections.append(
            Section(
                "Stopped tables",
                [(t, f"{r.status} since {r.since}: {r.reason}") for t, r in listed],
                key="stopped_tables",
                data={t: asdict(r) for t, r in listed},
                warnings=[f"{t} is {r.status}: {r.reason}" for t, r in listed],
            )
        )
    return sections


def _target_section(config: Any, now: datetime) -> Section:
    """Each target's watermark, rows and last commit (from the table's metadata)."""
    from pgcdc.targets import open_target

    rows: list[tuple[str, str]] = []
    data: dict[str, dict[str, object]] = {}
    for spec in config.targets():
        name = f"{spec.table} {spec.mode}"
        found = open_target(spec.spec, app_id=config.app_id).state()
        if not found.exists:
            rows.append((name, "not created yet"))
            data[name] = {"exists": False}
            continue
        watermark = "-" if found.watermark is None else str(Lsn(found.watermark))
        at = found.last_commit_at
        last = "-" if at is None else _ago(at, now)
        rows.append((name, f"watermark {watermark}, {found.rows:,} rows, last commit {last}"))
        data[name] = {
            "exists": True,
            "path": spec.path,
            "watermark": watermark,
            "rows": found.rows,
            "version": found.version,
            "last_commit_at": None if at is None else at.isoformat(),
        }
    return Section("Targets", rows, key="targets", data=data)


def _copy_section(state_io: FileIO, config: Any) -> Section | None:
    """The initial copy: its status, point and, per table, the chunks its targets hold of
    the ones planned (and their rows)."""
    from pgcdc.pipeline import InitialCopy
    from pgcdc.targets import open_target

    state = InitialCopy.read_state(state_io)
    if state is None:
        return None
    point = state.get("point")
    planned = {t: len(c) for t, c in state.get("chunks", {}).items()}
    copied: dict[str, dict[str, int]] = {}
    for spec in config.targets():
        if spec.table in planned and spec.table not in copied and spec.mode != "changelog":
            target = open_target(spec.spec, app_id=config.app_id)
            copied[spec.table] = target.copied_chunks(int(Lsn.parse(point))) if point else {}
    rows = [("status", str(state.get("status"))), ("point", str(point or "-"))]
    data: dict[str, Any] = {"status": state.get("status"), "point": point, "tables": {}}
    for table, count in sorted(planned.items()):
        done = copied.get(table, {})
        rows.append((f"  {table}", f"{len(done)} of {count} chunks, {sum(done.values()):,} rows"))
        data["tables"][table] = {
            "chunks_planned": count,
            "chunks_copied": len(done),
            "rows_copied": sum(done.values()),
        }
    warnings = [] if state.get("status") == "done" else ["the initial copy has not finished"]
    return Section("Initial copy", rows, key="initial_copy", data=data, warnings=warnings)
