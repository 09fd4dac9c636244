"""`pgcdc run PIPELINE.toml`: continuous streaming with a live view, Ctrl-C stops cleanly
after the batch in progress; a user error is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pgcdc.embedded import Database
from pgcdc.targets import DeltaTarget
from replication.helpers import PGCDC, confirmed_flush, unique

pytestmark = pytest.mark.server


def write_config(path: Path, db: Database, slot: str, publication: str, lake: Path) -> Path:
    path.write_text(
        f"""
name = "cli"
[source]
conninfo = "{db.dsn}"
publication = "{publication}"
slot = "{slot}"
create_slot = true
[target]
path = "{lake}"
[trigger]
interval = "0.5 seconds"
[tables]
"public.t" = ["mirror", "history"]
"""
    )
    return path


def mirror_ids(lake: Path) -> list[int]:
    target = DeltaTarget(str(lake / "public.t"), "mirror", app_id="pgcdc:cli")
    return sorted(target.to_arrow().column("id").to_pylist()) if target.exists else []


def wait_for_ids(lake: Path, expected: list[int], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while mirror_ids(lake) != expected:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"mirror has {mirror_ids(lake)}"
        time.sleep(0.5)


def test_run_streams_continuously_and_stops_on_ctrl_c(pg: Database, tmp_path: Path) -> None:
    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    slot, publication = unique("cli"), unique("pub")
    pg.execute(
        f"CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION {publication} FOR TABLE t"
    )
    lake = tmp_path / "lake"
    config = write_config(tmp_path / "p.toml", pg, slot, publication, lake)
    proc = subprocess.Popen(
        [PGCDC, "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="120"),
    )
    try:
        deadline = time.monotonic() + 120
        while not pg.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}'"):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.5)
        pg.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 5) g")
        wait_for_ids(lake, [1, 2, 3, 4, 5], proc)
        pg.execute("DELETE FROM t WHERE id = 3")
        pg.execute("INSERT INTO t VALUES (6, 'w')")
        wait_for_ids(lake, [1, 2, 4, 5, 6], proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Stopped cleanly" in err and "public.t mirror" in err
    last = pg.execute("SELECT pg_current_wal_lsn()")[0][0]
    assert str(confirmed_flush(pg, slot)) <= str(last)
    assert pg.execute(
        f"SELECT confirmed_flush_lsn >= (SELECT max(lsn) FROM pg_logical_slot_peek_binary_changes("
        f"'{slot}', NULL, NULL, 'proto_version', '1', 'publication_names', '{publication}'))"
        f" IS NOT FALSE FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ) == [(True,)]


def test_run_reports_a_missing_slot_in_one_line(pg: Database, tmp_path: Path) -> None:
    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    pg.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path / "p.toml", pg, "missing_slot", "missing_pub", tmp_path)
    config.write_text(config.read_text().replace("create_slot = true", "create_slot = false"))
    result = subprocess.run(
        [PGCDC, "run", str(config)], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("pgcdc: error:")]
    assert errors == [
        "pgcdc: error: replication slot 'missing_slot' does not exist (create it with "
        "`pgcdc slot create`, or set create_slot = true in [source])"
    ], result.stderr
    assert "Traceback" not in result.stderr
