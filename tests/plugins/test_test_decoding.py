"""pgcdc's TestDecoding against the server's own contrib test_decoding, line for line.

Each case runs one workload on a fresh database with a publication FOR ALL TABLES and two slots
that start at the same point: a pgoutput slot, and a test_decoding copy of it (two-phase slots
are created side by side instead: copying drops two_phase on 15). The server plugin's lines
(``pg_logical_slot_get_changes`` in a session with the settings pgcdc pins in its walsender
session) are the oracle; pgcdc's are what PluginRunner writes from the pgoutput slot.

Only Debian's PostgreSQL 15 ships ``test_decoding.so`` here; the cases skip on servers without
it. What pgoutput cannot show (see the plugin's docstring) is kept out: workloads with empty
transactions (DDL, temporary tables) only run with ``skip-empty-xacts``; tables with replica
identity NOTHING or generated columns are not used. Tables are created before the slots and
with autovacuum off, so that no autovacuum ANALYZE transaction lands in the compared range.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from pgcdc.decoding import DecodingContext, OutputPluginOptions, PluginRunner, parse_bool_option
from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.errors import PluginOptionError
from pgcdc.plugins.test_decoding import (
    TestDecoding,
    print_literal,
    quote_literal,
    timestamptz_to_str,
)
from pgcdc.protocol import Lsn
from pgcdc.replication import DEFAULT_SESSION_SETTINGS, StreamOptions
from replication.helpers import commits_held_back, unique, wait_for

NO_AUTOVACUUM = "WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
#: A value TOASTed out of line: hex digits do not compress (pglz finds no repeats).
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series({0}, {0} + 99) g)"


# -- the oracle and the candidate ------------------------------------------------------------

_has_plugin: dict[int, bool] = {}


def require_test_decoding(server: EmbeddedServer) -> None:
    """Skip unless this server's package library directory holds test_decoding.so."""
    if server.version not in _has_plugin:
        rows = server.query(
            "SELECT (pg_stat_file(setting || '/test_decoding.so', true)).size IS NOT NULL "
            "FROM pg_config WHERE name = 'PKGLIBDIR'"
        )
        _has_plugin[server.version] = bool(rows and rows[0][0])
    if not _has_plugin[server.version]:
        pytest.skip(
            f"PostgreSQL {server.version} has no contrib test_decoding.so (only Debian's "
            "postgresql-15 package ships it here): no oracle to compare with"
        )


@pytest.fixture
def pg(pg_server: EmbeddedServer) -> Iterator[Database]:
    """The harness's fresh database, on servers that have the oracle (checked first: cheap)."""
    require_test_decoding(pg_server)
    db = pg_server.create_database()
    try:
        yield db
    finally:
        db.drop()


@dataclass(frozen=True)
class Workload:
    """SQL run before the slots exist (`setup`) and the changes to decode (`run`)."""

    setup: str
    run: Callable[[Database], None]
    #: Has transactions pgoutput never sends (DDL only, temp tables): skip-empty-xacts only.
    empty_xacts: bool = False
    two_phase: bool = False
    #: logical_decoding_work_mem on both sides, to make the server stream or spill.
    work_mem: str | None = None


@dataclass
class Outputs:
    server: list[str]
    pgcdc: list[str]


def session_settings(work_mem: str | None) -> dict[str, str]:
    settings = {k: v for k, v in DEFAULT_SESSION_SETTINGS.items() if k != "client_encoding"}
    if work_mem is not None:
        settings["logical_decoding_work_mem"] = work_mem
    return settings


def server_lines(
    pg: Database, slot: str, options: dict[str, str], work_mem: str | None
) -> list[str]:
    """test_decoding's output over SQL, with the walsender's pinned settings."""
    args = [item for pair in options.items() for item in pair]
    binary = parse_bool_option("force-binary", options.get("force-binary", "off"))
    function = "pg_logical_slot_get_binary_changes" if binary else "pg_logical_slot_get_changes"
    with pg.connect() as conn:
        for name, value in session_settings(work_mem).items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        rows = conn.execute(
            f"SELECT data FROM {function}(%s, NULL, NULL, VARIADIC %s::text[])", (slot, args)
        ).fetchall()
    return [bytes(row[0]).decode() if binary else row[0] for row in rows]


