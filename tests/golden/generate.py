"""Record the golden captures in this folder from real PostgreSQL servers.

    .venv/bin/python tests/golden/generate.py [15 16 18]

For each server version, one workload that makes the server send every message type it can,
recorded once per session variant (plain proto 1 text, and the richest options the version
accepts: binary, messages, streaming, two-phase). The captures are checked in; the tests decode
them (tests/test_golden.py). Re-run only when the workload changes.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from pgcdc.embedded import Database, EmbeddedServer, available_versions
from pgcdc.protocol import Lsn, StreamingMode
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions
from pgcdc.replication.record import record

HERE = Path(__file__).parent

SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE customers (id int PRIMARY KEY, name text, note text, m mood, score posint);
ALTER TABLE customers ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE fullrow (id int, v text);
ALTER TABLE fullrow REPLICA IDENTITY FULL;
CREATE TABLE parent (id int PRIMARY KEY);
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent);
CREATE TABLE big (id int PRIMARY KEY, payload text);
CREATE TABLE unpublished (id int);
CREATE PUBLICATION pub FOR TABLE customers, fullrow, parent, child, big;
SELECT pg_replication_origin_create('node_a');
"""

WORKLOAD = [
    # insert with NULLs, an enum and a domain, and an out-of-line (TOASTed) value
    """INSERT INTO customers VALUES
         (1, 'alice', repeat('toast-', 2000), 'happy', 7),
         (2, NULL, NULL, NULL, NULL)""",
    # update that leaves the TOASTed column unchanged: new tuple carries 'u'
    "UPDATE customers SET name = 'alice b' WHERE id = 1",
    # key change: old key tuple 'K'
    "UPDATE customers SET id = 3 WHERE id = 2",
    "DELETE FROM customers WHERE id = 3",
    # replica identity full: old row 'O'
    "INSERT INTO fullrow VALUES (1, 'one'), (2, 'two')",
    "UPDATE fullrow SET v = 'uno' WHERE id = 1",
    "DELETE FROM fullrow WHERE id = 2",
    # truncate with cascade and restart identity
    "INSERT INTO parent VALUES (1); INSERT INTO child VALUES (10, 1)",
    "TRUNCATE parent CASCADE",
    "TRUNCATE child RESTART IDENTITY",
    # only unpublished changes: PG15+ sends nothing, older servers an empty B/C
    "INSERT INTO unpublished VALUES (1)",
    # logical messages, transactional and not
    "SELECT pg_logical_emit_message(true, 'tx-prefix', 'in a transaction')",
    "SELECT pg_logical_emit_message(false, 'nontx', '\\x00ff00'::bytea)",
]

ORIGIN_TXN = [
    "SELECT pg_replication_origin_session_setup('node_a')",
    "BEGIN",
    "SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())",
    "INSERT INTO customers VALUES (100, 'from node_a', NULL, 'ok', 1)",
    "COMMIT",
    "SELECT pg_replication_origin_session_reset()",
]

# Exceeds logical_decoding_work_mem (64kB) so that it is streamed, with a rolled-back
# subtransaction in the middle.
STREAMED_COMMIT = [
    "BEGIN",
    "INSERT INTO big SELECT g, repeat('s', 40) FROM generate_series(1, 600) g",
    "SAVEPOINT sp",
    "INSERT INTO big SELECT g, 'rolled back' FROM generate_series(5001, 5600) g",
    "SELECT pg_logical_emit_message(true, 'sub', 'inside a subtransaction')",
    "ROLLBACK TO SAVEPOINT sp",
    "INSERT INTO big SELECT g, repeat('t', 40) FROM generate_series(2001, 2600) g",
    "COMMIT",
]

# Rolled back only after the walsender has streamed some of it: PG18 does not stream a
# transaction it already knows was aborted.
STREAMED_ABORT = [
    "BEGIN",
    "INSERT INTO big SELECT g, repeat('a', 40) FROM generate_series(10001, 10800) g",
    "SELECT pg_sleep(2)",
    "ROLLBACK",
]

TWO_PHASE = [
    "BEGIN; INSERT INTO customers VALUES (200, 'prepared', NULL, 'ok', 2); "
    "PREPARE TRANSACTION 'gid-commit'",
    "COMMIT PREPARED 'gid-commit'",
    "BEGIN; INSERT INTO customers VALUES (201, 'rolled back', NULL, 'sad', 3); "
    "PREPARE TRANSACTION 'gid-rollback'",
    "ROLLBACK PREPARED 'gid-rollback'",
    # a large prepared transaction: Stream Prepare when streaming is on
    "BEGIN; INSERT INTO big SELECT g, repeat('p', 40) FROM generate_series(20001, 20800) g; "
    "PREPARE TRANSACTION 'gid-streamed'",
    "COMMIT PREPARED 'gid-streamed'",
]


def variants(version: int) -> dict[str, StreamOptions]:
    plain = StreamOptions(("pub",), proto_version=1)
    out = {"proto1-text": plain}
    if version >= 14:
        rich = StreamOptions(
            ("pub",),
            binary=True,
            messages=True,
            streaming=StreamingMode.PARALLEL if version >= 16 else StreamingMode.ON,
            two_phase=version >= 15,
            settings={"logical_decoding_work_mem": "64kB"},
        )
        out["max-binary-streaming"] = rich
    if version >= 16:
        out["proto4-text-streaming-on"] = StreamOptions(
            ("pub",),
            messages=True,
            streaming=StreamingMode.ON,
            two_phase=True,
            settings={"logical_decoding_work_mem": "64kB"},
        )
    return out


def run(db: Database, statements: list[str]) -> None:
    with db.connect() as conn:
        for statement in statements:
            conn.execute(statement)


def generate(version: int) -> None:
    with EmbeddedServer(version) as server:
        db = server.create_database("golden")
        run(db, [SETUP])
        slots = variants(version)
        with ReplicationConnection.connect(db.dsn) as conn:
            for name, options in slots.items():
                conn.create_slot(_slot(name), two_phase=options.two_phase)
        # Record while the workload runs, so that in-progress transactions are streamed.
        clients = {
            name: ReplicationClient(
                db.dsn, _slot(name), options, status_interval=0.5, reconnect=False
            )
            for name, options in slots.items()
        }
        results: dict[str, int] = {}
        threads = [
            threading.Thread(
                target=lambda n=name, c=client: results.__setitem__(
                    n, record(c, _path(version, n), note=f"generate.py workload, {n}")
                )
            )
            for name, client in clients.items()
        ]
        for thread in threads:
            thread.start()
        run(db, WORKLOAD)
        run(db, ORIGIN_TXN)
        run(db, STREAMED_COMMIT)
        run(db, STREAMED_ABORT)
        if version >= 15:
            run(db, TWO_PHASE)
        ((end,),) = db.execute("SELECT pg_current_wal_lsn()::text")
        for client in clients.values():
            while client.stream is None:
                time.sleep(0.1)
            client.stream.endpos = Lsn.parse(end)
        for thread in threads:
            thread.join()
        for name, count in results.items():
            path = _path(version, name)
            print(f"{path.name}: {count} messages, {path.stat().st_size} bytes")


def _path(version: int, name: str) -> Path:
    return HERE / f"pg{version}-{name}.pgcap"


def _slot(name: str) -> str:
    return "golden_" + name.replace("-", "_")


if __name__ == "__main__":
    versions = [int(v) for v in sys.argv[1:]] or sorted(v for v in available_versions() if v >= 15)
    for v in versions:
        generate(v)
