"""`pgcdc status -d CONNINFO -S SLOT` on real slots: one being streamed, one retaining WAL past
`--max-retained-wal`, one invalidated; `--json`; `--batches` with `--plot`; and every bad input
as one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pgcdc.embedded import Database
from pgcdc.monitoring import BatchLog
from replication.helpers import (
    assert_one_error_line,
    run_cli,
    wait_for,
)

from .helpers import TARGETS, batch_records, create_slot, make_wal, png_size, streamed_slot


def status(*args: str) -> str:
    result = run_cli("status", *args)
    assert result.returncode == 0 and not result.stderr, result.stderr
    return result.stdout


def status_json(*args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(status(*args, "--json"))
    return data


def test_streamed_slot(pg: Database) -> None:
    with streamed_slot(pg) as (slot, tail, pid):
        pg.execute("INSERT INTO t SELECT generate_series(1, 100)")
        wait_for(lambda: tail.collector.transactions, timeout=20, what="the insert")
        text = status("-d", pg.dsn, "-S", slot)
        data = status_json("-d", pg.dsn, "-S", slot)
    for needle in (slot, f"active (pid {pid})", "confirmed_flush_lsn", "retained WAL", "lag"):
        assert needle in text, text
    assert "warning" not in text
    assert set(data) == {"slot", "wal_warnings"}
    assert data["slot"]["slot_name"] == slot and data["slot"]["active_pid"] == pid
    assert data["wal_warnings"] == []


def test_inactive_slot_past_the_retained_wal_limit(pg: Database) -> None:
    pg.execute("CREATE TABLE t (id int)")
    slot = create_slot(pg)
    pg.execute("INSERT INTO t SELECT generate_series(1, 20000)")
    text = status("-d", pg.dsn, "-S", slot, "--max-retained-wal", "100kB")
    assert "inactive" in text and "warn over 100.0 kB" in text
    (warning,) = [line for line in text.splitlines() if line.startswith("warning: ")]
    assert f"slot {slot} retains" in warning and "over the configured 100.0 kB" in warning
    data = status_json("-d", pg.dsn, "-S", slot, "--max-retained-wal", "1GB")
    assert data["wal_warnings"] == [] and data["slot"]["active"] is False


def test_invalidated_slot(small_keep: Database) -> None:
    slot = create_slot(small_keep)
    make_wal(small_keep, 3)
    small_keep.execute("CHECKPOINT")
    text = status("-d", small_keep.dsn, "-S", slot)
    assert "invalidated" in text and "lost" in text
    data = status_json("-d", small_keep.dsn, "-S", slot)
    assert data["slot"]["wal_status"] == "lost" and data["slot"]["restart_lsn"] is None
    (warning,) = data["wal_warnings"]
    assert f"slot {slot} is invalidated" in warning


def test_batches_and_plot(pg: Database, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE t (id int)")
    slot = create_slot(pg)
    log = BatchLog.at(tmp_path / "batches")
    for record in batch_records(12):
        log.append(record)
    plot = tmp_path / "lag.png"
    args = ("-d", pg.dsn, "-S", slot, "--batches", log.location, "--plot", str(plot))
    text = status(*args)
    assert "Batches" in text and "12 since" in text and "#12" in text
    assert TARGETS[0] in text and str(plot) in text
    plot.unlink()
    data = status_json(*args)
    assert png_size(plot) == (1000, 800)
    assert data["plot"]["series"]["changes/s"] == 12
    assert data["plot"]["series"][f"apply seconds {TARGETS[1]}"] == 6
    batches = data["batches"]
    assert batches["count"] == 12 and batches["changes"] == sum(100 * i for i in range(1, 13))
    assert batches["last"]["batch"] == 12


def test_bad_input_is_one_line(pg: Database, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE t (id int)")
    slot = create_slot(pg)
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn, "-S", "nope"), 'replication slot "nope" does not exist'
    )
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn, "-S", slot, "--plot", str(tmp_path / "x.png")),
        "--plot needs --batches",
        status=2,
    )
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn, "-S", slot, "--max-retained-wal", "12XB"),
        "expected a size",
        status=2,
    )
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn), "give PIPELINE.toml or -S SLOT", status=2
    )
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn, "-S", slot, "--standby", pg.dsn),
        "the server given as the standby is not in recovery",
    )
    damaged = tmp_path / "batches"
    damaged.mkdir()
    (damaged / "0000000001.jsonl").write_text("not json\n")
    assert_one_error_line(
        run_cli("status", "-d", pg.dsn, "-S", slot, "--batches", str(damaged)),
        "line 1 is not a batch record",
    )
    secret = "host=127.0.0.1 port=1 password=hunter2 connect_timeout=2"
    line = assert_one_error_line(run_cli("status", "-d", secret, "-S", slot), "cannot connect")
    assert "hunter2" not in line