def pgcdc_lines(pg: Database, slot: str, options: dict[str, str], workload: Workload) -> list[str]:
    """The built-in plugin by name, as ``-P test_decoding`` runs it, on the pgoutput slot."""
    lines: list[str] = []
    settings = {} if workload.work_mem is None else session_settings(workload.work_mem)
    stream_options = StreamOptions(("pub",), two_phase=workload.two_phase, settings=settings)
    runner = PluginRunner(
        pg.dsn,
        slot,
        "test_decoding",
        stream_options,
        plugin_options=dict(options),
        sink=lambda write: lines.append(write.data.decode()),
        until_idle=True,
    )
    runner.run()
    return lines


def compare(pg: Database, workload: Workload, options: dict[str, str]) -> Outputs:
    if workload.setup:
        pg.execute(workload.setup)
    pg.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    # Autovacuum would analyze some catalog (a shared one such as pg_database, after many
    # test databases) in whatever database it visits: the server's plugin shows that as an
    # empty transaction, pgoutput does not. Analyzed now, none is due while this compares.
    pg.execute("ANALYZE")
    source, oracle = unique("pgo"), unique("td")
    if workload.two_phase:
        for slot, plugin in ((source, "pgoutput"), (oracle, "test_decoding")):
            pg.execute(
                "SELECT pg_create_logical_replication_slot(%s, %s, false, true)", (slot, plugin)
            )
    else:
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source,))
        pg.execute(
            "SELECT pg_copy_logical_replication_slot(%s, %s, false, 'test_decoding')",
            (source, oracle),
        )
    workload.run(pg)
    wait_for_flush(pg)
    expected = server_lines(pg, oracle, options, workload.work_mem)
    return Outputs(expected, pgcdc_lines(pg, source, options, workload))


def wait_for_flush(pg: Database) -> None:
    """Wait until the WAL written so far is flushed: both sides decode only flushed WAL, and
    an abort (or an asynchronous commit) is flushed only later by the WAL writer. When the
    last record ended a page, the insert position is past the next page's header, which
    nothing is written to until the next record: the WAL is flushed once its page start is."""
    inserted, block, segment = pg.execute(
        "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
        " current_setting('wal_block_size')::int,"
        " pg_size_bytes(current_setting('wal_segment_size'))"
    )[0]
    page = int(inserted) - int(inserted) % block
    header = 40 if int(inserted) % segment == 40 else 24  # a segment's first page: long
    flushed = page if int(inserted) - page == header else int(inserted)
    wait_for(
        lambda: pg.execute("SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn >= %s", (flushed,))[
            0
        ][0],
        timeout=10,
        what=f"WAL to be flushed up to {Lsn(flushed)}",
    )


def script(*statements: str) -> Callable[[Database], None]:
    """A workload that runs each string (one or more statements) as one simple query."""

    def run(pg: Database) -> None:
        for sql in statements:
            pg.execute(sql)

    return run


# -- workloads -------------------------------------------------------------------------------

TYPES_SETUP = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s fine');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE types (
    id serial PRIMARY KEY, i2 int2, i4 int4, i8 int8, num numeric, num2 numeric(10, 3),
    f4 float4, f8 float8, b bool, t text, vc varchar(10), c char(5), by bytea, d date,
    tm time, ttz timetz, ts timestamp, tstz timestamptz(3), iv interval, u uuid, j json,
    jb jsonb, ip inet, cd cidr, mac macaddr, bt bit(4), vb varbit, ia int[], ta text[],
    dm posint, e mood, m money, o oid, "Mixed Case" text, "select" int, pt point,
    tsr tstzrange, x xml, nm name, ch "char"
) {NO_AUTOVACUUM};
"""

TYPES_ROWS = r"""
INSERT INTO types (i2, i4, i8, num, num2, f4, f8, b, t, vc, c, by, d, tm, ttz, ts, tstz, iv, u,
                   j, jb, ip, cd, mac, bt, vb, ia, ta, dm, e, m, o, "Mixed Case", "select", pt,
                   tsr, x, nm, ch)
