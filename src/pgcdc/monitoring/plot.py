"""Lag and throughput over time, drawn from the batch log into a PNG (matplotlib, no screen)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgcdc.errors import MonitoringError
from pgcdc.monitoring.batch_log import BatchRecord

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_batches", "throughput"]

Series = list[tuple[datetime, float]]


def throughput(records: Sequence[BatchRecord]) -> Series:
    """Changes per second of wall time at each batch: its changes over the time since the
    batch before it finished (the first batch: over its own duration)."""
    points = []
    previous: datetime | None = None
    for record in records:
        span = record.seconds if previous is None else (record.time - previous).total_seconds()
        if span > 0:
            points.append((record.time, record.changes / span))
        previous = record.time
    return points


def _series(records: Sequence[BatchRecord]) -> dict[str, Series]:
    """Every series the plot draws, by name; points without a value are left out."""
    series: dict[str, Series] = {
        "lag bytes": [(r.time, float(r.lag_bytes)) for r in records if r.lag_bytes is not None],
        "lag seconds": [(r.time, r.lag_seconds) for r in records if r.lag_seconds is not None],
        "changes/s": throughput(records),
        "batch seconds": [(r.time, r.seconds) for r in records],
    }
    for name in sorted({name for r in records for name in r.targets}):
        series[f"apply seconds {name}"] = [
            (r.time, float(r.targets[name]["seconds"])) for r in records if name in r.targets
        ]
    return series


def plot_batches(
    records: Sequence[BatchRecord], path: str | os.PathLike[str], *, title: str = "pgcdc"
) -> dict[str, int]:
    """Draw lag (bytes and seconds), throughput (changes/s) and the seconds per batch (the
    whole batch and each target's apply) against time into the PNG `path`.

    Returns what was drawn: series name -> number of points."""
    if not records:
        raise MonitoringError("no batches recorded yet: nothing to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")  # a file, never a window
        from matplotlib import dates
        from matplotlib.figure import Figure
    except ImportError:
        raise MonitoringError(
            "plotting needs matplotlib: pip install 'pgcdc[spark]' (or matplotlib)"
        ) from None

    series = _series(records)
    figure = Figure(figsize=(10, 8), layout="constrained")
    lag_axes, rate_axes, time_axes = figure.subplots(3, 1, sharex=True)
    figure.suptitle(
        f"{title}: {len(records)} batches, {records[0].time:%Y-%m-%d %H:%M:%S} to "
        f"{records[-1].time:%H:%M:%S} UTC"
    )

    def draw(axes: Axes, name: str, **style: Any) -> None:
        points = series[name]
        times = dates.date2num([t for t, _ in points])
        axes.plot(times, [v for _, v in points], label=name, **style)

    draw(lag_axes, "lag bytes", color="tab:blue")
    lag_axes.set_ylabel("lag (bytes)", color="tab:blue")
    seconds_axes = lag_axes.twinx()
    draw(seconds_axes, "lag seconds", color="tab:red", linestyle="--")
    seconds_axes.set_ylabel("lag (s)", color="tab:red")
    lag_axes.legend(
        handles=[*lag_axes.get_lines(), *seconds_axes.get_lines()],
        loc="upper left",
        fontsize="small",
    )

    draw(rate_axes, "changes/s", color="tab:green")
    rate_axes.set_ylabel("changes/s")

    draw(time_axes, "batch seconds", color="black", linewidth=1.5)
    for name in series:
        if name.startswith("apply seconds "):
            draw(time_axes, name, linewidth=1)
    time_axes.set_ylabel("seconds per batch")
    time_axes.legend(loc="upper left", fontsize="small")
    time_axes.xaxis.set_major_formatter(dates.DateFormatter("%H:%M:%S"))
    for axes in (lag_axes, rate_axes, time_axes):
        axes.grid(True, alpha=0.3)
    try:
        figure.savefig(os.fspath(path), format="png", dpi=100)
    except OSError as exc:
        raise MonitoringError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return {name: len(points) for name, points in series.items()}
