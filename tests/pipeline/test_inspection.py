"""The pipeline's looks at the catalog while it runs (`inspect_tables`, `bind_partition`)
wait out a moment without a server, as its replication session does: a failover's window
between the primary's stop and the standby's promotion stopped a run ("cannot connect ...
session is read-only")."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pgcdc.embedded import EmbeddedServer, available_versions
from pgcdc.pipeline._bindings import bind_partition, inspect_tables
from pgcdc.storage import LocalFileIO

pytestmark = pytest.mark.server


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A private server: the test restarts it."""
    version = max(available_versions())
    with EmbeddedServer(version) as server:
        yield server


def _looking_through_a_restart(server: EmbeddedServer, look: Callable[[], object]) -> int:
    """`look()` again and again while the server restarts (fast); how many looks ran."""
    restart = threading.Thread(target=server.restart, args=("fast",))
    looks = 0
    restart.start()
    try:
        while restart.is_alive():
            look()
            looks += 1
    finally:
        restart.join()
    look()
    return looks + 1


def test_looks_while_running_wait_for_the_server(
    own_server: EmbeddedServer, tmp_path: Path
) -> None:
    db = own_server.create_database()
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        "CREATE TABLE t1 PARTITION OF t FOR VALUES FROM (0) TO (10);"
        "CREATE PUBLICATION pub FOR TABLE t WITH (publish_via_partition_root)"
    )
    t1 = db.execute("SELECT 't1'::regclass::oid")[0][0]
    state = LocalFileIO(str(tmp_path))
    first = inspect_tables(db.dsn, ["pub"], ["public.t"], state)
    assert first.events == [] and "public.t" in first.bindings.oids

    def inspected() -> None:
        again = inspect_tables(db.dsn, ["pub"], ["public.t"], state, first)
        assert again.events == [] and again.bindings.oids == first.bindings.oids

    def bound() -> None:
        bindings = copy.deepcopy(first.bindings)
        bindings.routes.pop(t1, None)
        assert bind_partition(db.dsn, bindings, t1) == "public.t"

    assert _looking_through_a_restart(own_server, inspected) >= 2
    assert _looking_through_a_restart(own_server, bound) >= 2
