"""A server whose slots `max_slot_wal_keep_size` (and on 18 `idle_replication_slot_timeout`)
soon invalidates."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgcdc.embedded import Database, EmbeddedServer


@pytest.fixture
def small_keep(pg_server: EmbeddedServer) -> Iterator[Database]:
    """A database with a table t on a server of its own (of `pg_server`'s version) with
    max_slot_wal_keep_size = 1MB, and on 18 idle_replication_slot_timeout = 2s."""
    settings: dict[str, str | int | bool | float] = {"max_slot_wal_keep_size": "1MB"}
    if pg_server.version >= 18:
        settings["idle_replication_slot_timeout"] = "2s"
    with EmbeddedServer(pg_server.version, settings=settings) as server:
        db = server.create_database()
        db.execute("CREATE TABLE t (id int)")
        yield db
        db.close()
