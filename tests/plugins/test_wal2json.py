"""pgcdc's Wal2Json against the server's wal2json (2.5, Debian's postgresql-15-wal2json).

Each workload runs on a fresh database with a publication FOR ALL TABLES and two slots that
start at the same point: a pgoutput slot and a wal2json copy of it. Both are only peeked, so
one workload is compared under many option sets: the server plugin's rows
(``pg_logical_slot_peek_binary_changes`` in a session with the settings pgcdc pins in its
walsender session; ``pg_recvlogical`` for options without a value) are the oracle, pgcdc's
writes (PluginRunner on the pgoutput slot, not acknowledging) the candidate. Writes are
compared one for one: parsed where they are whole JSON documents, and as exact bytes always.
The database's own session defaults (`OTHER_DEFAULTS`: time zone, DateStyle, IntervalStyle,
extra_float_digits, bytea_output) differ from the settings pgcdc pins, so anything pgcdc prints
in a session of its own without pinning them shows.

Only PostgreSQL 15 has wal2json here; the comparisons skip elsewhere. What pgoutput cannot show
(see the plugin's docstring) is kept out: tables are created before the slots, with autovacuum
off and the catalogs analyzed, so that no empty transaction lands in the compared range. The
unit tests at the end feed hand-made changes and hand-built pgoutput bytes, and run everywhere.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.decoding import (
    Change,
    ChangeAction,
    DecodingContext,
    OutputPluginOptions,
    OutputWrite,
    PluginRunner,
    Transaction,
    TransactionAssembler,
    Truncation,
    parse_bool_option,
)
from pgcdc.embedded import Database
from pgcdc.errors import PluginError, PluginOptionError
from pgcdc.plugins.pgtext import timestamptz_to_str
from pgcdc.plugins.wal2json import (
    SelectTable,
    Wal2Json,
    parse_select_tables,
    split_list,
)
from pgcdc.protocol import Column, Decoder, Lsn, Relation, TupleData
from pgcdc.replication import DEFAULT_SESSION_SETTINGS, StreamOptions
from replication.helpers import run_cli, unique

NO_AUTOVACUUM = "WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
#: A value TOASTed out of line: hex digits do not compress.
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series({0}, {0} + 99) g)"

Options = dict[str, str | None]
#: Session defaults of the compared databases, none of them the value pgcdc pins.
OTHER_DEFAULTS = {
    "TimeZone": "Asia/Kolkata",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "0",
    "bytea_output": "escape",
}


# -- the oracle and the candidate ------------------------------------------------------------

_has_wal2json: dict[str, bool] = {}


def require_wal2json(pg: Database) -> None:
    """Skip unless this server's package library directory holds wal2json.so."""
    key = pg.server.dsn
    if key not in _has_wal2json:
        rows = pg.execute(
            "SELECT (pg_stat_file(setting || '/wal2json.so', true)).size IS NOT NULL "
            "FROM pg_config WHERE name = 'PKGLIBDIR'"
        )
        _has_wal2json[key] = bool(rows and rows[0][0])
    if not _has_wal2json[key]:
        pytest.skip(
            f"PostgreSQL {pg.version} has no wal2json.so (only Debian's postgresql-15 with "
            "postgresql-15-wal2json has it here): no oracle to compare with"
        )


@dataclass(frozen=True)
class Workload:
    """Tables created before the slots (`setup`), then the changes to decode (`run`)."""

    setup: str
    run: Callable[[Database], None]


def server_rows(pg: Database, slot: str, options: Options) -> list[bytes]:
    """wal2json's rows with the walsender's pinned settings, as bytes; the slot stays put.
    Over SQL (the binary variant takes textual plugins too), or through a walsender
    (`walsender_rows`) when an option has no value, which only the replication protocol
    can say."""
    if None in options.values():
        return walsender_rows(pg, slot, options)
    args = [item for pair in options.items() for item in pair]
    with pg.connect() as conn:
        for name, value in PINNED.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "VARIADIC %s::text[])",
            (slot, args),
        ).fetchall()
    return [bytes(row[0]) for row in rows]


#: The settings pgcdc pins in its walsender session, but the client encoding (UTF8 anyway).
PINNED = {k: v for k, v in DEFAULT_SESSION_SETTINGS.items() if k != "client_encoding"}


class ServerRefused(Exception):
    """The server refused to start decoding; the message is its error's primary text."""


def walsender_rows(pg: Database, slot: str, options: Options) -> list[bytes]:
    """wal2json's rows through a walsender session with the pinned settings: the server's
    ``pg_recvlogical`` on a copy of `slot`, up to the current WAL position, one line a row
    (so no pretty-print). Raises `ServerRefused` with the server's message."""
    assert options.get("pretty-print") in (None, "0"), "rows are told apart by newlines"
    copy = unique("w2jw")
    pg.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slot, copy))
    try:
        end = pg.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        escaped = {k: v.replace(" ", "\\ ") for k, v in PINNED.items()}  # ("ISO, YMD")
        settings = " ".join(f"-c {k}={v}" for k, v in escaped.items())
        command = [str(pg.server.bindir / "pg_recvlogical"), "-d", pg.dsn_for(options=settings)]
        command += ["-S", copy, "--start", "-E", end, "--no-loop", "-f", "-"]
        for name, value in options.items():
            command += ["-o", name if value is None else f"{name}={value}"]
        result = subprocess.run(command, capture_output=True, timeout=60, check=False)
    finally:
        pg.execute("SELECT pg_drop_replication_slot(%s)", (copy,))
    if result.returncode != 0:
        error = re.search(rb"ERROR:  (.*)", result.stderr)
        assert error is not None, result.stderr
        raise ServerRefused(error.group(1).decode())
    return result.stdout.split(b"\n")[:-1]


