"""The plot of the batch log: a real PNG with the series the records hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pgcdc.errors import MonitoringError
from pgcdc.monitoring import plot_batches, throughput

from .helpers import TARGETS, batch_records, png_size


def test_plot_draws_lag_throughput_and_apply_seconds(tmp_path: Path) -> None:
    records = batch_records(30)
    path = tmp_path / "status.png"
    drawn = plot_batches(records, path)
    assert drawn == {
        "lag bytes": 30,
        "lag seconds": 30,
        "changes/s": 30,
        "batch seconds": 30,
        f"apply seconds {TARGETS[1]}": 15,  # history only in even batches
        f"apply seconds {TARGETS[0]}": 30,
    }
    assert png_size(path) == (1000, 800)
    assert path.stat().st_size > 20_000, "a plot with lines, not an empty canvas"


def test_points_without_a_value_are_left_out(tmp_path: Path) -> None:
    records = batch_records(4)
    records[1] = dataclasses.replace(records[1], lag_bytes=None, lag_seconds=None)
    drawn = plot_batches(records, tmp_path / "p.png")
    assert (drawn["lag bytes"], drawn["lag seconds"], drawn["changes/s"]) == (3, 3, 4)


def test_throughput_is_changes_over_wall_time() -> None:
    records = batch_records(3, every=2.0)
    rates = [rate for _, rate in throughput(records)]
    # the first batch over its own 0.3 s, then 200 and 300 changes over 2 s each
    assert rates == pytest.approx([100 / 0.3, 100.0, 150.0])


def test_nothing_to_plot_and_unwritable_file(tmp_path: Path) -> None:
    with pytest.raises(MonitoringError, match="nothing to plot"):
        plot_batches([], tmp_path / "p.png")
    with pytest.raises(MonitoringError, match="cannot write the plot"):
        plot_batches(batch_records(2), tmp_path / "missing" / "p.png")