VALUES
  (-32768, 2147483647, -9223372036854775808, 123456789.000100, 1.5, 3.14159, 2.718281828459045,
   true, 'it''s a \backslash and "quotes"', 'short', 'ab', '\x00ff27', '2024-02-29',
   '23:59:59.999999', '12:00:00+05:30', '2000-01-01 00:00:00', '2024-06-01 12:34:56.789+02',
   '1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
   '{"a": [1, 2, {"b": null}], "s": "x''y"}', '{"b": 2, "a": [true, false]}',
   '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', B'1010', B'110', '{1,NULL,3}',
   '{"a b","c''d",NULL,"e\"f"}', 42, 'it''s fine', 12.34, 4294967295, 'Grüße ☃ 🐘',
   7, '(1.5,-2)', '[2024-01-01 00:00+00,2024-02-01 00:00+00)', '<a x="1">t&amp;</a>',
   'a name', 'q'),
  (0, 0, 0, 'NaN', -0.001, 'Infinity', '-Infinity', false, '', '', '', '', 'infinity',
   '00:00', '00:00+00', '-infinity', 'infinity', '-1 days -00:00:01', NULL, 'null',
   '"str"', '::1', '::/0', 'ff:ff:ff:ff:ff:ff', B'0000', B'', '{}', '{}', 1, 'sad', -1,
   0, 'newline
here', 0, '(0,0)', 'empty', '', '', ' '),
  (NULL, NULL, NULL, 1e-20, NULL, 'NaN', 'NaN', NULL, 'tab	and ''''', NULL, NULL, NULL,
   '0001-01-01 BC', NULL, NULL, '1999-12-31 23:59:59.5', NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL);
INSERT INTO types DEFAULT VALUES;
"""

TYPES = Workload(
    TYPES_SETUP,
    script(
        TYPES_ROWS,
        "UPDATE types SET t = t || '!', f4 = f4 / 3, num = num * 2 WHERE id <= 2",
        "UPDATE types SET id = id + 100 WHERE id = 3",
        "DELETE FROM types WHERE id IN (1, 4)",
    ),
)

IDENTITY_SETUP = f"""
CREATE TABLE rid_default (id int PRIMARY KEY, v text, n int) {NO_AUTOVACUUM};
CREATE TABLE rid_full (id int, v text, n int) {NO_AUTOVACUUM};
ALTER TABLE rid_full REPLICA IDENTITY FULL;
CREATE TABLE rid_index (a int NOT NULL, "B" text NOT NULL, v text) {NO_AUTOVACUUM};
CREATE UNIQUE INDEX rid_index_ab ON rid_index (a, "B");
ALTER TABLE rid_index REPLICA IDENTITY USING INDEX rid_index_ab;
CREATE TABLE rid_compound (a int, b int, v text, PRIMARY KEY (b, a)) {NO_AUTOVACUUM};
CREATE TABLE no_key (v text, n int) {NO_AUTOVACUUM};
CREATE SCHEMA "My Schema";
CREATE TABLE "My Schema"."Order" ("Id" int PRIMARY KEY, "user" text) {NO_AUTOVACUUM};
"""

IDENTITY = Workload(
    IDENTITY_SETUP,
    script(
        "INSERT INTO rid_default VALUES (1, 'a', NULL), (2, NULL, 2);"
        "INSERT INTO rid_full VALUES (1, 'a', NULL), (2, NULL, 2);"
        "INSERT INTO rid_index VALUES (1, 'x', 'a'), (2, 'y', NULL);"
        "INSERT INTO rid_compound VALUES (1, 2, 'a'), (3, 4, 'b');"
        "INSERT INTO no_key VALUES ('only', 1), (NULL, NULL);"
        """INSERT INTO "My Schema"."Order" VALUES (1, 'me')""",
        "UPDATE rid_default SET v = 'b' WHERE id = 1",
        "UPDATE rid_default SET id = 10 WHERE id = 1",
        "UPDATE rid_full SET v = 'b' WHERE id = 1",
        "UPDATE rid_full SET n = NULL, v = 'c' WHERE id = 2",
        "UPDATE rid_index SET v = 'b' WHERE a = 1",
        """UPDATE rid_index SET "B" = 'z' WHERE a = 1""",
        "UPDATE rid_compound SET a = 5 WHERE b = 2",
        """UPDATE "My Schema"."Order" SET "Id" = 2, "user" = NULL""",
        "DELETE FROM rid_default; DELETE FROM rid_full; DELETE FROM rid_index;"
        "DELETE FROM rid_compound;"
        """DELETE FROM "My Schema"."Order\"""",
    ),
)

TOAST_SETUP = f"""
CREATE TABLE toasted (id int PRIMARY KEY, small text, big text, big2 text) {NO_AUTOVACUUM};
CREATE TABLE toasted_full (id int, small text, big text) {NO_AUTOVACUUM};
ALTER TABLE toasted_full REPLICA IDENTITY FULL;
"""

TOAST = Workload(
    TOAST_SETUP,
    script(
        f"INSERT INTO toasted VALUES (1, 's', {BIG.format(1)}, {BIG.format(1000)})",
        f"INSERT INTO toasted_full VALUES (1, 's', {BIG.format(2000)})",
        "UPDATE toasted SET small = 'changed' WHERE id = 1",
        f"UPDATE toasted SET big = {BIG.format(3000)} WHERE id = 1",
        "UPDATE toasted SET id = 2 WHERE id = 1",
        "UPDATE toasted_full SET small = 'changed'",
        f"BEGIN; INSERT INTO toasted VALUES (3, 'in', {BIG.format(4000)}, NULL);"
        "UPDATE toasted SET small = 'same xact' WHERE id = 3; COMMIT",
        "DELETE FROM toasted; DELETE FROM toasted_full",
    ),
)

TRUNCATE_SETUP = f"""
CREATE TABLE parent (id serial PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE child (id int REFERENCES parent) {NO_AUTOVACUUM};
CREATE TABLE other (id serial, v text) {NO_AUTOVACUUM};
"""

TRUNCATE = Workload(
    TRUNCATE_SETUP,
    script(
        "INSERT INTO parent DEFAULT VALUES; INSERT INTO child VALUES (1);"
        "INSERT INTO other (v) VALUES ('x')",
        "TRUNCATE parent CASCADE",
        "TRUNCATE other RESTART IDENTITY",
        "TRUNCATE parent, child, other RESTART IDENTITY CASCADE",
        "TRUNCATE child, other",
        "BEGIN; INSERT INTO other (v) VALUES ('y'); TRUNCATE other; "
        "INSERT INTO other (v) VALUES ('z'); COMMIT",
    ),
)

MESSAGES = Workload(
    f"CREATE TABLE m (id int PRIMARY KEY) {NO_AUTOVACUUM};",
    script(
        "SELECT pg_logical_emit_message(true, 'tx', 'alone in its transaction')",
        "SELECT pg_logical_emit_message(false, 'ntx', 'outside any transaction')",
        "BEGIN; INSERT INTO m VALUES (1);"
        "SELECT pg_logical_emit_message(true, 'tx', 'Grüße ☃, with '' quote');"
        "SELECT pg_logical_emit_message(false, 'ntx', 'inside, sent at once');"
        "INSERT INTO m VALUES (2); COMMIT",
        "BEGIN; SELECT pg_logical_emit_message(true, 'first', '');INSERT INTO m VALUES (3); COMMIT",
        "BEGIN; INSERT INTO m VALUES (4);"
        "SELECT pg_logical_emit_message(true, 'gone', 'rolled back'); ROLLBACK",
    ),
)

SAVEPOINTS = Workload(
    f"CREATE TABLE s (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};",
    script(
        "BEGIN; INSERT INTO s VALUES (1, 'top'); SAVEPOINT a; INSERT INTO s VALUES (2, 'gone');"
        "ROLLBACK TO a; INSERT INTO s VALUES (3, 'kept'); SAVEPOINT b;"
        "INSERT INTO s VALUES (4, 'released'); RELEASE b; SAVEPOINT c;"
        "UPDATE s SET v = 'in c' WHERE id = 1; SAVEPOINT d; DELETE FROM s WHERE id = 3;"
        "ROLLBACK TO d; COMMIT",
        "BEGIN; SAVEPOINT a; INSERT INTO s VALUES (5, 'subxact only'); RELEASE a; COMMIT",
        "BEGIN; INSERT INTO s VALUES (6, 'aborted'); ROLLBACK",
    ),
)


def interleaved(pg: Database) -> None:
    """Two sessions whose changes interleave; decoded in commit order."""
    with pg.connect() as first, pg.connect() as second:
        first.execute("BEGIN")
        second.execute("BEGIN")
        first.execute("INSERT INTO s VALUES (1, 'first')")
        second.execute("INSERT INTO s VALUES (2, 'second')")
        first.execute("INSERT INTO s VALUES (3, 'first')")
        second.execute("COMMIT")
        first.execute("COMMIT")


INTERLEAVED = Workload(f"CREATE TABLE s (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};", interleaved)

DDL = Workload(
    f"CREATE TABLE d (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};",
    script(
        "INSERT INTO d VALUES (1, 'a')",
        "ALTER TABLE d ADD COLUMN extra numeric DEFAULT 1.50",
        "INSERT INTO d VALUES (2, 'b', 2)",
        "ALTER TABLE d DROP COLUMN v",
        "INSERT INTO d VALUES (3, 3); UPDATE d SET extra = extra + 1",
        "ALTER TABLE d ALTER COLUMN extra TYPE text",
        "INSERT INTO d VALUES (4, 'four')",
        f"CREATE TABLE d2 (id int) {NO_AUTOVACUUM}; INSERT INTO d2 VALUES (1)",
        "CREATE TEMP TABLE tmp (id int); INSERT INTO tmp VALUES (1)",
        "ALTER TABLE d RENAME TO d_renamed; INSERT INTO d_renamed VALUES (5, 'five')",
    ),
    empty_xacts=True,
)


def origin_workload(origin: str) -> Workload:
    """A local transaction, one from replication origin `origin`, another local one. The
    origin is created in the setup: that catalog write would be an empty transaction."""

    def run(pg: Database) -> None:
        pg.execute("INSERT INTO o VALUES (1)")
        with pg.connect() as conn:
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
            conn.execute("INSERT INTO o VALUES (2)")
            conn.execute("SELECT pg_replication_origin_session_reset()")
        pg.execute("INSERT INTO o VALUES (3)")

    setup = (
        f"CREATE TABLE o (id int PRIMARY KEY) {NO_AUTOVACUUM};"
        f"SELECT pg_replication_origin_create('{origin}')"
    )
    return Workload(setup, run)


STREAM_SETUP = f"CREATE TABLE big (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};"
ROWS = "INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series({}, {}) g;"

STREAMED = Workload(
    STREAM_SETUP,
    script(
        # streamed, with a subtransaction rolled back after its changes were streamed
        "BEGIN;"
        + ROWS.format(1, 1500)
        + "SAVEPOINT a;"
        + ROWS.format(5001, 6500)
        + "ROLLBACK TO a;"
        "SELECT pg_logical_emit_message(true, 'mid', 'stream');"
        "SELECT pg_logical_emit_message(false, 'mid', 'not transactional');"
        + ROWS.format(1501, 3000)
        + "TRUNCATE big;"
        + ROWS.format(1, 100)
        + "COMMIT",
        # small: not streamed
        "INSERT INTO big VALUES (9000, 'small')",
        # streamed, then aborted as a whole
        "BEGIN;" + ROWS.format(10001, 12500) + "ROLLBACK",
    ),
    work_mem="64kB",
)

TWO_PHASE_STEPS = (
    "BEGIN; INSERT INTO p VALUES (1); PREPARE TRANSACTION 'g1'",
    "COMMIT PREPARED 'g1'",
    "BEGIN; INSERT INTO p VALUES (2); PREPARE TRANSACTION 'g2_nodecode'",
    "COMMIT PREPARED 'g2_nodecode'",
    "BEGIN; INSERT INTO p VALUES (3); PREPARE TRANSACTION 'it''s a \\gid'",
    "INSERT INTO p VALUES (4)",
    "ROLLBACK PREPARED 'it''s a \\gid'",
    "BEGIN; INSERT INTO p VALUES (5); PREPARE TRANSACTION 'g4_nodecode'",
    "ROLLBACK PREPARED 'g4_nodecode'",
    "BEGIN; SELECT pg_logical_emit_message(true, 'p', 'prepared');"
    "TRUNCATE p; INSERT INTO p VALUES (6); PREPARE TRANSACTION 'g5'",
    "COMMIT PREPARED 'g5'",
)
TWO_PHASE_SETUP = f"CREATE TABLE p (id int PRIMARY KEY) {NO_AUTOVACUUM};"

TWO_PHASE = Workload(TWO_PHASE_SETUP, script(*TWO_PHASE_STEPS), two_phase=True)
#: The same on a slot without two-phase: everything is decoded at COMMIT PREPARED.
PREPARED_ON_PLAIN_SLOT = Workload(TWO_PHASE_SETUP, script(*TWO_PHASE_STEPS))

STREAMED_TWO_PHASE = Workload(
    STREAM_SETUP,
    script(
        "BEGIN;" + ROWS.format(1, 2000) + "PREPARE TRANSACTION 'big1'",
        "COMMIT PREPARED 'big1'",
        "BEGIN;" + ROWS.format(3001, 5000) + "PREPARE TRANSACTION 'big2'",
        "ROLLBACK PREPARED 'big2'",
    ),
    two_phase=True,
    work_mem="64kB",
)

WORKLOADS = {
    "types": TYPES,
    "identity": IDENTITY,
    "toast": TOAST,
    "truncate": TRUNCATE,
    "messages": MESSAGES,
    "savepoints": SAVEPOINTS,
    "interleaved": INTERLEAVED,
    "ddl": DDL,
    "two_phase": TWO_PHASE,
    "prepared_plain_slot": PREPARED_ON_PLAIN_SLOT,
}

OPTION_SETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "xids0-skip": {"include-xids": "0", "skip-empty-xacts": "1"},
    "ts-skip": {"include-timestamp": "1", "skip-empty-xacts": "on"},
    "xids-ts": {"include-xids": "true", "include-timestamp": "yes"},
    "binary-skip": {"force-binary": "1", "skip-empty-xacts": "1", "include-xids": "f"},
}


def _cases() -> Iterator[Any]:
    for name, workload in WORKLOADS.items():
        for options_id, options in OPTION_SETS.items():
            if workload.empty_xacts and options.get("skip-empty-xacts") is None:
                continue
            yield pytest.param(workload, options, id=f"{name}-{options_id}")


def assert_same(outputs: Outputs) -> None:
    assert outputs.server, "the oracle wrote nothing: the workload decoded to nothing"
    assert outputs.pgcdc == outputs.server


@pytest.mark.parametrize(("workload", "options"), list(_cases()))
def test_same_output(pg: Database, workload: Workload, options: dict[str, str]) -> None:
    assert_same(compare(pg, workload, options))


STREAM_OPTIONS = {
    "stream": {"stream-changes": "1"},
    "stream-xids0-skip": {"stream-changes": "1", "include-xids": "0", "skip-empty-xacts": "1"},
    "stream-ts-skip": {"stream-changes": "1", "include-timestamp": "1", "skip-empty-xacts": "1"},
    "no-stream": {"stream-changes": "0", "include-xids": "0"},
}


@pytest.mark.parametrize("options", STREAM_OPTIONS.values(), ids=STREAM_OPTIONS.keys())
def test_streamed_transactions(pg: Database, options: dict[str, str]) -> None:
    outputs = compare(pg, STREAMED, options)
    assert_same(outputs)
    streamed = any(line.startswith("opening a streamed block") for line in outputs.server)
    assert streamed == (options["stream-changes"] == "1"), "the oracle did not stream"


@pytest.mark.parametrize(
    "options",
    [{"stream-changes": "1"}, {"stream-changes": "1", "skip-empty-xacts": "1"}, {}],
    ids=["stream", "stream-skip", "no-stream"],
)
def test_streamed_prepared_transactions(pg: Database, options: dict[str, str]) -> None:
    assert_same(compare(pg, STREAMED_TWO_PHASE, options))


@pytest.mark.parametrize(
    "options",
    [{"only-local": "1"}, {"only-local": "0"}, {"only-local": "1", "skip-empty-xacts": "1"}],
    ids=["local", "all", "local-skip"],
)
def test_only_local(pg: Database, options: dict[str, str]) -> None:
    origin = unique("origin")  # origins are cluster-wide
    try:
        outputs = compare(pg, origin_workload(origin), options)
    finally:
        pg.execute(
            "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
            "WHERE roname = %s",
            (origin,),
        )
    assert_same(outputs)
    origin_lines = [line for line in outputs.server if "id[integer]:2" in line]
    assert bool(origin_lines) == (options["only-local"] == "0")


# -- options: the same errors as the server --------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"include-xids": "maybe"},
        {"two-phase-commit": "1"},
        {"skip-empty-xacts": "1", "nonsense": "x"},
        {"stream-changes": "2"},
        {"include-timestamp": "of", "include-xids": "nah", "whatever": "1"},
        {"skip-empty-xacts": " 1"},
        {"include-xids": "o"},
    ],
    ids=[
        "bad-bool",
        "two-phase-commit",
        "unknown",
        "bad-stream",
        "first-error-wins",
        "bool-with-space",
        "bool-o",
    ],
)
def test_option_errors(pg: Database, options: dict[str, str]) -> None:
    slot = unique("td")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    args = [item for pair in options.items() for item in pair]
    with pytest.raises(psycopg.Error) as server_error:
        pg.execute(
            "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, VARIADIC %s::text[])",
            (slot, args),
        )
    assert server_error.value.diag.message_primary is not None
    ctx = DecodingContext(options=dict(options), server_version=150000)
    with pytest.raises(PluginOptionError) as ours:
        TestDecoding().startup(ctx, OutputPluginOptions(), False)
    assert str(ours.value) == server_error.value.diag.message_primary


# -- unit tests with hand-written expectations -----------------------------------------------


def test_option_values_without_argument() -> None:
    """``-o include-xids`` means true; a bare stream-changes/force-binary changes nothing."""
    ctx = DecodingContext(
        options={"include-xids": None, "stream-changes": None, "force-binary": None},
        streaming=True,
        server_version=150000,
    )
    options = OutputPluginOptions()
    TestDecoding().startup(ctx, options, False)
    assert ctx.output_plugin_private.include_xids is True
    assert ctx.streaming is False
    assert options.output_type.value == "textual"


def test_literals() -> None:
    assert print_literal(23, "-5") == "-5"
    assert print_literal(701, "NaN") == "NaN"
    assert print_literal(1562, "101") == "B'101'"
    assert print_literal(16, "t") == "true" and print_literal(16, "f") == "false"
    assert print_literal(25, "it's \\ ok") == "'it''s \\ ok'"
    assert quote_literal("g1") == "'g1'"
    assert quote_literal("it's \\x") == "E'it''s \\\\x'"


def test_timestamps() -> None:
    assert timestamptz_to_str(0) == "2000-01-01 00:00:00+00"
    assert timestamptz_to_str(1_500_000) == "2000-01-01 00:00:01.5+00"
    assert timestamptz_to_str(-1) == "1999-12-31 23:59:59.999999+00"
    assert timestamptz_to_str(2**63 - 1) == "infinity"


# -- what pgoutput cannot carry, pinned down -------------------------------------------------


def transactions(lines: list[str]) -> list[list[str]]:
    """Lines grouped into BEGIN ... COMMIT blocks (include-xids on, no messages)."""
    blocks: list[list[str]] = []
    for line in lines:
        if line.startswith("BEGIN"):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def without_empty(lines: list[str]) -> list[str]:
    return [line for block in transactions(lines) if len(block) > 2 for line in block]


def without_rewrites(lines: list[str]) -> list[str]:
    """Without the transaction of ALTER TYPE, whose rewrite re-inserts rows 1 and 2."""
    rewritten = "table public.rw: INSERT: id[integer]:1 v[bigint]:1"
    return [line for block in transactions(lines) if rewritten not in block for line in block]


GENERATED = re.compile(r" g\[integer\]:\S+")

KNOWN_DIFFERENCES = {
    # pgoutput (15+) never sends transactions without published changes
    "empty-xacts": (DDL, {}, without_empty),
    # pgoutput before 18 leaves out generated columns (18 only with publish_generated_columns)
    "generated-column": (
        Workload(
            f"CREATE TABLE gen (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id * 2) STORED) "
            f"{NO_AUTOVACUUM};",
            script("INSERT INTO gen VALUES (1)", "UPDATE gen SET id = 2"),
        ),
        {},
        lambda lines: [GENERATED.sub("", line) for line in lines],
    ),
    # the changes of a table rewrite are never published
    "include-rewrites": (
        Workload(
            f"CREATE TABLE rw (id int PRIMARY KEY, v int) {NO_AUTOVACUUM};",
            script(
                "INSERT INTO rw VALUES (1, 1), (2, 2)",
                "ALTER TABLE rw ALTER COLUMN v TYPE bigint",
                "INSERT INTO rw VALUES (3, 3)",
            ),
        ),
        {"include-rewrites": "1", "skip-empty-xacts": "1"},
        without_rewrites,
    ),
}


@pytest.mark.parametrize(
    ("workload", "options", "expected"), KNOWN_DIFFERENCES.values(), ids=KNOWN_DIFFERENCES.keys()
)
def test_known_differences(
    pg: Database,
    workload: Workload,
    options: dict[str, str],
    expected: Callable[[list[str]], list[str]],
) -> None:
    """Cases pgoutput cannot match: the server's lines minus exactly what pgoutput lacks."""
    outputs = compare(pg, workload, options)
    assert outputs.pgcdc != outputs.server
    assert outputs.pgcdc == expected(outputs.server)


FILTERED_STREAMED_PREPARE = Workload(
    STREAM_SETUP,
    script(
        "BEGIN;" + ROWS.format(1, 700) + "PREPARE TRANSACTION 'rolled_nodecode'",
        "ROLLBACK PREPARED 'rolled_nodecode'",
        "BEGIN;" + ROWS.format(1, 700) + "PREPARE TRANSACTION 'committed_nodecode'",
        "COMMIT PREPARED 'committed_nodecode'",
    ),
    two_phase=True,
    work_mem="64kB",
)


def test_filtered_prepare_of_a_streamed_transaction(pg: Database) -> None:
    assert_same(compare(pg, FILTERED_STREAMED_PREPARE, {"stream-changes": "1"}))


def test_a_type_made_by_a_transaction_not_visible_yet(pg_one: Database) -> None:
    """The walsender sends a transaction before other sessions see it (its commit held back
    here by a synchronous standby that never comes): the name of a type it created is read
    once it is visible (format_type said '???' before)."""
    import threading

    pg = pg_one
    pg.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    slot = unique("pgo")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    lines: list[str] = []
    runner = PluginRunner(
        pg.dsn,
        slot,
        "test_decoding",
        StreamOptions(("pub",)),
        sink=lambda write: lines.append(write.data.decode()),
        until_idle=True,
    )
    made = (
        "CREATE TYPE mood AS ENUM ('ok'); CREATE TABLE t (id int, m mood);"
        "INSERT INTO t VALUES (1, 'ok')"
    )
    with commits_held_back(pg, made):
        running = threading.Thread(target=runner.run)
        running.start()
        wait_for(lambda: lines, timeout=30, what="the transaction's BEGIN")
        time.sleep(2)
    running.join(60)
    assert "table public.t: INSERT: id[integer]:1 m[mood]:'ok'" in lines, lines