def pgcdc_rows(pg: Database, slot: str, options: Options) -> list[bytes]:
    writes: list[bytes] = []
    runner = PluginRunner(
        pg.dsn,
        slot,
        "wal2json",
        StreamOptions(("pub",)),
        plugin_options=dict(options),
        sink=lambda write: writes.append(write.data),
        until_idle=True,
        acknowledge=False,
    )
    runner.run()
    return writes


def other_session_defaults(pg: Database) -> None:
    """Give `pg`'s database `OTHER_DEFAULTS` (for the connections opened from now on)."""
    for name, value in OTHER_DEFAULTS.items():
        pg.execute(f"ALTER DATABASE \"{pg.dbname}\" SET {name} = '{value}'")


def analyze_catalogs(pg: Database) -> None:
    """Leave autovacuum no catalog to analyze while a test compares: it analyzes one (a
    shared one such as pg_database, after many test databases came and went) in whatever
    database it visits, and the server's plugin shows that transaction (a catalog change)
    as an empty one, which pgoutput does not send."""
    pg.execute("ANALYZE")


def prepare(pg: Database, workload: Workload) -> tuple[str, str]:
    """Tables, publication, the pgoutput slot and its wal2json copy; then the workload."""
    require_wal2json(pg)
    other_session_defaults(pg)
    pg.execute(workload.setup)
    analyze_catalogs(pg)
    pg.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    source, oracle = unique("pgo"), unique("w2j")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source,))
    pg.execute(
        "SELECT pg_copy_logical_replication_slot(%s, %s, false, 'wal2json')", (source, oracle)
    )
    workload.run(pg)
    return source, oracle


def assert_same(pg: Database, slots: tuple[str, str], options: Options) -> list[bytes]:
    """Equal writes: as JSON where each is a document, and as bytes; the server's rows."""
    source, oracle = slots
    expected = server_rows(pg, oracle, options)
    got = pgcdc_rows(pg, source, options)
    assert expected, f"the workload produced no output under {options}"
    parsed = _documents(expected)
    if parsed is not None:
        assert _documents(got) == parsed, options
    assert got == expected, options
    return expected


def _documents(rows: list[bytes]) -> list[Any] | None:
    """The rows as JSON, or None where they are not documents: v1's write-in-chunks pieces,
    defaults with double quotes (wal2json writes default expressions unescaped), v1's comma
    quirk, content that is not UTF-8."""
    try:
        return [json.loads(r) for r in rows]
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None


def check_all(pg: Database, workload: Workload, option_sets: list[Options]) -> None:
    slots = prepare(pg, workload)
    for options in option_sets:
        assert_same(pg, slots, options)


V2: Options = {"format-version": "2"}
V1: Options = {"format-version": "1"}
EVERYTHING = {
    "include-xids": "1",
    "include-timestamp": "1",
    "include-lsn": "1",
    "include-type-oids": "1",
    "include-pk": "1",
    "include-not-null": "1",
    "include-default": "1",
    "include-column-positions": "1",
    "include-domain-data-type": "1",
    "include-origin": "1",
}


# -- workloads ---------------------------------------------------------------------------------

TYPES_SETUP = f"""
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN shortname AS varchar(8);
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE "Quoted Mood" AS ENUM ('x');
CREATE SCHEMA elsewhere;
CREATE TYPE elsewhere.color AS ENUM ('red');
CREATE TABLE typed (
    id int PRIMARY KEY, gone text, seq serial, col elsewhere.color DEFAULT 'red',
    i2 int2, i8 int8 NOT NULL DEFAULT 42, o oid, n numeric(10,3), nn numeric,
    f4 float4, f8 float8, b bool, t text DEFAULT 'it''s', vc varchar(5), c char(3), bc bpchar,
    by bytea, d date, tm time(3), ts timestamp, tz timestamptz, iv interval, u uuid,
    j json, jb jsonb, a int[], ta text[], p posint, sn shortname, m mood, qm "Quoted Mood",
    qma "Quoted Mood"[], mo money, bits bit varying(8), "Odd ""Name"" x" text,
    "ünï" text DEFAULT now()::text, ch "char" DEFAULT 'c'
) {NO_AUTOVACUUM};
ALTER TABLE typed DROP COLUMN gone;
"""


def types_run(pg: Database) -> None:
    pg.execute(
        r"""INSERT INTO typed (id, i2, i8, o, n, nn, f4, f8, b, t, vc, c, bc, by, d, tm, ts, tz,
            iv, u, j, jb, a, ta, p, sn, m, qm, qma, mo, bits, "Odd ""Name"" x") VALUES
        (1, -32768, 9223372036854775807, 4294967295, 1234567.125, 'NaN', 'Infinity', '-Infinity',
         true, E'quote " backslash \\ tab \t nl \n cr \r bell \x07 é ü 😀', 'abc', 'ab', 'xyz',
         '\x00ff10', '2024-02-29', '12:34:56.789', '2024-01-02 03:04:05.123456',
         '2024-06-30 23:59:59.5+02', '1 year 2 mons 3 days 04:05:06.7', gen_random_uuid(),
         '{"k": [1, "two", null]}', '{"b": 2, "a": 1}', '{1,NULL,3}', '{"a b","c\"d"}', 7,
         'eight ch', 'happy', 'x', '{x,x}', 12.5, B'1011', 'odd'),
        (2, NULL, 1, NULL, NULL, '-0.0005', 'NaN', '1e-300', false, '', NULL, NULL, NULL, '\x',
         'infinity', NULL, '-infinity', 'infinity', '-1 day', NULL, 'null', '[]', '{}', '{}',
         NULL, NULL, 'sad', NULL, NULL, NULL, NULL, NULL),
        (3, 1, 2, 3, 0, 1e20, 1.5e-7, 0.1, NULL, 'x', 'y', 'z', 'w', NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
        """
    )
    pg.execute("UPDATE typed SET t = t || '!', f8 = 'NaN', n = n + 1 WHERE id <= 2")
    pg.execute("UPDATE typed SET id = 30 WHERE id = 3")
    pg.execute("DELETE FROM typed WHERE id = 2")


