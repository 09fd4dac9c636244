"""The embedded servers really are what the rest of the suite relies on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from pgcdc.embedded import (
    BINDIRS_ENV,
    Database,
    EmbeddedServer,
    EmbeddedServerError,
    available_versions,
    find_bindir,
    installations,
)


def test_discovery_reports_real_versions() -> None:
    found = installations()
    assert found, "no PostgreSQL installation found at all"
    for major, inst in found.items():
        assert inst.major == major
        assert inst.version.split(".")[0].startswith(str(major))
        assert (inst.bindir / "postgres").exists()
        assert (inst.bindir / "initdb").exists()
    assert available_versions() == {m: i.bindir for m, i in found.items()}


def test_bindirs_env_overrides_discovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    major, bindir = next(iter(available_versions().items()))
    monkeypatch.setenv(BINDIRS_ENV, os.pathsep.join([str(tmp_path), str(bindir)]))
    assert available_versions() == {major: bindir}
    with pytest.raises(EmbeddedServerError, match="PostgreSQL 99 not installed"):
        find_bindir(99)


def test_settings(pg_server: EmbeddedServer) -> None:
    settings = dict(
        pg_server.query(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (["wal_level", "max_prepared_transactions", "max_replication_slots", "fsync"],),
        )
    )
    assert settings == {
        "wal_level": "logical",
        "max_prepared_transactions": "20",
        "max_replication_slots": "20",
        "fsync": "off",
    }
    assert pg_server.query("SHOW server_version_num")[0][0].startswith(str(pg_server.version))
    assert pg_server.query("SHOW listen_addresses") == [("127.0.0.1",)]


def test_server_runs_unprivileged(pg_server: EmbeddedServer) -> None:
    if os.geteuid() == 0:
        assert pg_server.os_user != "root"
        assert pg_server.datadir.stat().st_uid != 0
    assert pg_server.log_path.exists()
    assert "database system is ready" in pg_server.log_path.read_text(errors="replace")


def test_replication_connection(pg: Database) -> None:
    conn = pq.PGconn.connect(pg.replication_dsn.encode())
    try:
        assert conn.status == pq.ConnStatus.OK, conn.get_error_message()
        res = conn.exec_(b"IDENTIFY_SYSTEM")
        assert res.status == pq.ExecStatus.TUPLES_OK, conn.get_error_message()
        assert res.ntuples == 1
        assert res.get_value(0, 3) == pg.dbname.encode()  # dbname column
    finally:
        conn.finish()


def test_unix_socket_connection(pg_server: EmbeddedServer) -> None:
    dsn = f"host={pg_server.socket_dir} port={pg_server.port} user=postgres dbname=postgres"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_database_fixture(pg: Database, pg_server: EmbeddedServer) -> None:
    assert pg.server is pg_server
    assert pg.version == pg_server.version
    assert pg.execute("SELECT current_database()") == [(pg.dbname,)]
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    assert pg.execute("INSERT INTO t VALUES (%s, %s)", (1, "a")) == []
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [("a",)]


def test_drop_database_with_slots_and_prepared_xacts(pg_server: EmbeddedServer) -> None:
    db = pg_server.create_database()
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT pg_create_logical_replication_slot('idle_slot', 'pgoutput')")
    # slots first: creating a slot waits for open (and prepared) transactions to end
    walsender = pq.PGconn.connect(db.replication_dsn.encode())  # holds an active slot
    res = walsender.exec_(b"CREATE_REPLICATION_SLOT busy_slot LOGICAL pgoutput")
    assert res.status == pq.ExecStatus.TUPLES_OK, walsender.get_error_message()
    res = walsender.exec_(
        b"START_REPLICATION SLOT busy_slot LOGICAL 0/0 (proto_version '1', publication_names 'p')"
    )
    assert res.status == pq.ExecStatus.COPY_BOTH, walsender.get_error_message()
    with db.connect(autocommit=False) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'left_behind'")
    try:
        db.drop()
    finally:
        walsender.finish()
    assert pg_server.query("SELECT 1 FROM pg_database WHERE datname = %s", (db.dbname,)) == []
    assert (
        pg_server.query(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name IN ('idle_slot', 'busy_slot')"
        )
        == []
    )
    assert pg_server.query("SELECT gid FROM pg_prepared_xacts WHERE gid = 'left_behind'") == []


def test_restart_keeps_data_and_stop_cleans_up(pg_server: EmbeddedServer) -> None:
    """On a private server: the shared one must stay up for the other tests."""
    with EmbeddedServer(pg_server.version) as server:
        server.query("CREATE TABLE kept (v text)")
        server.query("INSERT INTO kept VALUES ('survives')")
        pid, port = server.pid, server.port
        server.restart()
        assert server.running and server.pid != pid and server.port == port
        assert server.query("SELECT v FROM kept") == [("survives",)]
        server.restart(mode="immediate")  # crash recovery
        assert server.query("SELECT v FROM kept") == [("survives",)]
        base, socket_dir = server.datadir.parent, server.socket_dir
        assert base.is_dir()
    assert not server.running
    assert not base.exists()
    assert not socket_dir.exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    server.stop()  # idempotent


def test_start_failure_reports_log_and_cleans_up(pg_server: EmbeddedServer) -> None:
    server = EmbeddedServer(pg_server.version, settings={"shared_buffers": "lots"})
    with pytest.raises(EmbeddedServerError, match="did not start") as excinfo:
        server.start()
    message = str(excinfo.value)
    assert "shared_buffers" in message  # the server's own complaint, from the log tail
    assert not server.running
    assert not server.datadir.parent.exists()


def test_not_started_server_has_no_port() -> None:
    server = EmbeddedServer(max(available_versions()))
    with pytest.raises(EmbeddedServerError, match="not been started"):
        _ = server.port
    server.stop()  # harmless
