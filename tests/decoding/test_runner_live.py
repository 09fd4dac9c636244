"""Output plugins on real servers: bounded memory, two-phase, origins, acknowledgement, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from pgcdc.decoding import OutputPlugin, PluginRunner, SpillPool
from pgcdc.embedded import Database
from pgcdc.protocol import Lsn
from pgcdc.replication import StreamOptions
from replication.helpers import (
    PGCDC,
    assert_one_error_line,
    confirmed_flush,
    run_cli,
    server_version_num,
    unique,
    wait_for,
)

pytestmark = pytest.mark.server


class Rows(OutputPlugin):
    """Collects (xid, first column) per change and the commits, in callback order."""

    events: list[tuple[Any, ...]]

    def startup(self, ctx, options, is_init):
        self.events = ctx.output_plugin_private = []

    def begin(self, ctx, txn):
        self.events.append(("begin", txn.xid, txn.origin))

    def change(self, ctx, txn, relation, change):
        row = change.new if change.new is not None else change.old
        self.events.append((change.action.value, int(row.values[0])))

    def commit(self, ctx, txn, commit_lsn):
        self.events.append(("commit", txn.xid))


class LocalRows(Rows):
    def startup(self, ctx, options, is_init):
        super().startup(ctx, options, is_init)
        options.only_local = True


class PreparedRows(Rows):
    def filter_prepare(self, ctx, xid, gid):
        return "_nodecode" in gid

    def begin_prepare(self, ctx, txn):
        self.events.append(("begin_prepare", txn.gid))

    def prepare(self, ctx, txn, prepare_lsn):
        self.events.append(("prepare", txn.gid))

    def commit_prepared(self, ctx, txn, commit_lsn):
        self.events.append(("commit_prepared", txn.gid))

    def rollback_prepared(self, ctx, txn, prepare_end_lsn, prepare_ts):
        self.events.append(("rollback_prepared", txn.gid))


class FailsOnSecondCommit(Rows):
    def commit(self, ctx, txn, commit_lsn):
        super().commit(ctx, txn, commit_lsn)
        if sum(1 for e in self.events if e[0] == "commit") == 2:
            raise RuntimeError("downstream is down")


def setup(pg: Database, *, two_phase: bool = False) -> str:
    slot = unique("s")
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION pub FOR TABLE t")
    pg.execute(
        f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput', false, {two_phase})"
    )
    return slot


def run(pg: Database, slot: str, plugin: type[Rows], **kwargs: Any) -> tuple[list, PluginRunner]:
    options = kwargs.pop("stream_options", StreamOptions(("pub",)))
    runner = PluginRunner(pg.dsn, slot, plugin, options, until_idle=True, **kwargs)
    runner.run()
    return runner.plugin.events, runner


def test_streamed_transaction_many_times_the_budget(pg: Database, tmp_path: Path) -> None:
    """A 4 MB streamed transaction through a 256 kB budget: spilled, complete, cleaned up."""
    slot = setup(pg)
    pg.execute(
        "BEGIN;"
        "INSERT INTO t SELECT g, repeat('x', 150) FROM generate_series(1, 10000) g;"
        "SAVEPOINT a; INSERT INTO t SELECT g, 'gone' FROM generate_series(20001, 25000) g;"
        "ROLLBACK TO a;"
        "INSERT INTO t SELECT g, repeat('y', 150) FROM generate_series(10001, 20000) g;"
        "COMMIT"
    )
    options = StreamOptions(("pub",), settings={"logical_decoding_work_mem": "64kB"})
    pool_limit = 256 * 1024
    events, runner = run(
        pg,
        slot,
        Rows,
        stream_options=options,
        streaming="on",
        memory_limit=pool_limit,
        spill_dir=str(tmp_path),
    )
    ids = [e[1] for e in events if e[0] == "insert"]
    assert ids == list(range(1, 20001))
    assert events[0][0] == "begin" and events[-1][0] == "commit"
    pool: SpillPool = runner.pool
    assert runner.assembler is not None and runner.assembler.stats.streamed_buffered == 1
    assert pool.spilled_bytes > 10 * pool_limit
    assert pool.peak_memory_bytes <= pool_limit + 4096
    assert list(tmp_path.iterdir()) == []


class ColumnCounts(Rows):
    """Records (first column, columns of its Relation, columns of its row); at the row with
    id `cut`, ends the walsender and commits `after` once it is gone (the runner reconnects
    and the server sends again everything the slot was not confirmed past)."""

    db: Database
    slot: str
    cut = 3
    after = ""

    def change(self, ctx, txn, relation, change):
        row = change.new if change.new is not None else change.old
        self.events.append((int(row.values[0]), len(relation.columns), len(row.values)))
        if int(row.values[0]) == self.cut and self.after:
            query = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"
            self.db.execute(f"SELECT pg_terminate_backend(({query}))", (self.slot,))
            wait_for(
                lambda: self.db.execute(query, (self.slot,))[0][0] is None,
                timeout=30,
                what="the walsender to end",
            )
            self.db.execute(self.after)
            type(self).after = ""


class RawRows(Rows):
    """Each change as the server sent it (undecoded), one by one; truncates and messages."""

    undecoded_rows = True

    def change(self, ctx, txn, relation, change):
        self.events.append((relation.relname, len(relation.columns), change.lsn, change.raw))

    def truncate(self, ctx, txn, relations, change):
        self.events.append(("truncate", [r.relname for r in relations], change.lsn))

    def message(self, ctx, txn, lsn, transactional, prefix, content):
        self.events.append(("message", lsn, transactional, content))


class RawRuns(RawRows):
    """The same, taking the changes that arrived together at once."""

    def undecoded_changes(self, ctx, txn, relation_of, changes):
        self.events.append(("run", len(changes.frames)))
        for lsn, change in changes.changes():
            relation = relation_of(change.relid)
            self.events.append((relation.relname, len(relation.columns), lsn, change.message))


def test_row_changes_that_arrive_together_are_taken_at_once(pg: Database) -> None:
    """A plugin that takes runs of undecoded row changes gets the same changes, in the same
    order and under the same relation descriptions, as one that takes them one by one: large
    and small transactions over three tables, old rows whole (replica identity full), and in
    the middle of a transaction a logical message, a TRUNCATE and a column added; a prepared
    transaction (a run never spans a transaction, a Relation message, a truncate or a
    message)."""
    slots = [setup(pg), unique("s")]
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slots[1]}', 'pgoutput')")
    pg.execute("CREATE TABLE u (id int PRIMARY KEY)")
    pg.execute("ALTER TABLE u REPLICA IDENTITY FULL")
    pg.execute("CREATE TABLE v (id int PRIMARY KEY)")
    pg.execute("ALTER PUBLICATION pub ADD TABLE u, v")
    pg.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 3000) g")
    pg.execute("INSERT INTO v SELECT generate_series(1, 10)")
    pg.execute(
        "BEGIN; INSERT INTO u SELECT generate_series(1, 500); UPDATE t SET v = 'y' WHERE id < 50;"
        " SELECT pg_logical_emit_message(true, 'p', 'in the middle'); TRUNCATE v;"
        " ALTER TABLE t ADD COLUMN n int; UPDATE t SET n = id WHERE id < 100;"
        " DELETE FROM u WHERE id % 2 = 0; COMMIT"
    )
    pg.execute(
        "BEGIN; INSERT INTO u VALUES (5000); UPDATE u SET id = 5001 WHERE id = 5000;"
        " PREPARE TRANSACTION 'runs'"
    )
    pg.execute("COMMIT PREPARED 'runs'")
    for i in range(20):
        pg.execute(
            f"BEGIN; INSERT INTO u VALUES ({1000 + i}); DELETE FROM t WHERE id = {i}; COMMIT"
        )
    events = {
        plugin: run(pg, slot, plugin)[0]
        for plugin, slot in zip((RawRows, RawRuns), slots, strict=True)
    }
    runs = [e[1] for e in events[RawRuns] if e[0] == "run"]
    assert [e for e in events[RawRuns] if e[0] != "run"] == events[RawRows]
    assert sum(runs) == 3000 + 10 + 500 + 49 + 99 + 250 + 2 + 20 + 19  # (no row 0 to delete)
    assert max(runs) > 100, "no run of the rows sent back to back"
    kinds = {(e[0], e[1]) for e in events[RawRows] if e[0] in ("t", "u", "v")}
    assert kinds == {("t", 2), ("t", 3), ("u", 1), ("v", 1)}
    others = [e for e in events[RawRows] if e[0] in ("truncate", "message")]
    assert [e[0] for e in others] == ["message", "truncate"]
    assert others[0][3] == b"in the middle" and others[1][1] == ["v"]


def test_relations_sent_in_transactions_delivered_before_a_reconnect(pg: Database) -> None:
    """After a reconnect the server sends again what the slot was not confirmed past, and
    the runner drops the transactions it already delivered. Their Relation messages count:
    the server described the table there and does not again, so a change after them is bound
    to what they said. Here a streamed transaction (it passes whole, its Relation message
    still describing two columns) comes first, then one that adds a column: the insert
    committed after the reconnect has three columns, described by that second one."""
    slot = setup(pg)
    pg.execute(
        "BEGIN; INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1000, 3000) g;COMMIT"
    )
    pg.execute("BEGIN; ALTER TABLE t ADD COLUMN n int; INSERT INTO t VALUES (1, 'a', 1); COMMIT")
    pg.execute("INSERT INTO t VALUES (2, 'b', 2)")
    pg.execute("INSERT INTO t VALUES (3, 'c', 3)")
    ColumnCounts.db, ColumnCounts.slot = pg, slot
    ColumnCounts.after = "INSERT INTO t VALUES (4, 'd', 4)"
    options = StreamOptions(("pub",), settings={"logical_decoding_work_mem": "64kB"})
    runner = PluginRunner(pg.dsn, slot, ColumnCounts, options, streaming="on", auto_confirm=False)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(
            lambda: any(e[0] == 4 for e in getattr(runner.plugin, "events", ())),
            timeout=60,
            what="the insert committed after the reconnect",
        )
    finally:
        runner.stop()
        thread.join(30)
    changes = [e for e in runner.plugin.events if isinstance(e[0], int)]
    assert [e for e in changes if e[1] != e[2]] == [], "a change bound to another description"
    assert [e[0] for e in changes if e[0] < 1000] == [1, 2, 3, 4]
    assert runner.assembler is not None and runner.assembler.stats.streamed_buffered >= 1


class CountsAndMessages(ColumnCounts):
    def message(self, ctx, txn, lsn, transactional, prefix, content):
        self.events.append(("message", transactional, content.decode()))


def test_messages_outside_transactions_delivered_before_a_reconnect(pg: Database) -> None:
    """A logical decoding message outside any transaction, handed over before a reconnect,
    is not handed over again when the server sends it again."""
    slot = setup(pg)
    pg.execute("INSERT INTO t VALUES (1, 'a')")
    pg.execute("SELECT pg_logical_emit_message(false, 'p', 'once')")
    pg.execute("SELECT pg_logical_emit_message(true, 'p', 'in a transaction')")
    pg.execute("INSERT INTO t VALUES (2, 'b')")
    pg.execute("SELECT pg_logical_emit_message(false, 'p', 'right before the cut')")
    pg.execute("INSERT INTO t VALUES (3, 'c')")
    CountsAndMessages.db, CountsAndMessages.slot = pg, slot
    CountsAndMessages.after = "SELECT pg_logical_emit_message(false, 'p', 'after')"
    options = StreamOptions(("pub",), messages=True)
    runner = PluginRunner(pg.dsn, slot, CountsAndMessages, options, auto_confirm=False)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(
            lambda: ("message", False, "after") in getattr(runner.plugin, "events", ()),
            timeout=60,
            what="the message sent after the reconnect",
        )
    finally:
        runner.stop()
        thread.join(30)
    seen = [e[2] if e[0] == "message" else e[0] for e in runner.plugin.events if e[0] != "begin"]
    seen = [e for e in seen if e != "commit"]
    assert seen == [1, "once", "in a transaction", 2, "right before the cut", 3, "after"]


def test_a_message_outside_transactions_is_confirmed_past(pg: Database) -> None:
    """The slot is confirmed past a message outside any transaction once handled: the next
    run does not get it again (confirmed at its start, the server would send it again)."""
    slot = setup(pg)
    pg.execute("INSERT INTO t VALUES (1, 'a')")
    lsn = Lsn.parse(pg.execute("SELECT pg_logical_emit_message(false, 'p', 'once')::text")[0][0])
    pg.execute("SELECT pg_logical_emit_message(false, 'p', 'last')")
    pg.execute("INSERT INTO t VALUES (2, 'b')")  # (a commit flushes the WAL before it)
    options = StreamOptions(("pub",), messages=True)
    events, _ = run(pg, slot, CountsAndMessages, stream_options=options)
    assert [e for e in events if e[0] == "message"] == [
        ("message", False, "once"),
        ("message", False, "last"),
    ]
    assert confirmed_flush(pg, slot) > lsn
    pg.execute("INSERT INTO t VALUES (3, 'c')")
    events, _ = run(pg, slot, CountsAndMessages, stream_options=options)
    assert [e for e in events if e[0] not in ("begin", "commit")] == [(3, 2, 2)]


def test_two_phase_with_filter_prepare(pg: Database) -> None:
    if server_version_num(pg) < 150000:
        pytest.skip("two-phase decoding through pgoutput needs PostgreSQL 15")
    slot = setup(pg, two_phase=True)
    for gid, finish, first in (
        ("g1", "COMMIT", 1),
        ("g2_nodecode", "COMMIT", 10),
        ("g3", "ROLLBACK", 20),
        ("g4_nodecode", "ROLLBACK", 30),
    ):
        pg.execute(f"BEGIN; INSERT INTO t VALUES ({first}, 'p'); PREPARE TRANSACTION '{gid}'")
        pg.execute(f"{finish} PREPARED '{gid}'")
    events, _ = run(pg, slot, PreparedRows, stream_options=StreamOptions(("pub",), two_phase=True))
    names = [e for e in events if e[0] != "begin" and e[0] != "commit"]
    assert names == [
        ("begin_prepare", "g1"),
        ("insert", 1),
        ("prepare", "g1"),
        ("commit_prepared", "g1"),
        ("insert", 10),  # decoded at COMMIT PREPARED as an ordinary transaction
        ("begin_prepare", "g3"),
        ("insert", 20),
        ("prepare", "g3"),
        ("rollback_prepared", "g3"),
    ]
    assert sum(1 for e in events if e[0] == "commit") == 1


def test_held_prepared_transaction_is_not_confirmed(pg: Database) -> None:
    """Without two-phase callbacks a prepared transaction waits for COMMIT PREPARED, and the
    slot is not confirmed past it: the next run gets it from the server again (and, being a
    new process that kept no state, also the transaction after it once more)."""
    if server_version_num(pg) < 150000:
        pytest.skip("two-phase slots need PostgreSQL 15")
    slot = setup(pg, two_phase=True)
    pg.execute("INSERT INTO t VALUES (1, 'before')")
    before = Lsn(pg.execute("SELECT pg_current_wal_lsn()")[0][0])
    pg.execute("BEGIN; INSERT INTO t VALUES (2, 'p'); PREPARE TRANSACTION 'held'")
    pg.execute("INSERT INTO t VALUES (3, 'after')")
    events, _ = run(pg, slot, Rows)
    assert [e[1] for e in events if e[0] == "insert"] == [1, 3]
    assert confirmed_flush(pg, slot) <= before
    pg.execute("COMMIT PREPARED 'held'")
    events, _ = run(pg, slot, Rows)
    assert [e[1] for e in events if e[0] == "insert"] == [3, 2]


def test_origin_filtering(pg: Database) -> None:
    slot = setup(pg)
    pg.execute("SELECT pg_replication_origin_create('upstream')")
    pg.execute("INSERT INTO t VALUES (1, 'local')")
    with pg.connect() as conn:  # autocommit: the origin is recorded at commit
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        conn.execute("INSERT INTO t VALUES (2, 'replicated')")
        conn.execute("SELECT pg_replication_origin_session_reset()")
    pg.execute("INSERT INTO t VALUES (3, 'local')")
    everything, _ = run(pg, slot, Rows, acknowledge=False)
    assert [e[1] for e in everything if e[0] == "insert"] == [1, 2, 3]
    assert ("begin", everything[3][1], "upstream") == everything[3]
    local, runner = run(pg, slot, LocalRows)
    assert [e[1] for e in local if e[0] == "insert"] == [1, 3]
    filtered_by_server = server_version_num(pg) >= 160000
    assert runner.assembler is not None
    assert runner.assembler.stats.skipped_by_origin == (0 if filtered_by_server else 1)


def test_confirmed_only_after_the_commit_callback_returned(pg: Database) -> None:
    slot = setup(pg)
    start = confirmed_flush(pg, slot)
    marks = []
    for i in range(3):
        pg.execute(f"INSERT INTO t VALUES ({i}, 'x')")
        marks.append(Lsn(pg.execute("SELECT pg_current_wal_lsn()")[0][0]))
    with pytest.raises(RuntimeError, match="downstream is down"):
        run(pg, slot, FailsOnSecondCommit)
    confirmed = confirmed_flush(pg, slot)
    assert start < confirmed <= marks[0]  # the first transaction, not the second
    events, _ = run(pg, slot, Rows)
    assert [e[1] for e in events if e[0] == "insert"] == [1, 2]


USER_PLUGIN = """
from pgcdc.decoding import OutputPlugin