TYPES = Workload(TYPES_SETUP, types_run)


def test_types_v2(pg: Database) -> None:
    """Values typed as wal2json types them, type names, typmods, domains, v2 options."""
    check_all(
        pg,
        TYPES,
        [
            V2,
            {**V2, **EVERYTHING},
            {**V2, **EVERYTHING, "include-domain-data-type": "0", "include-typmod": "0"},
            {**V2, "include-types": "0", "include-schemas": "0", "include-transaction": "0"},
            {**V2, "pretty-print": "1", "write-in-chunks": "1"},  # no effect in v2
        ],
    )


def test_types_v1(pg: Database) -> None:
    """v1's one document per transaction, compact, pretty and in chunks."""
    check_all(
        pg,
        TYPES,
        [
            {},  # format-version 1 is the default
            {**V1, **EVERYTHING},
            {**V1, **EVERYTHING, "include-typmod": "0", "pretty-print": "1"},
            {**V1, "include-types": "0", "include-not-null": "1", "include-schemas": "0"},
            {**V1, "include-domain-data-type": "1", "include-typmod": "0", "include-pk": "1"},
            {**V1, **EVERYTHING, "write-in-chunks": "1"},
            {**V1, "write-in-chunks": "1", "pretty-print": "1", "include-xids": "1"},
        ],
    )


IDENTITY_SETUP = f"""
CREATE TABLE pk (id int PRIMARY KEY, v text, big text) {NO_AUTOVACUUM};
ALTER TABLE pk ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE composite (a int, b text, v int, PRIMARY KEY (b, a)) {NO_AUTOVACUUM};
CREATE TABLE full_nopk (a int, b text, big text) {NO_AUTOVACUUM};
ALTER TABLE full_nopk REPLICA IDENTITY FULL;
ALTER TABLE full_nopk ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_pk (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};
ALTER TABLE full_pk REPLICA IDENTITY FULL;
CREATE TABLE by_index (id int PRIMARY KEY, code text NOT NULL, v text) {NO_AUTOVACUUM};
CREATE UNIQUE INDEX by_index_code ON by_index (code);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_code;
CREATE TABLE nopk (a int, b text) {NO_AUTOVACUUM};
CREATE TYPE "Key Type" AS ENUM ('k1', 'k2');
CREATE TABLE quoted_pk (k "Key Type" PRIMARY KEY, v int) {NO_AUTOVACUUM};
"""


def identity_run(pg: Database) -> None:
    pg.execute(f"INSERT INTO pk VALUES (1, 'a', {BIG.format(1)}), (2, 'b', NULL)")
    pg.execute("UPDATE pk SET v = 'a2' WHERE id = 1")  # big: unchanged TOAST
    pg.execute("UPDATE pk SET id = 10, v = 'moved' WHERE id = 1")  # key change, TOAST again
    pg.execute("DELETE FROM pk WHERE id = 2")
    pg.execute("INSERT INTO composite VALUES (1, 'x', 1), (2, 'y', 2)")
    pg.execute("UPDATE composite SET v = 5")
    pg.execute("UPDATE composite SET a = 3 WHERE b = 'y'")
    pg.execute("DELETE FROM composite WHERE a = 1")
    pg.execute(f"INSERT INTO full_nopk VALUES (1, NULL, {BIG.format(7)}), (2, 'two', 'small')")
    pg.execute("UPDATE full_nopk SET a = a + 100")
    pg.execute("DELETE FROM full_nopk WHERE b IS NULL")
    pg.execute("INSERT INTO full_pk VALUES (1, NULL), (2, 'b')")
    pg.execute("UPDATE full_pk SET v = 'c' WHERE id = 1")
    pg.execute("DELETE FROM full_pk WHERE id = 2")
    pg.execute("INSERT INTO by_index VALUES (1, 'c1', 'v'), (2, 'c2', NULL)")
    pg.execute("UPDATE by_index SET v = 'w' WHERE id = 1")  # identity from the new row
    pg.execute("UPDATE by_index SET code = 'c3' WHERE id = 2")  # old key sent
    pg.execute("DELETE FROM by_index WHERE id = 1")
    pg.execute("INSERT INTO nopk VALUES (1, 'no key'), (NULL, NULL)")
    pg.execute("INSERT INTO quoted_pk VALUES ('k1', 1)")
    pg.execute("UPDATE quoted_pk SET k = 'k2'")
    pg.execute("DELETE FROM quoted_pk")


IDENTITY = Workload(IDENTITY_SETUP, identity_run)


def test_replica_identities(pg: Database) -> None:
    """identity/oldkeys and pk for DEFAULT, FULL, USING INDEX, key changes, unchanged TOAST."""
    check_all(
        pg,
        IDENTITY,
        [
            V2,
            {**V2, "include-pk": "1", "include-xids": "1", "include-lsn": "1"},
            {**V2, "include-pk": "1", "include-types": "0", "include-not-null": "1"},
            V1,
            {**V1, "include-pk": "1", "pretty-print": "1", "include-type-oids": "1"},
            {**V1, "include-pk": "1", "include-types": "0", "write-in-chunks": "1"},
        ],
    )


MESSAGES_SETUP = f"""
CREATE TABLE t1 (id int PRIMARY KEY, v text) {NO_AUTOVACUUM};
CREATE TABLE t2 (id int PRIMARY KEY) {NO_AUTOVACUUM};
"""


