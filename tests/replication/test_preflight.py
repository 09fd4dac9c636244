"""The source is checked before anything starts (issue 22, item 7): each problem a server of
one's own may have is one line saying how to fix it. Every check runs against a real server
that has the problem, and the server is shown to really refuse what the line predicts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.errors import (
    ConnectionFailed,
    PermissionDenied,
    PublicationNotFound,
    ReplicationError,
    ServerConfigurationError,
)
from pgcdc.protocol import Lsn
from pgcdc.replication import ReplicationConnection
from pgcdc.replication.preflight import check_source, resume_line

from .helpers import unique

PUB = "pre_pub"


@pytest.fixture(scope="module")
def server(pg_server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """A server of the matrix's version set up as many are: wal_level = replica, and few
    replication slots and WAL senders."""
    settings = {"wal_level": "replica", "max_replication_slots": 2, "max_wal_senders": 2}
    with EmbeddedServer(pg_server.version, settings=settings) as own:
        yield own


def logical(server: EmbeddedServer) -> None:
    if server.query("SHOW wal_level")[0][0] != "logical":
        server.configure({"wal_level": "logical"})
        server.restart()


@contextmanager
def database(server: EmbeddedServer) -> Iterator[Database]:
    created = server.create_database()
    created.execute(f"CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUB} FOR TABLE t")
    try:
        yield created
    finally:
        created.drop()


@pytest.fixture
def db(server: EmbeddedServer) -> Iterator[Database]:
    """A database on the module's server switched to wal_level = logical first: the switch
    restarts the server, which ends every connection open at the time, the database's too."""
    logical(server)
    with database(server) as created:
        yield created


def test_wal_level(pg_server: EmbeddedServer) -> None:
    # A server of its own: the module's is switched to logical by whichever test runs first.
    replica_server = EmbeddedServer(pg_server.version, settings={"wal_level": "replica"})
    with replica_server as replica, database(replica) as db:
        with pytest.raises(ServerConfigurationError) as raised:
            check_source(db.dsn, "s", [PUB], create_slot=True)
        assert str(raised.value) == (
            "the server has wal_level = replica; logical decoding needs logical: run ALTER "
            "SYSTEM SET wal_level = logical (as a superuser) and restart the server"
        )
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="wal_level"):
            db.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        logical(replica)  # what the line says, done
        check_source(db.dsn, "s", [PUB], create_slot=True)


def test_replication_privilege(server: EmbeddedServer, db: Database) -> None:
    role = unique("app")
    server.query(f"CREATE ROLE {role} LOGIN")
    try:
        dsn = server.dsn_for(db.dbname, user=role)
        with pytest.raises(PermissionDenied) as raised:
            check_source(dsn, "s", [PUB], create_slot=False)
        assert str(raised.value) == (
            f"role {role} may not use replication: ALTER ROLE {role} REPLICATION (as a "
            "superuser), or connect as a role that has it"
        )
        with pytest.raises((PermissionDenied, ConnectionFailed), match=r"(?i)replication"):
            ReplicationConnection.connect(dsn).close()
        server.query(f"ALTER ROLE {role} REPLICATION")
        check_source(dsn, "s", [PUB], create_slot=False)
    finally:
        server.query(f"DROP ROLE {role}")


def test_replication_slots_in_use(server: EmbeddedServer, db: Database) -> None:
    taken = [unique("taken") for _ in range(2)]
    for slot in taken:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        with pytest.raises(ServerConfigurationError) as raised:
            check_source(db.dsn, "new_slot", [PUB], create_slot=True)
        assert str(raised.value) == (
            "no replication slot is free for slot new_slot: 2 of max_replication_slots = 2 "
            "exist; drop one that is not needed (pgcdc slot list, pgcdc slot drop NAME) or "
            "raise max_replication_slots (ALTER SYSTEM SET, then restart the server)"
        )
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            db.execute("SELECT pg_create_logical_replication_slot('new_slot', 'pgoutput')")
        check_source(db.dsn, taken[0], [PUB], create_slot=True)  # it exists: nothing to create
        check_source(db.dsn, "new_slot", [PUB], create_slot=False)  # said later, elsewhere
    finally:
        for slot in taken:
            db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_wal_senders_in_use(server: EmbeddedServer, db: Database) -> None:
    held = [ReplicationConnection.connect(db.dsn) for _ in range(2)]
    try:
        with pytest.raises(ServerConfigurationError) as raised:
            check_source(db.dsn, "s", [PUB], create_slot=True)
        assert str(raised.value) == (
            "no WAL sender is free: 2 of max_wal_senders = 2 are running; stop a replication "
            "client that is not needed, or raise max_wal_senders (ALTER SYSTEM SET, then "
            "restart the server)"
        )
        with pytest.raises(ReplicationError, match="max_wal_senders"):
            ReplicationConnection.connect(db.dsn).close()
    finally:
        for conn in held:
            conn.close()


def test_missing_publication_and_several_problems(server: EmbeddedServer, db: Database) -> None:
    with pytest.raises(PublicationNotFound) as raised:
        check_source(db.dsn, "s", [PUB, "nosuch"], create_slot=True)
    assert str(raised.value) == (
        f'publication "nosuch" does not exist in database {db.dbname}: create it, e.g. pgcdc '
        "publication create nosuch -d ... -t SCHEMA.TABLE"
    )
    role = unique("app")
    server.query(f"CREATE ROLE {role} LOGIN")
    try:
        with pytest.raises(PermissionDenied) as raised:
            check_source(server.dsn_for(db.dbname, user=role), "s", ["nosuch"], create_slot=True)
    finally:
        server.query(f"DROP ROLE {role}")
    line = str(raised.value)
    assert line.startswith(f"role {role} may not use replication") and "\n" not in line
    assert '; publication "nosuch" does not exist' in line


def test_resume_line() -> None:
    assert resume_line("s", None, {"public.b": None, "public.a": None}) == (
        "starting: creating slot s; public.a copy pending, public.b copy pending"
    )
    marks = {"public.a": Lsn.parse("0/1A2B00"), "public.b": None}
    line = resume_line("s", Lsn.parse("0/1A2B3C"), marks, unapplied="from the slot's position")
    assert line == (
        "resuming slot s at 0/1A2B3C (confirmed); public.a at 0/1A2B00, "
        "public.b from the slot's position"
    )
