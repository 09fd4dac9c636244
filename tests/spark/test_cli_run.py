"""`pgcdc run PIPELINE.toml`: continuous streaming with a live view, Ctrl-C stops cleanly
after the batch in progress; a user error is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.protocol import Lsn
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
    pg.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    config = write_config(tmp_path / "p.toml", pg, "missing_slot", "pub", tmp_path)
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_status_metrics_and_plot_of_a_running_pipeline(pg: Database, tmp_path: Path) -> None:
    """While `pgcdc run` streams: its Prometheus endpoint has the figures, `pgcdc status
    PIPELINE.toml --json` shows the slot, the batches, each target's watermark and rows, and
    `--plot` draws the batch log."""
    import json
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    slot, publication = unique("cli"), unique("pub")
    pg.execute(
        f"CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION {publication} FOR TABLE t"
    )
    lake = tmp_path / "lake"
    port = _free_port()
    config = write_config(tmp_path / "p.toml", pg, slot, publication, lake)
    config.write_text(config.read_text() + f"[metrics]\nport = {port}\n")
    proc = subprocess.Popen(
        [PGCDC, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        mirror = DeltaTarget(str(lake / "public.t"), "mirror", app_id="pgcdc:cli")
        while not (mirror.exists and mirror.watermark is not None):  # the copy is done
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.5)
        for i in range(3):  # three transactions, most likely three batches
            pg.execute(
                f"INSERT INTO t SELECT g, 'v' FROM generate_series({i * 5 + 1}, {i * 5 + 5}) g"
            )
            time.sleep(1)
        wait_for_ids(lake, list(range(1, 16)), proc)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(scraped.decode())
            for s in family.samples
        }
        assert samples[("pgcdc_changes_total", ())] >= 15
        watermark = samples[("pgcdc_target_watermark_lsn", (("target", "public.t mirror"),))]
        assert watermark > 0
        shown = subprocess.run(
            [PGCDC, "status", str(config), "--json"], capture_output=True, text=True, timeout=120
        )
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert status["slot"]["slot_name"] == slot and status["slot"]["active"]
        assert status["batches"]["count"] >= 1 and status["batches"]["changes"] >= 15
        mirror = status["targets"]["public.t mirror"]
        assert mirror["rows"] == 15 and mirror["watermark"] != "-"
        assert status["initial_copy"]["status"] == "done"
        png = tmp_path / "lag.png"
        drawn = subprocess.run(
            [PGCDC, "status", str(config), "--plot", str(png)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert drawn.returncode == 0, drawn.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert "changes/s" in drawn.stdout and "Targets" in drawn.stdout
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pgcdc: error:")]


def test_run_checks_the_source_before_starting_spark(pg: Database, tmp_path: Path) -> None:
    """A server with wal_level = replica: one line saying how to fix it, before Spark starts
    (before, Spark started and the view showed for half a minute before the server's error)."""
    from pgcdc.errors import ServerConfigurationError
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import load_config

    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    with EmbeddedServer(pg.version, settings={"wal_level": "replica"}) as server:
        db = server.create_database()
        db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
        config = write_config(tmp_path / "p.toml", db, "s", "p", tmp_path / "lake")
        result = subprocess.run(
            [PGCDC, "run", str(config)], capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 1, result.stderr
        assert error_lines(result.stderr) == [
            "pgcdc: error: the server has wal_level = replica; logical decoding needs logical: "
            "run ALTER SYSTEM SET wal_level = logical (as a superuser) and restart the server"
        ], result.stderr
        assert "Traceback" not in result.stderr
        pipeline = Pipeline(load_config(config))
        with pytest.raises(ServerConfigurationError, match="wal_level = replica"):
            pipeline.prepare()
        assert pipeline._spark is None, "Spark was started"


def test_a_second_ctrl_c_ends_the_run_at_once(pg: Database, tmp_path: Path) -> None:
    """The first Ctrl-C lets the work in progress (here the initial copy) finish; the second
    ends the process at once: exit status 130 and one line, no traceback."""
    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    slot, publication = unique("cli"), unique("pub")
    pg.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v text);
            INSERT INTO t SELECT g, repeat('v', 50) FROM generate_series(1, 2000000) g;
            CREATE PUBLICATION {publication} FOR TABLE t"""
    )
    config = write_config(tmp_path / "p.toml", pg, slot, publication, tmp_path / "lake")
    proc = subprocess.Popen(
        [PGCDC, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 180
        while not pg.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}'"):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # the copy goes on
        time.sleep(1)
        assert proc.poll() is None, "the copy ended within a second: nothing to interrupt"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "pgcdc: interrupted", err
    assert "Traceback" not in err and "py4j" not in err, err


def test_a_restart_says_where_it_resumed_and_spark_is_quiet(pg: Database, tmp_path: Path) -> None:
    """One line at the start: the slot and its confirmed position, each table's watermark (or
    that its copy is pending). Spark's start-up noise is gone unless PGCDC_SPARK_LOG_LEVEL
    asks for its log."""
    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    slot, publication = unique("cli"), unique("pub")
    pg.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a');
            CREATE PUBLICATION {publication} FOR TABLE t"""
    )
    lake = tmp_path / "lake"
    config = write_config(tmp_path / "p.toml", pg, slot, publication, lake)
    config.write_text(config.read_text().replace("[trigger]", "[trigger]\navailable_now = true"))
    noise = ("WARNING: Using incubator modules", "Setting default log level")

    first = subprocess.run([PGCDC, "run", str(config)], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert f"starting: creating slot {slot}; public.t copy pending" in first.stderr
    assert not [line for line in first.stderr.splitlines() if line.startswith(noise)], first.stderr

    pg.execute("INSERT INTO t VALUES (2, 'b')")
    again = subprocess.run([PGCDC, "run", str(config)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    mark = DeltaTarget(str(lake / "public.t"), "mirror", app_id="pgcdc:cli").watermark
    assert mark is not None and mirror_ids(lake) == [1, 2]
    history = DeltaTarget(str(lake / "public.t__history"), "history", app_id="pgcdc:cli")
    assert history.watermark == mark
    confirmed = confirmed_flush(pg, slot)

    pg.execute("INSERT INTO t VALUES (3, 'c')")
    loud = subprocess.run(
        [PGCDC, "run", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PGCDC_SPARK_LOG_LEVEL="warn"),
    )
    assert loud.returncode == 0, loud.stderr
    assert f"resuming slot {slot} at {confirmed} (confirmed); public.t at {Lsn(mark)}" in (
        loud.stderr
    )
    assert "WARNING: Using incubator modules" in loud.stderr, "the JVM's own line is back"


def test_verify_compares_every_target_with_its_table(pg: Database, tmp_path: Path) -> None:
    """`pgcdc verify`: one line per mirror and history target, exit 0 when every one equals
    its table; a change the targets do not hold yet is a difference (exit 1, the row named)."""
    if pg.version < 18:
        pytest.skip("the command is the same on every server; one run is enough")
    slot, publication = unique("cli"), unique("pub")
    pg.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'), (2, 'b');
            CREATE PUBLICATION {publication} FOR TABLE t"""
    )
    config = write_config(tmp_path / "p.toml", pg, slot, publication, tmp_path / "lake")
    config.write_text(config.read_text().replace("[trigger]", "[trigger]\navailable_now = true"))
    run = subprocess.run([PGCDC, "run", str(config)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    same = subprocess.run([PGCDC, "verify", str(config)], capture_output=True, text=True)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines() == [
        "mirror   public.t: identical (2 rows)",
        "history  public.t: identical (2 rows)",
    ]
    pg.execute("UPDATE t SET v = 'changed' WHERE id = 2")
    differs = subprocess.run([PGCDC, "verify", str(config), "t"], capture_output=True, text=True)
    assert differs.returncode == 1
    assert "mirror   public.t: DIFFERENT (source 2 rows, target 2; 1 missing, 1 extra)" in (
        differs.stdout
    )
    assert "missing: {'row': \"(2, 'changed')\"}" in differs.stdout
    unknown = subprocess.run([PGCDC, "verify", str(config), "u"], capture_output=True, text=True)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "pgcdc: error: public.u is not a table of pipeline 'cli'"