def messages_run(pg: Database) -> None:
    pg.execute("INSERT INTO t1 VALUES (1, 'a'), (2, 'b')")
    pg.execute("INSERT INTO t2 VALUES (1)")
    with pg.connect() as conn:
        with conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, 'app', 'in \"txn\" é')")
            conn.execute("INSERT INTO t1 VALUES (3, 'c')")
            conn.execute("SELECT pg_logical_emit_message(false, 'side', 'right away')")
            conn.execute("SELECT pg_logical_emit_message(true, 'other', E'two\\nlines')")
            conn.execute("SELECT pg_logical_emit_message(true, 'bin', '\\x6100ff'::bytea)")
        conn.execute("SELECT pg_logical_emit_message(true, 'app', 'alone')")
        conn.execute("SELECT pg_logical_emit_message(false, 'app', '')")
    # v1's counter outlives a transaction of two changes: the next messages get a comma
    pg.execute("INSERT INTO t1 VALUES (20, 'x'), (21, 'y')")
    pg.execute("SELECT pg_logical_emit_message(false, 'side', 'after two')")
    # content that is not UTF-8 goes out as its bytes
    pg.execute(r"SELECT pg_logical_emit_message(false, 'bin', '\xff41'::bytea)")
    with pg.connect() as conn, conn.transaction():
        conn.execute(r"SELECT pg_logical_emit_message(true, 'bin', '\x41e9ff22c3'::bytea)")
        conn.execute("INSERT INTO t2 VALUES (3001)")
        conn.execute(r"SELECT pg_logical_emit_message(true, 'app', '\xc3a9c328'::bytea)")
    pg.execute("SELECT pg_logical_emit_message(false, 'side', 'after three')")
    pg.execute(
        "BEGIN; INSERT INTO t1 VALUES (10, 'kept'); SAVEPOINT s; INSERT INTO t1 VALUES (11, 'no');"
        "ROLLBACK TO s; INSERT INTO t1 VALUES (12, 'kept too'); COMMIT"
    )
    pg.execute("INSERT INTO t2 SELECT generate_series(2, 3000)")
    pg.execute("TRUNCATE t1, t2")
    pg.execute("INSERT INTO t1 VALUES (4, 'after')")
    pg.execute("UPDATE t1 SET v = 'upd'")
    pg.execute("DELETE FROM t1")


MESSAGES = Workload(MESSAGES_SETUP, messages_run)


def test_truncate_messages_actions(pg: Database) -> None:
    """TRUNCATE (v2 only), logical messages and their prefixes, actions, held LSN writes."""
    check_all(
        pg,
        MESSAGES,
        [
            V2,
            {**V2, "include-xids": "1", "include-timestamp": "1", "include-lsn": "1"},
            {**V2, "include-lsn": "1", "include-transaction": "0", "include-origin": "1"},
            {**V2, "actions": "insert, truncate", "filter-msg-prefixes": "side,bin"},
            {**V2, "actions": "update,delete", "add-msg-prefixes": "app"},
            V1,
            {**V1, "pretty-print": "1", "include-xids": "1", "include-lsn": "1"},
            {**V1, "write-in-chunks": "1", "include-lsn": "1", "add-msg-prefixes": "side"},
            {**V1, "actions": "delete", "filter-msg-prefixes": "app"},
        ],
    )


DEFAULTS_SETUP = f"""
CREATE TABLE defaults (
    id int PRIMARY KEY, at timestamptz DEFAULT now(), today date DEFAULT CURRENT_DATE,
    fixed timestamptz DEFAULT '2024-01-01 12:00:00.25+02',
    wall timestamp DEFAULT '2024-03-01 04:05', day date DEFAULT '2024-03-01',
    span interval DEFAULT '1 day 02:03:04.5',
    f8 float8 DEFAULT '0.30000000000000004', f4 float4 DEFAULT '1.0000001',
    raw bytea DEFAULT '\\x0102', n numeric DEFAULT 1.50, arr int[] DEFAULT '{{1,2}}',
    r tstzrange DEFAULT tstzrange('2024-01-01 00:00+00', NULL), t text DEFAULT 'plain',
    plain_default int DEFAULT 7, nothing text
) {NO_AUTOVACUUM};
"""


def defaults_run(pg: Database) -> None:
    pg.execute("INSERT INTO defaults (id) VALUES (1), (2)")
    pg.execute("UPDATE defaults SET t = 'changed', span = '-3 mons' WHERE id = 1")
    pg.execute("DELETE FROM defaults WHERE id = 2")


def test_defaults_print_as_the_walsender_session_would(pg: Database) -> None:
    """include-default: each default as ``pg_get_expr`` prints it under the settings pgcdc
    pins (UTC, ISO, postgres intervals, extra_float_digits 3, hex bytea), on a database whose
    own session defaults are other ones (`OTHER_DEFAULTS`); the values too."""
    check_all(
        pg,
        Workload(DEFAULTS_SETUP, defaults_run),
        [
            {**V1, "include-default": "1"},
            {**V1, "include-default": "1", "pretty-print": "1", "include-types": "0"},
            {**V1, "include-default": "1", "write-in-chunks": "1", "include-not-null": "1"},
            {**V2, "include-default": "1"},
            {**V2, "include-default": "1", "include-pk": "1", "include-column-positions": "1"},
        ],
    )


TABLES_SETUP = f"""
CREATE SCHEMA s1;
CREATE SCHEMA "*";
CREATE TABLE public.t (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE public.u (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE s1.t (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE s1."a.b" (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE s1."my table" (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE s1."*" (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE "*".t (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE s1."Ünï Täble" (id int PRIMARY KEY) {NO_AUTOVACUUM};
CREATE TABLE parted (id int PRIMARY KEY, k int) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100) {NO_AUTOVACUUM};
"""


