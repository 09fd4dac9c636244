"""Each way of getting replication wrong ends in pgcdc's own error class (API) and in exit status
1 with exactly one ``pgcdc: error: ...`` line naming the problem (CLI), never a traceback.

Password authentication and wal_level=replica need a differently configured server: the module
starts one per version (`strict_server`), with scram-sha-256 for one role in pg_hba.conf.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import psycopg
import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.errors import (
    ConnectionFailed,
    PermissionDenied,
    PublicationNotFound,
    ServerConfigurationError,
    SlotInUse,
    SlotNotFound,
)
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions, slots

from .helpers import (
    PGCDC,
    assert_one_error_line,
    run_cli,
    slot_row,
    spawn,
    unique,
    wait_active,
    wait_for,
)

PUB = "err_pub"
PASSWORD_ROLE = "pw_user"
PASSWORD = "right-password"


def setup(db: Database) -> str:
    db.execute(f"CREATE TABLE a (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE a")
    slot = f"{db.dbname}_err"
    with ReplicationConnection.connect(db.dsn) as conn:
        conn.create_slot(slot)
    return slot


def tail_args(dsn: str, slot: str, publication: str = PUB, *extra: str) -> list[str]:
    return ["tail", "-d", dsn, "-S", slot, "--publication", publication, *extra]


def consume(dsn: str, slot: str, publication: str = PUB) -> None:
    """Open a ReplicationClient (reconnect on: first-connection errors must still be raised
    at once) and read until idle."""
    client = ReplicationClient(
        dsn, slot, StreamOptions((publication,)), until_idle=True, reconnect_timeout=30
    )
    started = time.monotonic()
    try:
        with client:
            for _ in client:
                pass
    finally:
        assert time.monotonic() - started < 10, "the error was retried instead of raised"


def test_missing_slot(pg: Database) -> None:
    setup(pg)
    with pytest.raises(SlotNotFound, match='replication slot "no_such_slot" does not exist'):
        consume(pg.dsn, "no_such_slot")
    result = run_cli(*tail_args(pg.dsn, "no_such_slot"))
    assert_one_error_line(result, '"no_such_slot" does not exist')


def test_slot_in_use(pg: Database) -> None:
    slot = setup(pg)
    with spawn([PGCDC, *tail_args(pg.dsn, slot)]) as holder:
        pid = wait_active(pg, slot)
        with pytest.raises(SlotInUse, match=f"is active for PID {pid}"):
            consume(pg.dsn, slot)
        result = run_cli(*tail_args(pg.dsn, slot))
        assert_one_error_line(result, f'"{slot}" is active for PID {pid}')
        result = run_cli("slot", "drop", slot, "-d", pg.dsn)
        assert_one_error_line(result, f'"{slot}" is active for PID {pid}')
        assert holder.running(), holder.stderr
        row = slot_row(pg, slot)
        assert row is not None and row["active_pid"] == pid, "the holder lost its slot"


def test_missing_publication(pg: Database) -> None:
    """Checked before streaming: PG18 would only warn and skip it, older servers would fail
    only once the first change is decoded."""
    slot = setup(pg)
    before = slot_row(pg, slot)
    with pytest.raises(PublicationNotFound, match="no_such_pub"):
        consume(pg.dsn, slot, "no_such_pub")
    result = run_cli(*tail_args(pg.dsn, slot, "no_such_pub"))
    assert_one_error_line(result, "no_such_pub", "does not exist")
    result = run_cli("publication", "describe", "no_such_pub", "-d", pg.dsn)
    assert_one_error_line(result, '"no_such_pub" does not exist')
    assert slot_row(pg, slot) == before, "the slot was touched"


@pytest.fixture
def role_without_replication(pg: Database) -> Iterator[str]:
    role = unique("norepl")
    pg.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role
    finally:
        pg.server.query(f"DROP ROLE IF EXISTS {role}")


def test_role_without_replication_privilege(pg: Database, role_without_replication: str) -> None:
    slot = setup(pg)
    dsn = pg.server.dsn_for(pg.dbname, user=role_without_replication)
    with psycopg.connect(dsn) as conn:  # the role itself can log in
        conn.execute("SELECT 1")
    with pytest.raises(PermissionDenied):
        consume(dsn, slot)
    with pytest.raises(PermissionDenied):
        slots.create_slot(dsn, unique("s"))
    assert_one_error_line(
        run_cli(*tail_args(dsn, slot)), "WAL sender" if pg.version >= 16 else "walsender"
    )
    line = assert_one_error_line(run_cli("slot", "create", unique("s"), "-d", dsn))
    assert "replication" in line.lower()


@pytest.fixture(scope="module")
def strict_server(pg_server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """Same version, wal_level=replica, and scram-sha-256 authentication for PASSWORD_ROLE."""
    server = EmbeddedServer(pg_server.version, settings={"wal_level": "replica"}).start()
    try:
        server.query(f"CREATE ROLE {PASSWORD_ROLE} LOGIN REPLICATION PASSWORD '{PASSWORD}'")
        hba = server.datadir / "pg_hba.conf"
        rule = f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
        hba.write_text(rule + hba.read_text())  # first match wins
        server.reload()

        def password_required() -> bool:
            try:
                psycopg.connect(server.dsn_for(user=PASSWORD_ROLE, password="")).close()
            except psycopg.OperationalError as exc:
                return "password" in str(exc)
            return False

        wait_for(password_required, timeout=20, what="pg_hba.conf to be reloaded")
        yield server
    finally:
        server.stop()


def test_wrong_password(strict_server: EmbeddedServer) -> None:
    right = strict_server.dsn_for(user=PASSWORD_ROLE, password=PASSWORD)
    with ReplicationConnection.connect(right) as conn:  # the control: the right one works
        assert conn.identify_system().dbname == "postgres"
    wrong = strict_server.dsn_for(user=PASSWORD_ROLE, password="wrong-password")
    with pytest.raises(ConnectionFailed, match="password authentication failed"):
        consume(wrong, "any_slot")
    with pytest.raises(ConnectionFailed, match="password authentication failed"):
        slots.list_slots(wrong)
    expected = f'password authentication failed for user "{PASSWORD_ROLE}"'
    assert_one_error_line(run_cli(*tail_args(wrong, "any_slot")), expected)
    assert_one_error_line(run_cli("slot", "create", "any_slot", "-d", wrong), expected)
    assert_one_error_line(run_cli("slot", "list", "-d", wrong), expected)


def test_wal_level_not_logical(strict_server: EmbeddedServer) -> None:
    dsn = strict_server.dsn
    with pytest.raises(ServerConfigurationError, match="wal_level"):
        slots.create_slot(dsn, "needs_logical")
    assert_one_error_line(run_cli("slot", "create", "needs_logical", "-d", dsn), "wal_level")
    strict_server.query(f"CREATE PUBLICATION {PUB} FOR ALL TABLES")
    result = run_cli(*tail_args(dsn, "needs_logical", PUB, "--create-slot"))
    assert_one_error_line(result, "wal_level")
    assert strict_server.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_unreachable_replication(closed_port: int) -> None:
    dsn = f"host=127.0.0.1 port={closed_port} dbname=postgres connect_timeout=5"
    with pytest.raises(ConnectionFailed, match="refused"):
        consume(dsn, "any_slot")
    assert_one_error_line(
        run_cli(*tail_args(dsn, "any_slot")), f"127.0.0.1:{closed_port}", "refused"
    )


def test_server_unreachable_sql(closed_port: int) -> None:
    dsn = f"host=127.0.0.1 port={closed_port} dbname=postgres connect_timeout=5"
    with pytest.raises(ConnectionFailed, match="refused"):
        slots.list_slots(dsn)
    assert_one_error_line(run_cli("slot", "list", "-d", dsn), str(closed_port), "refused")


MALFORMED = {
    "user": 'missing "=" after "user"',
    "hostx=db password=secret": 'invalid connection option "hostx"',
    "postgresql://localhost/app?foo=bar": 'invalid URI query parameter: "foo"',
}
COMMANDS = [
    ("slot", "list"),
    ("slot", "create", "s"),
    ("slot", "drop", "s"),
    ("publication", "create", "p", "-t", "t"),
    ("publication", "alter", "p", "--add", "t"),
    ("publication", "describe", "p"),
    ("tail", "-S", "s", "--publication", "p", "--until-idle"),
    ("tail", "-S", "s", "--publication", "p", "--until-idle", "-P", "test_decoding"),
    ("record", "-S", "s", "--publication", "p", "--until-idle", "-f", "{tmp}/c.pgcap"),
]


@pytest.mark.parametrize("conninfo", list(MALFORMED))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2] + c[6:8]))
def test_malformed_connection_strings_are_one_line(
    conninfo: str, command: tuple[str, ...], tmp_path: object
) -> None:
    """No server is asked: libpq cannot parse the string. One line, no password in it."""
    args = [a.format(tmp=tmp_path) for a in command]
    line = assert_one_error_line(run_cli(*args, "-d", conninfo), MALFORMED[conninfo])
    assert line.startswith("pgcdc: error: invalid connection string: ")
    assert "secret" not in line


def test_malformed_connection_string_in_a_pipeline(tmp_path: object) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "p.toml"
    config.write_text(
        '[source]\nconninfo = "hostx=db"\npublication = "p"\nslot = "s"\n'
        '[target]\npath = "lake"\n[tables]\n"public.t" = "mirror"\n'
    )
    assert_one_error_line(run_cli("run", str(config)), 'invalid connection option "hostx"')
    result = run_cli("recopy", str(config), "public.t")
    assert_one_error_line(result, 'invalid connection option "hostx"')