class Upper(OutputPlugin):
    def begin(self, ctx, txn):
        pass

    def change(self, ctx, txn, relation, change):
        ctx.prepare_write()
        ctx.append(f"{change.action.value.upper()} {change.new.values[0].decode()}")
        ctx.write()

    def commit(self, ctx, txn, commit_lsn):
        pass
"""


FAILING_PLUGIN = """
from pgcdc.decoding import OutputPlugin


class Fails(OutputPlugin):
    def begin(self, ctx, txn):
        pass

    def change(self, ctx, txn, relation, change):
        raise ZeroDivisionError("plugin bug")

    def commit(self, ctx, txn, commit_lsn):
        pass
"""


def test_tail_reports_a_failing_user_plugin_in_one_line(pg: Database, tmp_path: Path) -> None:
    slot = setup(pg)
    start = confirmed_flush(pg, slot)
    pg.execute("INSERT INTO t VALUES (1, 'a')")
    (tmp_path / "failing.py").write_text(FAILING_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = ["tail", "-d", pg.dsn, "-S", slot, "--publication", "pub", "--until-idle"]
    result = subprocess.run(
        [PGCDC, *args, "-P", "failing:Fails"], capture_output=True, text=True, env=env, check=False
    )
    assert_one_error_line(result, "failing:Fails", "ZeroDivisionError: plugin bug", "at LSN")
    assert confirmed_flush(pg, slot) == start


def test_tail_with_json_plugin_and_user_plugin(pg: Database, tmp_path: Path) -> None:
    slot = setup(pg)
    pg.execute("INSERT INTO t VALUES (1, 'a'); UPDATE t SET v = 'b' WHERE id = 1")
    base = ["tail", "-d", pg.dsn, "-S", slot, "--publication", "pub", "--until-idle"]
    out = tmp_path / "out.jsonl"
    result = run_cli(*base, "--no-confirm", "-P", "json", "-f", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(d["op"], d["after"]) for d in lines] == [
        ("insert", {"id": "1", "v": "a"}),
        ("update", {"id": "1", "v": "b"}),
    ]
    # one transaction (one simple query): one commit_lsn, ordinals 1 and 2
    assert [d["ordinal"] for d in lines] == [1, 2]
    assert lines[0]["commit_lsn"] == lines[1]["commit_lsn"] and lines[0]["xid"] == lines[1]["xid"]

    (tmp_path / "myplugin.py").write_text(USER_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [PGCDC, *base, "-P", "myplugin:Upper"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["INSERT 1", "UPDATE 1"]
    assert_one_error_line(run_cli(*base, "-P", "json", "-o", "nope"), "nope", "json plugin")
    assert_one_error_line(run_cli(*base, "-P", "pgcdc.plugins:Missing"), "Missing")
    usage = run_cli(*base, "-o", "x=1")
    assert usage.returncode == 2 and "-o/--option needs -P/--plugin" in usage.stderr