def tables_run(pg: Database) -> None:
    for table in (
        "public.t",
        "public.u",
        "s1.t",
        's1."a.b"',
        's1."my table"',
        's1."*"',
        '"*".t',
        's1."Ünï Täble"',
        "parted",
    ):
        pg.execute(f"INSERT INTO {table} VALUES (1)")
    pg.execute('BEGIN; UPDATE public.t SET id = 2; UPDATE s1."a.b" SET id = 2; COMMIT')
    pg.execute('TRUNCATE public.u, s1."my table", "*".t')


def test_filter_and_add_tables(pg: Database) -> None:
    """filter-tables/add-tables with wildcards, escapes, whitespace, and an empty list."""
    check_all(
        pg,
        Workload(TABLES_SETUP, tables_run),
        [
            {**V2, "filter-tables": "*.t"},
            {**V2, "filter-tables": r"s1.a\.b, s1.my\ table ,  public.u"},
            {**V2, "add-tables": "s1.*"},
            {**V2, "add-tables": r"s1.\*, \*.t"},
            {**V2, "add-tables": "*.*", "filter-tables": r"s1.\*"},
            {**V2, "add-tables": "public.t,s1.*", "filter-tables": r"s1.a\.b"},
            {**V2, "add-tables": ""},
            {**V2, "add-tables": "public.parted_1, s1.Ünï\\ Täble"},
            {**V1, "filter-tables": "*.t,s1.*"},
            {**V1, "add-tables": r"s1.a\.b", "pretty-print": "1"},
        ],
    )


def origin_run(pg: Database) -> None:
    pg.execute("INSERT INTO t1 VALUES (1, 'local')")
    with pg.connect() as conn:
        conn.execute("SELECT pg_replication_origin_session_setup('w2j_origin')")
        conn.execute("INSERT INTO t1 VALUES (2, 'replicated')")
        conn.execute("SELECT pg_replication_origin_session_reset()")
    pg.execute("INSERT INTO t1 VALUES (3, 'local again')")


def test_origins(pg: Database) -> None:
    """include-origin prints the origin's id; filter-origins drops its transactions."""
    require_wal2json(pg)
    ident = pg.execute("SELECT pg_replication_origin_create('w2j_origin')")[0][0]
    try:
        check_all(
            pg,
            Workload(MESSAGES_SETUP, origin_run),
            [
                {**V2, "include-origin": "1"},
                {**V2, "filter-origins": f"999, {ident}"},
                {**V1, "include-origin": "1", "filter-origins": "999"},
            ],
        )
    finally:
        pg.execute("SELECT pg_replication_origin_drop('w2j_origin')")


#: Commit times a replication origin's timestamp can give (any timestamptz): years past
#: 9999, BC, the ends of the range, the infinities.
COMMIT_TIMES = [
    "12000-01-01 00:00:00.5+00",
    "4000-01-01 12:00:00 BC",
    "0001-01-01 00:00:00+00 BC",
    "0001-12-31 23:59:59.999999+00 BC",
    "4714-11-24 00:00:00+00 BC",
    "294276-12-31 23:59:59.999999+00",
    "infinity",
    "-infinity",
    "1999-12-31 23:59:59.000001+00",
    "9999-12-31 23:59:59.999999+00",
    "10000-01-01 00:00:00+00",
]


def test_commit_times_beyond_datetime(pg: Database) -> None:
    """include-timestamp with commit times Python's datetime cannot hold. A commit made in a
    session with a replication origin takes the time the session gives it
    (``pg_replication_origin_xact_setup``) as its commit time, in the WAL, in wal2json and in
    pgoutput's Begin alike."""
    require_wal2json(pg)
    pg.execute("SELECT pg_replication_origin_create('w2j_clock')")

    def run(db: Database) -> None:
        with db.connect() as conn:
            conn.execute("SELECT pg_replication_origin_session_setup('w2j_clock')")
            for i, at in enumerate(COMMIT_TIMES):
                with conn.transaction():
                    conn.execute("SELECT pg_replication_origin_xact_setup('0/1', %s)", (at,))
                    conn.execute("INSERT INTO t1 VALUES (%s, %s)", (i, at))
                    conn.execute("SELECT pg_logical_emit_message(true, 'clock', %s)", (at,))
            conn.execute("SELECT pg_replication_origin_session_reset()")

    timestamps = {"include-timestamp": "1"}
    try:
        check_all(
            pg,
            Workload(MESSAGES_SETUP, run),
            [
                {**V2, **timestamps},
                {**V2, **timestamps, "include-xids": "1", "include-origin": "1"},
                {**V2, **timestamps, "include-transaction": "0"},
                {**V1, **timestamps},
                {**V1, **timestamps, "pretty-print": "1", "include-origin": "1"},
                {**V1, **timestamps, "write-in-chunks": "1", "include-lsn": "1"},
            ],
        )
    finally:
        pg.execute("SELECT pg_replication_origin_drop('w2j_clock')")


def test_prepared_transaction(pg: Database) -> None:
    """A prepared transaction comes out at COMMIT PREPARED as an ordinary one on both sides."""
    require_wal2json(pg)
    if int(pg.execute("SHOW max_prepared_transactions")[0][0]) == 0:
        pytest.skip("max_prepared_transactions is 0 on this server")

    def run(db: Database) -> None:
        gid = unique("w2j")
        db.execute(f"BEGIN; INSERT INTO t1 VALUES (1, 'p'); PREPARE TRANSACTION '{gid}'")
        db.execute("INSERT INTO t1 VALUES (2, 'q')")
        db.execute(f"COMMIT PREPARED '{gid}'")

    check_all(
        pg,
        Workload(MESSAGES_SETUP, run),
        [{**V2, "include-xids": "1", "include-lsn": "1"}, {**V1, "include-lsn": "1"}],
    )


