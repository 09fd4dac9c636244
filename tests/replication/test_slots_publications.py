"""Slots and publications, through the `pgcdc slot` / `pgcdc publication` commands and the API.

Slots: create/list/drop round trip; `list_slots` shows who holds a slot, how much WAL it
retains (growing while nobody consumes, shrinking once a consumer confirms), two-phase slots
(15+), failover slots (17+, and a clear UnsupportedOption before). Publications: table lists,
column lists and row filters (15+) really shape what is streamed; `describe_publication` and
`warnings()` flag replica identities that make UPDATE/DELETE fail or lose old values.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgcdc.embedded import Database
from pgcdc.errors import PublicationError, SlotNotFound, UnsupportedOption
from pgcdc.protocol import Lsn
from pgcdc.replication import publications, slots
from pgcdc.replication.publications import TableSpec

from .helpers import (
    TailThread,
    assert_one_error_line,
    current_wal_lsn,
    run_cli,
    slot_row,
    unique,
    wait_for,
)


def cli_slots(db: Database) -> dict[str, dict[str, Any]]:
    result = run_cli("slot", "list", "-d", db.dsn, "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {row["slot_name"]: row for row in rows if row["database"] == db.dbname}


def test_cli_slot_create_list_drop(pg: Database) -> None:
    name = f"{pg.dbname}_cli"
    result = run_cli("slot", "create", name, "-d", pg.dsn)
    assert result.returncode == 0, result.stderr
    prefix = f"created slot {name} at "
    assert result.stdout.startswith(prefix), result.stdout
    created_at = Lsn.parse(result.stdout[len(prefix) :].strip())
    assert created_at <= current_wal_lsn(pg)

    listed = cli_slots(pg)[name]
    assert listed["plugin"] == "pgoutput"
    assert listed["slot_type"] == "logical"
    assert listed["temporary"] is False
    assert listed["active"] is False and listed["active_pid"] is None
    assert Lsn.parse(listed["confirmed_flush_lsn"]) == created_at
    assert listed["wal_status"] == "reserved"
    assert listed["two_phase"] is False
    table = run_cli("slot", "list", "-d", pg.dsn)
    assert table.returncode == 0 and name in table.stdout, table.stdout + table.stderr

    assert_one_error_line(run_cli("slot", "create", name, "-d", pg.dsn), "already exists")
    again = run_cli("slot", "create", name, "-d", pg.dsn, "--if-not-exists")
    assert again.returncode == 0 and "already exists" in again.stdout, again.stderr

    dropped = run_cli("slot", "drop", name, "-d", pg.dsn)
    assert dropped.returncode == 0 and dropped.stdout.strip() == f"dropped slot {name}"
    assert name not in cli_slots(pg)
    assert_one_error_line(run_cli("slot", "drop", name, "-d", pg.dsn), "does not exist")


def test_list_slots_shows_holder_and_retained_wal(pg: Database) -> None:
    pg.execute(
        """CREATE TABLE a (id int PRIMARY KEY);
           CREATE TABLE bulk (id int, v text);
           CREATE PUBLICATION pub FOR TABLE a"""
    )
    name = f"{pg.dbname}_health"
    slots.create_slot(pg.dsn, name)
    idle = slots.get_slot(pg.dsn, name)
    assert (idle.active, idle.active_pid, idle.wal_status) == (False, None, "reserved")
    assert idle.database == pg.dbname and idle.plugin == "pgoutput"
    assert idle.safe_wal_size is None  # max_slot_wal_keep_size = -1: no limit
    assert not idle.invalidated
    assert idle.retained_bytes is not None and idle.retained_bytes >= 0

    # Nobody consumes: every byte of WAL written is retained.
    pg.execute("INSERT INTO bulk SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g")
    grown = slots.get_slot(pg.dsn, name)
    assert grown.retained_bytes is not None
    assert grown.retained_bytes >= idle.retained_bytes + 1_000_000, (idle, grown)
    assert grown.restart_lsn == idle.restart_lsn

    tail = TailThread(pg.dsn, name, "pub")
    tail.start()
    try:
        holder = wait_for(
            lambda: tail.backend_pid and slots.get_slot(pg.dsn, name).active_pid,
            timeout=20,
            what="the slot to be active",
        )
        assert holder == tail.backend_pid
        walsenders = pg.execute(
            "SELECT pid FROM pg_stat_replication WHERE application_name = 'pgcdc'"
        )
        assert (holder,) in walsenders

        # A consumer that confirms lets the slot release the WAL (restart_lsn moves once a
        # checkpoint has logged a running-xacts record for the decoder).
        def released() -> bool:
            pg.execute("CHECKPOINT")
            now = slots.get_slot(pg.dsn, name)
            return bool(now.retained_bytes is not None and now.retained_bytes < 1_000_000)

        wait_for(released, timeout=20, interval=0.5, what="the retained WAL to be released")
    finally:
        tail.finish(lambda: pg.execute("INSERT INTO a VALUES (1)"))
    wait_for(
        lambda: (s := slots.get_slot(pg.dsn, name)) and not s.active and s.active_pid is None,
        timeout=10,
        what="the slot to be released",
    )
    with pytest.raises(SlotNotFound):
        slots.get_slot(pg.dsn, f"{name}_missing")


def test_two_phase_slots(pg: Database) -> None:
    plain, cli_2pc, api_2pc = (f"{pg.dbname}_{n}" for n in ("plain", "cli2pc", "api2pc"))
    assert run_cli("slot", "create", plain, "-d", pg.dsn).returncode == 0
    result = run_cli("slot", "create", cli_2pc, "-d", pg.dsn, "--two-phase")
    assert result.returncode == 0, result.stderr
    slots.create_slot(pg.dsn, api_2pc, two_phase=True)
    listed = cli_slots(pg)
    assert listed[plain]["two_phase"] is False
    assert listed[cli_2pc]["two_phase"] is True
    assert slots.get_slot(pg.dsn, api_2pc).two_phase is True
    row = slot_row(pg, cli_2pc)
    assert row is not None and row["two_phase"] is True


def test_failover_slots(pg: Database) -> None:
    name = f"{pg.dbname}_failover"
    if pg.version < 17:
        with pytest.raises(UnsupportedOption, match=f"17 or later.*server is {pg.version}"):
            slots.create_slot(pg.dsn, name, failover=True)
        result = run_cli("slot", "create", name, "-d", pg.dsn, "--failover")
        assert_one_error_line(result, "failover", "17", str(pg.version))
        assert slot_row(pg, name) is None, "the slot was created anyway"
        return
    result = run_cli("slot", "create", name, "-d", pg.dsn, "--failover")
    assert result.returncode == 0, result.stderr
    slots.create_slot(pg.dsn, f"{name}_api", failover=True)
    slots.create_slot(pg.dsn, f"{name}_no")
    assert cli_slots(pg)[name]["failover"] is True
    api = slots.get_slot(pg.dsn, f"{name}_api")
    assert (api.failover, api.synced) == (True, False)
    assert slots.get_slot(pg.dsn, f"{name}_no").failover is False


TABLES = """
CREATE TABLE plain (id int PRIMARY KEY, a int, b text);
CREATE TABLE cols (id int PRIMARY KEY, a int, secret text);
CREATE TABLE filt (id int, a int);
ALTER TABLE filt REPLICA IDENTITY FULL;
CREATE TABLE both_t (id int PRIMARY KEY, a int, secret text);
CREATE TABLE nopk (x int, y int);
CREATE TABLE full_t (x int, y int);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (id int NOT NULL, v int);
CREATE UNIQUE INDEX idx_t_id ON idx_t (id);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_id;
CREATE TABLE nothing_t (id int PRIMARY KEY);
ALTER TABLE nothing_t REPLICA IDENTITY NOTHING;
CREATE TABLE unpublished (id int PRIMARY KEY, secret text);
"""


def test_column_lists_and_row_filters(pg: Database) -> None:
    pg.execute(TABLES)
    slot = f"{pg.dbname}_pub"
    slots.create_slot(pg.dsn, slot)
    info = publications.create_publication(
        pg.dsn,
        "shaped",
        [
            TableSpec("cols", ("id", "a")),
            TableSpec("filt", where="a > 10"),
            TableSpec.parse("both_t(id, a) WHERE id > 1"),
        ],
    )
    assert info == publications.describe_publication(pg.dsn, "shaped")
    assert (info.name, info.all_tables, info.via_partition_root) == ("shaped", False, False)
    assert info.publishes == ("insert", "update", "delete", "truncate")
    by_name = {t.name: t for t in info.tables}
    assert sorted(by_name) == ["both_t", "cols", "filt"]
    assert (by_name["cols"].columns, by_name["cols"].row_filter) == (("id", "a"), None)
    assert by_name["filt"].row_filter == "(a > 10)"
    assert (by_name["both_t"].columns, by_name["both_t"].row_filter) == (("id", "a"), "(id > 1)")

    pg.execute("INSERT INTO cols VALUES (1, 2, 'hidden')")
    pg.execute("INSERT INTO filt VALUES (1, 5), (2, 50)")
    pg.execute("INSERT INTO both_t VALUES (1, 1, 'hidden'), (2, 2, 'hidden')")
    pg.execute("INSERT INTO unpublished VALUES (1, 'hidden')")
    tail = TailThread(pg.dsn, slot, "shaped", until_idle=True)
    tail.start()
    tail.join(30)
    assert not tail.is_alive() and tail.error is None, tail.error
    assert tail.collector.transactions == [
        (("I", "cols", ("1", "2")),),
        (("I", "filt", ("2", "50")),),
        (("I", "both_t", ("2", "2")),),
    ]
    columns = {r.relname: [c.name for c in r.columns] for r in tail.collector.relations.values()}
    assert columns == {"cols": ["id", "a"], "filt": ["id", "a"], "both_t": ["id", "a"]}

    described = run_cli("publication", "describe", "shaped", "-d", pg.dsn)
    assert described.returncode == 0, described.stderr
    assert "public.cols (id, a)" in described.stdout
    assert "public.both_t (id, a) WHERE (id > 1)" in described.stdout
    assert "WHERE (a > 10)" in described.stdout

    created = run_cli(
        "publication", "create", "shaped_cli", "-d", pg.dsn, "-t", "cols(id, a)", "-t",
        "filt WHERE a > 10",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "Traceback" not in created.stderr
    cli_info = publications.describe_publication(pg.dsn, "shaped_cli")
    assert {
        (t.name, t.columns if t.name == "cols" else None, t.row_filter) for t in cli_info.tables
    } == {
        ("cols", ("id", "a"), None),
        ("filt", None, "(a > 10)"),
    }


def warnings_by_table(info: publications.PublicationInfo) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for warning in info.warnings():
        out.setdefault(warning.split(":", 1)[0], []).append(warning)
    return out


def test_a_publication_that_breaks_writes_is_refused_unless_forced(pg: Database) -> None:
    pg.execute(TABLES)
    names = ["plain", "nopk", "full_t", "idx_t", "nothing_t"]
    pg.execute("INSERT INTO nopk VALUES (1, 1); INSERT INTO nothing_t VALUES (1)")
    with pytest.raises(PublicationError) as refused:
        publications.create_publication(pg.dsn, "risky", [TableSpec(n) for n in names])
    line = str(refused.value)
    assert line.startswith("publication 'risky' not created: ") and "\n" not in line, line
    assert "public.nopk: UPDATE and DELETE on it would fail in the application" in line
    assert "the table has no replica identity; replica identity default (no primary key)" in line
    assert "add a primary key, or ALTER TABLE public.nopk REPLICA IDENTITY FULL" in line
    assert "public.nothing_t: UPDATE and DELETE" in line and "replica identity nothing" in line
    assert "plain" not in line and "idx_t" not in line and "full_t" not in line
    assert not pg.execute("SELECT 1 FROM pg_publication WHERE pubname = 'risky'")
    pg.execute("UPDATE nopk SET y = 2; DELETE FROM nothing_t")  # the application still writes

    info = publications.create_publication(
        pg.dsn, "risky", [TableSpec(n) for n in names], force=True
    )
    warned = warnings_by_table(info)
    assert set(warned) == {"public.nopk", "public.nothing_t"}, "no warning for the others"
    (nopk,) = warned["public.nopk"]
    assert "UPDATE and DELETE on it fail in the application" in nopk
    identities = {t.name: t.replica_identity for t in info.tables}
    assert identities == {
        "plain": "default",
        "nopk": "default",
        "full_t": "full",
        "idx_t": "index",
        "nothing_t": "nothing",
    }

    # The warnings are true: the server refuses UPDATE and DELETE on those tables.
    pg.execute("INSERT INTO nothing_t VALUES (1)")
    for statement in (
        "UPDATE nopk SET y = 2",
        "DELETE FROM nopk",
        "UPDATE nothing_t SET id = 2",
        "DELETE FROM nothing_t",
    ):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
            pg.execute(statement)
    pg.execute("INSERT INTO full_t VALUES (1, 1); UPDATE full_t SET y = 2; DELETE FROM full_t")

    # Only inserts published: nothing can fail because of it, so it is not refused (the
    # tables that fail already, because of "risky", are not its doing).
    quiet = publications.create_publication(
        pg.dsn, "inserts_only", [TableSpec(n) for n in names], publish=["insert"]
    )
    assert set(warnings_by_table(quiet)) == {"public.nopk", "public.nothing_t"}

    described = run_cli("publication", "describe", "risky", "-d", pg.dsn)
    assert described.returncode == 0, described.stderr
    warning_lines = [x for x in described.stderr.splitlines() if x.startswith("warning: ")]
    assert len(warning_lines) == 2, described.stderr
    assert any(line.startswith("warning: public.nopk: UPDATE and DELETE") for line in warning_lines)
    assert "public.plain  replica identity default" in described.stdout
    assert "public.idx_t  replica identity index" in described.stdout
    assert "Traceback" not in described.stderr


def test_describe_tells_no_column_list_from_explicit_list(pg: Database) -> None:
    pg.execute(TABLES)
    info = publications.create_publication(
        pg.dsn, "mixed", [TableSpec("plain"), TableSpec("cols", ("id", "a", "secret"))]
    )
    by_name = {t.name: t for t in info.tables}
    assert by_name["cols"].columns == ("id", "a", "secret")
    assert by_name["plain"].columns is None


def test_a_row_filter_outside_the_replica_identity_is_refused(pg: Database) -> None:
    pg.execute("CREATE TABLE f (id int PRIMARY KEY, a int); INSERT INTO f VALUES (1, 20)")
    with pytest.raises(PublicationError, match=r"filter on id only, or ALTER TABLE public\.f"):
        publications.create_publication(pg.dsn, "filtered", [TableSpec("f", where="a > 10")])
    pg.execute("UPDATE f SET a = 30")
    info = publications.create_publication(
        pg.dsn, "filtered", [TableSpec("f", where="a > 10")], force=True
    )
    with pytest.raises(psycopg.errors.InvalidColumnReference, match="replica identity"):
        pg.execute("UPDATE f SET a = 40")
    assert any("fail" in w for w in warnings_by_table(info).get("public.f", [])), info.warnings()


ACCOUNTS = """
CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84));
INSERT INTO pgbench_accounts SELECT g, 1, g, '' FROM generate_series(1, 10) g;
"""
README_SPEC = "pgbench_accounts(aid, abalance) WHERE abalance > 0"


def test_the_cli_refuses_what_would_break_the_applications_writes(pg: Database) -> None:
    """The form the README showed: a row filter on a column outside the default replica
    identity. Refused in one line (the application's UPDATE still works); with --force it is
    created, warned about, and the server then refuses the application's UPDATE."""
    pg.execute(ACCOUNTS)
    args = ["publication", "create", "accounts", "-d", pg.dsn, "-t", README_SPEC]
    line = assert_one_error_line(
        run_cli(*args),
        "publication 'accounts' not created: public.pgbench_accounts: UPDATE and DELETE on it "
        "would fail in the application (column used in the publication WHERE expression is "
        "not part of the replica identity; replica identity default (primary key aid))",
        "filter on aid only, or ALTER TABLE public.pgbench_accounts REPLICA IDENTITY FULL",
        "--force",
    )
    assert "identity d " not in line and "identity d)" not in line, "the catalog's letter"
    assert not pg.execute("SELECT 1 FROM pg_publication WHERE pubname = 'accounts'")
    pg.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")

    forced = run_cli(*args, "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stderr.startswith("warning: public.pgbench_accounts: UPDATE and DELETE on it")
    assert "replica identity default" in forced.stdout
    with pytest.raises(psycopg.errors.InvalidColumnReference, match="replica identity"):
        pg.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")

    # What the line advises works: a filter on the key, or REPLICA IDENTITY FULL.
    pg.execute("DROP PUBLICATION accounts")
    keyed = run_cli(*args[:-1], "pgbench_accounts(aid, abalance) WHERE aid > 5")
    assert keyed.returncode == 0 and not keyed.stderr, keyed.stderr
    pg.execute("DROP PUBLICATION accounts; ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL")
    full = run_cli(
        "publication", "create", "full", "-d", pg.dsn, "-t", "pgbench_accounts WHERE abalance > 0"
    )
    assert full.returncode == 0 and not full.stderr, full.stderr
    pg.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")


def test_alter_drops_and_adds_a_table_in_one_transaction(pg: Database) -> None:
    """--drop T --add 'T(cols)' changes T's column list (before: 'already member'); a change
    that would break writes is refused whole: the drop is not kept either."""
    pg.execute(ACCOUNTS)
    assert (
        run_cli("publication", "create", "acc", "-d", pg.dsn, "-t", "pgbench_accounts").returncode
        == 0
    )
    alter = ["publication", "alter", "acc", "-d", pg.dsn, "--drop", "pgbench_accounts"]
    changed = run_cli(*alter, "--add", "pgbench_accounts(aid, abalance)")
    assert changed.returncode == 0, changed.stderr
    assert "public.pgbench_accounts (aid, abalance)  replica identity default" in changed.stdout
    (table,) = publications.describe_publication(pg.dsn, "acc").tables
    assert table.columns == ("aid", "abalance")

    assert_one_error_line(
        run_cli(*alter, "--add", "pgbench_accounts(bid, abalance)"),
        "publication 'acc' not altered: public.pgbench_accounts: UPDATE and DELETE on it would "
        "fail in the application (column list used by the publication does not cover the "
        "replica identity; replica identity default (primary key aid)): add aid to the column "
        "list",
    )
    (table,) = publications.describe_publication(pg.dsn, "acc").tables
    assert table.columns == ("aid", "abalance"), "the refused change was half kept"
    pg.execute("UPDATE pgbench_accounts SET abalance = 0 WHERE aid = 2")

    forced = run_cli(*alter, "--add", "pgbench_accounts(bid, abalance)", "--force")
    assert forced.returncode == 0 and "warning: public.pgbench_accounts" in forced.stderr
    with pytest.raises(psycopg.errors.InvalidColumnReference, match="replica identity"):
        pg.execute("DELETE FROM pgbench_accounts WHERE aid = 2")


def test_describe_says_what_it_could_not_check(pg: Database) -> None:
    """A role that may not update a table cannot ask the server about it: said, not guessed."""
    pg.execute(ACCOUNTS)
    publications.create_publication(pg.dsn, "acc", [TableSpec("pgbench_accounts")])
    weak = unique("reader")
    pg.server.query(f"CREATE ROLE {weak} LOGIN")
    try:
        info = publications.describe_publication(pg.server.dsn_for(pg.dbname, user=weak), "acc")
    finally:
        pg.server.query(f"DROP ROLE {weak}")
    assert info.warnings() == [
        "public.pgbench_accounts: could not check whether UPDATE and DELETE work: "
        "permission denied for table pgbench_accounts"
    ]
