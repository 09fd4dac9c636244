"""The lag an operator sees (`pgcdc.monitoring.lag`): always the server's clock minus the
last commit applied, whether the pipeline runs, caught up, or stopped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgcdc.monitoring.lag import FRESH, LagReport, current_lag, read_lag, write_lag
from pgcdc.storage import open_file_io

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
APPLIED = NOW - timedelta(seconds=95)


def test_a_running_pipeline_says_its_own_lag() -> None:
    fresh = LagReport(NOW - timedelta(seconds=3), 1.5, 4096)
    assert current_lag(fresh, NOW, APPLIED, 4096) == 1.5
    caught_up = LagReport(NOW - timedelta(seconds=1), 0.0, 0)
    assert current_lag(caught_up, NOW, APPLIED, 0) == 0.0  # not the last backlog's lag


def test_a_stopped_pipeline_falls_behind_as_the_clock_moves() -> None:
    """A stopped pipeline's report goes stale: the lag is the time since the last commit
    applied, growing while WAL waits behind the slot; 0 when none waits."""
    stale = LagReport(NOW - FRESH - timedelta(seconds=1), 0.18, 0)
    assert current_lag(stale, NOW, APPLIED, 14 << 20) == 95.0
    later = NOW + timedelta(minutes=10)
    assert current_lag(stale, later, APPLIED, 14 << 20) == 695.0
    assert current_lag(stale, later, APPLIED, 0) == 0.0
    assert current_lag(None, NOW, None, 100) is None  # nothing was ever applied


def test_the_report_round_trips_and_a_damaged_one_is_none(tmp_path: Path) -> None:
    state = open_file_io(str(tmp_path / "state"))
    report = LagReport(NOW, 2.25, None)
    write_lag(state, report)
    assert read_lag(state) == report
    (tmp_path / "state" / "lag.json").write_text("{not json")
    assert read_lag(state) is None
    assert read_lag(open_file_io(str(tmp_path / "absent"))) is None