def test_known_differences(pg: Database) -> None:
    """What pgoutput does not send: an empty (DDL only) transaction, generated columns."""
    setup = (
        "CREATE TABLE g (id int PRIMARY KEY, x int, y int GENERATED ALWAYS AS (x * 2) STORED)"
        f" {NO_AUTOVACUUM}"
    )

    def run(db: Database) -> None:
        db.execute("CREATE TABLE ddl_only (a int)")
        db.execute("INSERT INTO g VALUES (1, 5)")

    source, oracle = prepare(pg, Workload(setup, run))
    server = [json.loads(r) for r in server_rows(pg, oracle, V2)]
    assert [o["action"] for o in server] == ["B", "C", "B", "I", "C"]
    assert [c["name"] for c in server[3]["columns"]] == ["id", "x", "y"]
    del server[:2]
    del server[1]["columns"][2]
    assert [json.loads(w) for w in pgcdc_rows(pg, source, V2)] == server


#: Option sets the server refuses; each is refused by pgcdc with the server's message.
REFUSED: list[Options] = [
    {"format-version": "3"},
    {"format-version": "0"},
    {"format-version": "two"},
    {"include-xids": "maybe"},
    {"include-unchanged-toast": "1"},
    {"include-unchanged-toast": None},
    {"no-such-option": "x"},
    {"no-such-option": None},
    {"actions": "insert,merge"},
    {"actions": r"insert\,update"},
    {"filter-tables": "no_schema"},
    {"add-tables": "a.b,,c.d"},
    {"filter-msg-prefixes": "a b"},
    {"add-msg-prefixes": ",a"},
    {"filter-origins": "1 2"},
    # booleans: parse_bool, no spaces, no unit
    {"include-xids": " 1"},
    {"include-xids": "1 "},
    {"include-xids": ""},
    {"include-xids": "o"},
    {"include-xids": "truex"},
    {"include-xids": "yess"},
    {"include-xids": "2"},
    {"pretty-print": "ON "},
    {"include-pk": "\tt"},
    {"include-default": "nö"},
    # format-version: the server's parse_int
    {"format-version": "08"},
    {"format-version": "010"},
    {"format-version": "0x"},
    {"format-version": "0x1.8p1"},
    {"format-version": "-0x2"},
    {"format-version": ".5"},
    {"format-version": " .5"},
    {"format-version": "-0"},
    {"format-version": "1e"},
    {"format-version": "2 x"},
    {"format-version": "+ 2"},
    {"format-version": "2.5e0 s"},
    {"format-version": "inf"},
    {"format-version": "nan"},
    {"format-version": "3000000000"},
    {"format-version": "99999999999999999999"},
    {"format-version": "2147483647.5"},
    {"format-version": "-2147483648.5"},
    {"format-version": "1e-400"},
    {"format-version": "1e-310"},
    {"format-version": "2.5e-308"},
    {"format-version": "0x1.1p-1070"},
    {"format-version": "0x1.00000000000001p-1070"},
    {"format-version": "1e999999999"},
    {"format-version": ""},
    # the first refusal wins
    {"include-xids": "1", "format-version": "3", "bogus": "x"},
    {"include-timestamp": "of", "include-xids": "nah", "whatever": "1"},
]


def test_option_errors_match_the_server(pg: Database) -> None:
    """Every refused option set gets the server's message, word for word."""
    require_wal2json(pg)
    other_session_defaults(pg)
    pg.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    source, oracle = unique("pgo"), unique("w2j")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source,))
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (oracle,))
    for options in REFUSED:
        with pytest.raises((psycopg.Error, ServerRefused)) as server_error:
            server_rows(pg, oracle, options)
        refusal = server_error.value
        message = refusal.diag.message_primary if isinstance(refusal, psycopg.Error) else refusal
        with pytest.raises(PluginOptionError) as ours:
            pgcdc_rows(pg, source, options)
        assert str(ours.value) == str(message), options


def test_option_spellings_the_server_accepts(pg: Database) -> None:
    """Values the server reads in unusual spellings (boolean prefixes in any case, no value,
    format-version in hex, octal, rounded, with spaces; empty origin ids) give its output."""
    check_all(
        pg,
        MESSAGES,
        [
            {"format-version": "0x2", "include-xids": "TRU", "include-timestamp": "of"},
            {"format-version": " 1.5 ", "include-lsn": "Y", "include-transaction": "n"},
            {"format-version": "2.5", "include-xids": None, "include-types": "oFf"},
            {"format-version": "1e0", "pretty-print": "oN", "include-xids": "YeS"},
            {"format-version": "01", "write-in-chunks": "t", "include-lsn": None},
            {"format-version": "0x1.0p1", "filter-origins": "1,,2", "add-msg-prefixes": "side"},
            {"format-version": None, "filter-origins": ",", "actions": ""},
            {"format-version": "\t2\n", "add-tables": None, "filter-tables": None},
            {"actions": None, "add-msg-prefixes": None, "filter-msg-prefixes": "  "},
            {"format-version": "2", "include-timestamp": None, "include-origin": None},
        ],
    )


def test_tail_writes_the_servers_bytes(pg: Database, tmp_path: Path) -> None:
    """``pgcdc tail -P wal2json -f FILE``: the file holds the server plugin's rows, one a
    line, message content that is not UTF-8 and v1's comma quirk included."""
    source, oracle = prepare(pg, MESSAGES)
    for options in (V1, {**V2, "include-xids": "1"}):
        expected = b"".join(row + b"\n" for row in server_rows(pg, oracle, options))
        assert b'"content":"\xffA"' in expected
        assert (b'[,{"kind":"message"' in expected) == (options is V1)
        out = tmp_path / f"out-{len(options)}.json"
        args = ["tail", "-d", pg.dsn, "-S", source, "--publication", "pub", "--until-idle"]
        args += ["--no-confirm", "-P", "wal2json", "-f", str(out)]
        for name, value in options.items():
            args += ["-o", f"{name}={value}"]
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        assert out.read_bytes() == expected, options


# -- unit tests: hand-fed changes, no server -----------------------------------------------


def column(name: str, type_oid: int, key: bool = False, typmod: int = -1) -> Column:
    return Column(1 if key else 0, name, type_oid, typmod)


RELATION = Relation(
    16384,
    "public",
    "t",
    "d",
    (column("id", 23, key=True), column("f", 701), column("b", 16), column("s", 25)),
)


def row(*values: str | None, toast: tuple[int, ...] = ()) -> TupleData:
    kinds = bytes(0x75 if i in toast else 0x6E if v is None else 0x74 for i, v in enumerate(values))
    data = tuple(None if v is None or i in toast else v.encode() for i, v in enumerate(values))
    return TupleData(kinds, data)


def decode(options: dict[str, str | None], feed: Callable[[Wal2Json, DecodingContext], None]):
    writes: list[OutputWrite] = []
    ctx = DecodingContext(options=options, sink=writes.append)
    plugin = Wal2Json()
    plugin.startup(ctx, OutputPluginOptions(), False)
    feed(plugin, ctx)
    return [w.data.decode() for w in writes]


def one_txn(*changes: Change) -> Callable[[Wal2Json, DecodingContext], None]:
    def feed(plugin: Wal2Json, ctx: DecodingContext) -> None:
        txn = Transaction(700, final_lsn=Lsn(0x100), commit_ts=0)
        plugin.begin(ctx, txn)
        for change in changes:
            ctx.write_location = change.lsn
            plugin.change(ctx, txn, change.relation, change)
        txn.end_lsn = Lsn(0x180)
        plugin.commit(ctx, txn, Lsn(0x100))

    return feed


def test_unit_v2_values_and_identity() -> None:
    insert = Change(ChangeAction.INSERT, RELATION, row("1", "-Infinity", "t", 'a"\\\x01é'))
    update = Change(
        ChangeAction.UPDATE, RELATION, row("1", "1e-07", "f", None, toast=(3,)), lsn=Lsn(0x120)
    )
    writes = decode(
        {"format-version": "2", "include-types": "0", "include-lsn": None, "include-xids": "on"},
        one_txn(insert, update),
    )
    assert writes == [
        '{"action":"B","xid":700,"lsn":"0/100","nextlsn":"0/180"}',
        '{"action":"I","xid":700,"lsn":"0/0","schema":"public","table":"t","columns":['
        '{"name":"id","value":1},{"name":"f","value":null},{"name":"b","value":true},'
        '{"name":"s","value":"a\\"\\\\\\u0001é"}]}',
        '{"action":"U","xid":700,"lsn":"0/120","schema":"public","table":"t","columns":['
        '{"name":"id","value":1},{"name":"f","value":1e-07},{"name":"b","value":false}],'
        '"identity":[{"name":"id","value":1}]}',
        '{"action":"C","xid":700,"lsn":"0/100","nextlsn":"0/180"}',
    ]


def test_unit_v1_document_and_messages() -> None:
    delete = Change(ChangeAction.DELETE, RELATION, None, row("5", None, None, None), "K")

    def feed(plugin: Wal2Json, ctx: DecodingContext) -> None:
        plugin.message(ctx, None, Lsn(1), False, "p", b"now")
        txn = Transaction(9, commit_ts=86_400_000_000 + 500_000)
        plugin.begin(ctx, txn)
        plugin.message(ctx, txn, Lsn(2), True, "p", b"cut\0here")
        plugin.change(ctx, txn, RELATION, delete)
        plugin.truncate(ctx, txn, [RELATION], Truncation(False, False))
        plugin.commit(ctx, txn, Lsn(3))

    writes = decode({"include-types": "false", "include-timestamp": "1"}, feed)
    assert writes == [
        '{"change":[{"kind":"message","transactional":false,"prefix":"p","content":"now"}]}',
        '{"timestamp":"2000-01-02 00:00:00.5+00","change":['
        '{"kind":"message","transactional":true,"prefix":"p","content":"cut"},'
        '{"kind":"delete","schema":"public","table":"t",'
        '"oldkeys":{"keynames":["id"],"keyvalues":[5]}}]}',
    ]
    assert all(json.loads(w) for w in writes)


def test_unit_table_lists() -> None:
    assert split_list("  a , b\\,c,d  ") == ["a", "b\\,c", "d"]
    assert split_list("") == [] and split_list("a,,b") is None and split_list("a b") is None
    assert parse_select_tables(r"*.t, s.\*, s\.x.a\.b, \*.*") == [
        SelectTable("*", "t", True, False),
        SelectTable("s", "*", False, False),
        SelectTable("s.x", "a.b", False, False),
        SelectTable("*", "*", False, True),
    ]
    assert parse_select_tables("nodot") is None
    assert SelectTable("*", "t", True, False).matches("any", "t")
    assert not SelectTable("*", "*", False, True).matches("public", "t")


def test_unit_option_errors() -> None:
    cases = {
        "format-version": ("5", "client sent format_version=5 but we only support format 2"),
        "include-pk": ("perhaps", 'could not parse value "perhaps" for parameter "include-pk"'),
        "include-unchanged-toast": (None, 'parameter "include-unchanged-toast" was deprecated'),
        "bogus": (None, 'option "bogus" = "(null)" is unknown'),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(PluginOptionError, match=re.escape(message)):
            decode({name: value}, lambda plugin, ctx: None)


def test_unit_not_a_number_and_timestamps() -> None:
    bad = Change(ChangeAction.INSERT, RELATION, row("0x1F", "1", "t", "s"))
    with pytest.raises(PluginError, match="0x1F is not a number"):
        decode({"format-version": "2", "include-types": "0"}, one_txn(bad))
    assert timestamptz_to_str(0) == "2000-01-01 00:00:00+00"
    assert timestamptz_to_str(-1) == "1999-12-31 23:59:59.999999+00"


def test_unit_v1_message_comma_and_bytes() -> None:
    """v1's counter is the session's: a non-transactional message after a transaction of two
    changes gets wal2json's comma; content that is not UTF-8 is written as its bytes."""
    insert = Change(ChangeAction.INSERT, RELATION, row("1", "0", "t", "x"))
    writes: list[OutputWrite] = []
    ctx = DecodingContext(options={"include-types": "0"}, sink=writes.append)
    plugin = Wal2Json()
    plugin.startup(ctx, OutputPluginOptions(), False)
    for changes in ((insert,), (insert, insert)):
        txn = Transaction(5, commit_ts=0)
        plugin.begin(ctx, txn)
        for change in changes:
            plugin.change(ctx, txn, RELATION, change)
        plugin.commit(ctx, txn, Lsn(1))
        plugin.message(ctx, None, Lsn(2), False, "p", b'\xffA"\x01\xc3\xa9\0cut')
    message = (
        b'{"kind":"message","transactional":false,"prefix":"p","content":"\xffA\\"\\u0001\xc3\xa9"}'
    )
    assert writes[1].data == b'{"change":[' + message + b"]}"
    assert writes[3].data == b'{"change":[,' + message + b"]}"


def test_unit_booleans_as_parse_bool_reads_them() -> None:
    accepted = {
        "t": True, "TRUE": True, "tR": True, "y": True, "Yes": True, "on": True, "ON": True,
        "f": False, "fAlS": False, "n": False, "NO": False, "of": False, "OFF": False,
        "1": True, "0": False,
    }  # fmt: skip
    for value, meaning in accepted.items():
        assert parse_bool_option("x", value) is meaning, value
    assert parse_bool_option("x", None) is True
    for value in ("", " 1", "1 ", "o", "offf", "onn", "truex", "yess", "01", "2", "ye s", "İ"):
        with pytest.raises(PluginOptionError, match=re.escape(f'value "{value}" for parameter')):
            parse_bool_option("x", value)


def pgoutput_transaction(xid: int, commit_ts: int, prefix: str, content: bytes) -> list[bytes]:
    """Hand-built pgoutput v1 messages: Begin, a transactional Message, Commit."""
    lsn = 0x1000 + xid
    begin = b"B" + struct.pack(">QqI", lsn, commit_ts, xid)
    message = b"M" + struct.pack(">BQ", 1, lsn) + prefix.encode() + b"\0"
    message += struct.pack(">I", len(content)) + content
    commit = b"C" + struct.pack(">BQQq", 0, lsn, lsn + 8, commit_ts)
    return [begin, message, commit]


#: Commit times (microseconds since 2000-01-01 UTC) and what timestamptz_to_str prints for
#: them in a UTC session; 730485 days back is 0000-01-01 (1 BC), 2921940 ahead 10000-01-01,
#: 2451545 days back Julian day 0, the earliest day timestamp2tm takes.
DAY = 86_400_000_000
SERVER_TIMES = {
    0: "2000-01-01 00:00:00+00",
    -1: "1999-12-31 23:59:59.999999+00",
    2921940 * DAY: "10000-01-01 00:00:00+00",
    2921940 * DAY - 1: "9999-12-31 23:59:59.999999+00",
    -730485 * DAY: "0001-01-01 00:00:00+00 BC",
    -730485 * DAY + 1_500_000: "0001-01-01 00:00:01.5+00 BC",
    -730119 * DAY: "0001-01-01 00:00:00+00",
    -2451545 * DAY: "4714-11-24 00:00:00+00 BC",
    -2451545 * DAY - 1: "(timestamp out of range)",
    -(2**63) + 1: "(timestamp out of range)",
    2**63 - 2: "294277-01-09 04:00:54.775806+00",
    2**63 - 1: "infinity",
    -(2**63): "-infinity",
}


def test_unit_commit_times_from_bytes() -> None:
    """Commit times Python's datetime cannot hold, fed as pgoutput bytes through the decoder
    and the assembler: the timestamps wal2json prints for them."""
    writes: list[OutputWrite] = []
    options: dict[str, str | None] = {"format-version": "2", "include-timestamp": "1"}
    ctx = DecodingContext(options=options, sink=writes.append)
    plugin = Wal2Json()
    plugin.startup(ctx, OutputPluginOptions(), False)
    assembler = TransactionAssembler(plugin, ctx)
    decoder = Decoder(1)
    for xid, commit_ts in enumerate(SERVER_TIMES, start=1):
        for payload in pgoutput_transaction(xid, commit_ts, "p", b"c"):
            assembler.feed(decoder.decode(payload, Lsn(0x1000 + xid)), Lsn(0x1000 + xid))
    lines = [w.data.decode() for w in writes]
    expected = []
    for text in SERVER_TIMES.values():
        stamp = f'"timestamp":"{text}"'
        expected += [
            f'{{"action":"B",{stamp}}}',
            f'{{"action":"M",{stamp},"transactional":true,"prefix":"p","content":"c"}}',
            f'{{"action":"C",{stamp}}}',
        ]
    assert lines == expected
    for commit_ts, text in SERVER_TIMES.items():
        assert timestamptz_to_str(commit_ts) == text
