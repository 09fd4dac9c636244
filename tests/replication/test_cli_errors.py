"""Every subcommand, given bad input, ends with one line on stderr (``pgcdc: error: ...``) and
the documented exit status: 1 for a failure pgcdc diagnosed, 2 for a wrong command line. Never
a traceback (issue 14). `test_every_subcommand_is_covered` keeps it that way: a new subcommand
without a case here fails it.

The cases that need a server run against each real server of the matrix; the others (the
command line itself) need none.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg
import pytest

from pgcdc.capture import CaptureReader, CaptureWriter
from pgcdc.cli.main import cli
from pgcdc.embedded import Database
from pgcdc.records import read_records, write_record
from pgcdc.replication import ReplicationClient, StreamOptions
from pgcdc.replication.record import record

from .helpers import assert_one_error_line, run_cli, slot_row, unique
from .test_errors import COMMANDS as MALFORMED_CONNINFO_COMMANDS

PUB = "bad_pub"


@dataclass(frozen=True, slots=True)
class Case:
    """`pgcdc args...` fails with `status` and one line containing `needles`. Arguments may
    name {dsn}, {weak_dsn} (a role without privileges), {slot}, {physical_slot}, {pub}, {tmp},
    {capture} (recorded from the server), {config} (a pipeline, see `CONFIGS`)."""

    args: tuple[str, ...]
    needles: tuple[str, ...]
    status: int = 1


def case(*args: str, needles: tuple[str, ...] | str, status: int = 1) -> Case:
    return Case(args, (needles,) if isinstance(needles, str) else needles, status)


STREAM = ("-d", "{dsn}", "-S", "{slot}", "--publication", "{pub}", "--until-idle")

#: Bad input that only a server can refuse (or that needs a server to be shown harmless).
SERVER_CASES = {
    "publication create: exists": case(
        "publication", "create", "{pub}", "-d", "{dsn}", "-t", "t", needles='"bad_pub" already'
    ),
    "publication create: no such table": case(
        "publication", "create", "p2", "-d", "{dsn}", "-t", "nosuch", needles='"nosuch" does not'
    ),
    "publication create: bad WHERE": case(
        "publication", "create", "p2", "-d", "{dsn}", "-t", "t WHERE (", needles="syntax error"
    ),
    "publication create: bad --publish": case(
        "publication",
        "create",
        "p2",
        "-d",
        "{dsn}",
        "-t",
        "t",
        "--publish",
        "insert,upsert",
        needles=("creating publication 'p2'", '"upsert"'),
    ),
    "publication create: no privilege": case(
        "publication", "create", "p2", "-d", "{weak_dsn}", "-t", "t", needles="permission denied"
    ),
    "publication create: a row filter that would break the application's updates": case(
        "publication",
        "create",
        "p2",
        "-d",
        "{dsn}",
        "-t",
        "t WHERE v IS NOT NULL",
        needles=("publication 'p2' not created: public.t: UPDATE and DELETE", "filter on id only"),
    ),
    "publication alter: a column list without the key": case(
        "publication",
        "alter",
        "{pub}",
        "-d",
        "{dsn}",
        "--drop",
        "t",
        "--add",
        "t(v)",
        needles=("publication 'bad_pub' not altered", "add id to the column list"),
    ),
    "publication alter: no such publication": case(
        "publication", "alter", "nosuch", "-d", "{dsn}", "--add", "t", needles='"nosuch" does not'
    ),
    "publication alter: drop a table not in it": case(
        "publication",
        "alter",
        "{pub}",
        "-d",
        "{dsn}",
        "--drop",
        "t2",
        needles=("altering publication 'bad_pub'", "not part of the publication"),
    ),
    "publication alter: no such table": case(
        "publication", "alter", "{pub}", "-d", "{dsn}", "--add", "nosuch", needles='"nosuch"'
    ),
    "tail -f: cannot be written": case(
        "tail", *STREAM, "-f", "{tmp}/no/such/dir/out.txt", needles="cannot write {tmp}/no/"
    ),
    "tail -P -f: cannot be written": case(
        "tail",
        *STREAM,
        "-P",
        "test_decoding",
        "-f",
        "{tmp}/a_file/out.txt",
        needles="cannot write {tmp}/a_file/out.txt: Not a directory",
    ),
    "tail --create-slot -f: cannot be written (no slot is created)": case(
        "tail",
        *STREAM[:3],
        "new_slot",
        *STREAM[4:],
        "--create-slot",
        "-f",
        "{tmp}/a_file/out.txt",
        needles="cannot write",
    ),
    "record --create-slot -f: cannot be written (no slot is created)": case(
        "record",
        *STREAM[:3],
        "new_slot",
        *STREAM[4:],
        "--create-slot",
        "-f",
        "{tmp}/a_file/c.pgcap",
        needles="cannot write",
    ),
    "record -f: cannot be written": case(
        "record", *STREAM, "-f", "{tmp}/no/such/dir/c.pgcap", needles="cannot write {tmp}/no/"
    ),
    "tail --startpos past the WAL end": case(
        "tail", *STREAM, "--startpos", "FF/0", needles="start position FF/0 is past the server"
    ),
    "tail -s -1": case("tail", *STREAM, "-s", "-1", needles="--status-interval", status=2),
    "tail -s nan": case("tail", *STREAM, "-s", "nan", needles="'nan' is not a finite", status=2),
    "tail on a physical slot": case(
        "tail", *STREAM[:3], "{physical_slot}", *STREAM[4:], needles="is a physical slot"
    ),
    "decode: header proto_version 5 (format 1, no checksum)": case(
        "decode", "{capture}.proto5.v1", needles="proto_version is 5, expected an integer"
    ),
    "decode: header streaming 'oo' (format 1)": case(
        "decode", "{capture}.oo.v1", needles='streaming is "oo"'
    ),
    "decode: header string for a number (format 2, valid checksum)": case(
        "decode", "{capture}.string", needles='server_version is "160000"'
    ),
    "decode: header proto_version 1 with streaming 'parallel' (format 2)": case(
        "decode",
        "{capture}.parallel",
        needles=("capture header: streaming 'parallel' needs", "a damaged or hand-edited header"),
    ),
    "decode: header with a list for a string (format 2)": case(
        "decode", "{capture}.list", needles='streaming is ["on"], expected'
    ),
    "decode: header damaged (format 2)": case(
        "decode", "{capture}.flipped", needles=("header record at byte 10", "checksum")
    ),
    "run: a table entry of the wrong type": case(
        "run", "{config}.wrong_type", needles="tables.'public.t': modes must be among"
    ),
    "run: name is a list": case("run", "{config}.name_list", needles="name must be a word"),
    "run: not UTF-8": case("run", "{config}.latin1", needles="not UTF-8 text"),
    "run: target path is a file": case(
        "run", "{config}.target_file", needles=("target.path", "not a directory")
    ),
    "run: target path cannot be created": case(
        "run", "{config}.target_uncreatable", needles=("target.path", "cannot create")
    ),
    "recopy: a table entry of the wrong type": case(
        "recopy", "{config}.wrong_type", "public.t", needles="modes must be among"
    ),
    "status: a table entry of the wrong type": case(
        "status", "{config}.wrong_type", needles="modes must be among"
    ),
    "status: no such slot": case(
        "status", "-d", "{dsn}", "-S", "nosuch_slot", needles='"nosuch_slot" does not exist'
    ),
}

#: Pipeline configurations (`{config}.<name>`), written as bytes (one is not UTF-8).
CONFIGS = {
    "wrong_type": 'name = "p"\n{source}[target]\npath = "{tmp}/lake"\n[tables]\n"public.t" = 5\n',
    "name_list": 'name = ["x"]\n{source}[target]\npath = "{tmp}/lake"\n[tables]\n"t" = "mirror"\n',
    "latin1": '# caf\xe9\n{source}[target]\npath = "{tmp}/lake"\n[tables]\n"t" = "mirror"\n',
    "target_file": '{source}[target]\npath = "{tmp}/a_file"\n[tables]\n"public.t" = "mirror"\n',
    "target_uncreatable": (
        '{source}[target]\npath = "{tmp}/a_file/lake"\n[tables]\n"public.t" = "mirror"\n'
    ),
}

#: A wrong command line: exit status 2, one line, no server asked.
USAGE_CASES = {
    "no such command": case("nosuch", needles="No such command 'nosuch'", status=2),
    "tail: no slot": case("tail", "--publication", "p", needles="'--slot'", status=2),
    "tail: --endpos with --until-idle": case(
        "tail", *STREAM[2:], "--endpos", "1/0", needles="cannot be combined", status=2
    ),
    "tail: -o without -P": case(
        "tail", *STREAM[2:], "-o", "x", needles="-o/--option needs -P", status=2
    ),
    "tail: a bad --memory-limit": case(
        "tail", *STREAM[2:], "-P", "json", "--memory-limit", "lots", needles="64MB", status=2
    ),
    "tail: a bad LSN": case("tail", *STREAM[2:], "--startpos", "x", needles="LSN", status=2),
    "tail: negative --reconnect-timeout": case(
        "tail", *STREAM[2:], "--reconnect-timeout", "-5", needles="--reconnect-timeout", status=2
    ),
    "record: no file": case("record", *STREAM[2:], needles="'--file'", status=2),
    "decode: no capture": case("decode", needles="Missing argument 'CAPTURE'", status=2),
    "decode: no such file": case("decode", "{tmp}/nosuch", needles="does not exist", status=2),
    "slot create: no name": case("slot", "create", needles="Missing argument", status=2),
    "slot drop: no name": case("slot", "drop", needles="Missing argument", status=2),
    "slot list: a bad format": case(
        "slot", "list", "--format", "yaml", needles="'yaml' is not one of", status=2
    ),
    "publication create: no table": case(
        "publication", "create", "p", needles="--all-tables or at least one --table", status=2
    ),
    "publication alter: unknown option": case(
        "publication", "alter", "p", "--remove", "t", needles="No such option", status=2
    ),
    "publication describe: no name": case(
        "publication", "describe", needles="Missing argument", status=2
    ),
    "run: no such file": case("run", "{tmp}/nosuch.toml", needles="does not exist", status=2),
    "recopy: a directory": case("recopy", "{tmp}", "public.t", needles="is a directory", status=2),
    "status: neither pipeline nor slot": case(
        "status", needles="give PIPELINE.toml or -S SLOT", status=2
    ),
    "status: no such file": case("status", "{tmp}/nosuch.toml", needles="does not exist", status=2),
    "verify: no such file": case("verify", "{tmp}/nosuch.toml", needles="does not exist", status=2),
    "demo: an extra argument": case("demo", "now", needles="unexpected extra argument", status=2),
}


def expand(value: str, names: dict[str, str]) -> str:
    return value.format(**names)


def run_case(c: Case, names: dict[str, str]) -> str:
    result = run_cli(*(expand(a, names) for a in c.args))
    needles = [expand(n, names) for n in c.needles]
    return assert_one_error_line(result, *needles, status=c.status)


@pytest.mark.parametrize("name", list(USAGE_CASES))
def test_usage_errors(name: str, tmp_path: Path) -> None:
    line = run_case(USAGE_CASES[name], {"tmp": str(tmp_path), "dsn": "", "slot": "s", "pub": "p"})
    assert line.endswith("--help')"), line


@pytest.fixture
def names(pg: Database, tmp_path: Path) -> Iterator[dict[str, str]]:
    """What the server cases refer to: a table in the publication and one not in it, a slot,
    a physical slot, a role without privileges, a capture recorded from the server and its
    damaged copies, pipeline configurations."""
    pg.execute(
        f"""CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE t2 (id int PRIMARY KEY);
            CREATE PUBLICATION {PUB} FOR TABLE t"""
    )
    slot, physical, weak = unique("bad"), unique("phys"), unique("weak")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    pg.execute("SELECT pg_create_physical_replication_slot(%s)", (physical,))
    pg.execute(f"CREATE ROLE {weak} LOGIN")
    pg.execute("INSERT INTO t VALUES (1, 'one')")
    values = {
        "dsn": pg.dsn,
        "weak_dsn": pg.server.dsn_for(pg.dbname, user=weak),
        "slot": slot,
        "physical_slot": physical,
        "pub": PUB,
        "tmp": str(tmp_path),
    }
    values["capture"] = capture = str(tmp_path / "c.pgcap")
    client = ReplicationClient(
        pg.dsn, slot, StreamOptions((PUB,)), until_idle=True, reconnect=False, acknowledge=False
    )
    assert record(client, Path(capture)) > 0
    write_damaged_captures(Path(capture))
    values["config"] = str(tmp_path / "p.toml")
    write_configs(tmp_path, values)
    try:
        yield values
    finally:
        pg.execute(f"SELECT pg_drop_replication_slot('{physical}')")
        pg.server.query(f"DROP ROLE IF EXISTS {weak}")


def write_damaged_captures(path: Path) -> None:
    """Copies of a real capture whose header is wrong in the ways the issue lists."""
    with open(path, "rb") as file:
        file.seek(10)  # magic and version
        records = [r.payload for r in read_records(file, 10)]
    header = json.loads(records[0])

    def write(suffix: str, edits: dict[str, object], version: int) -> None:
        data = json.dumps({**header, **edits}).encode()
        with open(f"{path}.{suffix}", "wb") as out:
            if version == 1:  # the old layout: a header without a checksum
                out.write(b"PGCDCCAP" + struct.pack(">HI", 1, len(data)) + data)
                for payload in records[1:-1]:
                    frame = payload[8:]
                    head = struct.pack(">II", len(frame), zlib.crc32(frame))
                    out.write(head + payload[:8] + frame)
                out.write(struct.pack(">II", 2**32 - 1, len(records) - 2))
                return
            out.write(b"PGCDCCAP" + struct.pack(">H", 2))
            for payload in [data, *records[1:]]:
                write_record(out, payload)

    write("proto5.v1", {"proto_version": 5}, 1)
    write("oo.v1", {"streaming": "oo"}, 1)
    write("string", {"server_version": "160000"}, 2)
    write("parallel", {"proto_version": 1, "streaming": "parallel"}, 2)
    write("list", {"streaming": ["on"]}, 2)
    flipped = bytearray(path.read_bytes())
    flipped[flipped.index(b"proto_version") + 2] ^= 0x01
    Path(f"{path}.flipped").write_bytes(bytes(flipped))


def write_configs(tmp_path: Path, values: dict[str, str]) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    source = (
        f'[source]\nconninfo = "{values["dsn"]}"\npublication = "{PUB}"\n'
        f'slot = "{values["slot"]}"\n'
    )
    for name, text in CONFIGS.items():
        data = text.replace("{source}", source).replace("{tmp}", str(tmp_path))
        Path(f"{values['config']}.{name}").write_bytes(data.encode("latin-1"))


@pytest.mark.parametrize("name", list(SERVER_CASES))
def test_bad_input(name: str, names: dict[str, str], pg: Database) -> None:
    before = slot_row(pg, names["slot"])
    run_case(SERVER_CASES[name], names)
    assert slot_row(pg, names["slot"]) == before, "the slot was moved"
    slots = {row[0] for row in pg.execute("SELECT slot_name FROM pg_replication_slots")}
    assert slots == {names["slot"], names["physical_slot"]}, "a slot was created or dropped"


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths |= command_paths(command, (*prefix, name))
        else:
            paths.add((*prefix, name))
    return paths


def test_every_subcommand_is_covered() -> None:
    """Each subcommand has bad-input cases here (or in test_errors's malformed connection
    strings): a server case or a usage case, and a usage case for every one."""
    tried = [c.args for c in (*SERVER_CASES.values(), *USAGE_CASES.values())]
    tried += list(MALFORMED_CONNINFO_COMMANDS)
    for path in sorted(command_paths(cli)):
        assert any(args[: len(path)] == path for args in tried), f"no bad input for {path}"
        usage = [c.args for c in USAGE_CASES.values()]
        assert any(args[: len(path)] == path for args in usage), f"no usage case for {path}"


def test_startpos_past_the_wal_end_skips_nothing(names: dict[str, str], pg: Database) -> None:
    """Before, the slot was confirmed at the start position and the pending insert was lost."""
    run_case(SERVER_CASES["tail --startpos past the WAL end"], names)
    result = run_cli("tail", *(expand(a, names) for a in STREAM))
    assert result.returncode == 0, result.stderr
    assert "Insert public.t: id='1' v='one'" in result.stdout, result.stdout


@pytest.mark.parametrize("plugin", ["test_decoding", "wal2json"])
def test_a_slot_of_another_plugin(plugin: str, names: dict[str, str], pg: Database) -> None:
    """Said as such, instead of the server's 'option "proto_version" = "3" is unknown'. The
    servers from the wheel carry no other output plugin: the physical slot case above covers
    the check there."""
    slot = unique("other")
    try:
        pg.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    except psycopg.errors.UndefinedFile:
        pytest.skip(f"PostgreSQL {pg.version} here has no {plugin}")
    args = [expand(a, names) for a in STREAM]
    args[3] = slot
    line = assert_one_error_line(run_cli("tail", *args), f"uses output plugin {plugin}")
    assert "pgcdc needs a logical slot of plugin pgoutput" in line


def test_a_record_that_fails_to_start_leaves_no_file(names: dict[str, str], tmp_path: Path) -> None:
    capture = tmp_path / "new.pgcap"
    args = ["record", "-d", names["dsn"], "-S", "nosuch", "--publication", PUB, "--until-idle"]
    assert_one_error_line(run_cli(*args, "-f", str(capture)), '"nosuch" does not exist')
    assert not capture.exists(), "an empty capture was left behind"
    capture.write_bytes(b"an earlier capture")
    assert_one_error_line(run_cli(*args, "-f", str(capture)), '"nosuch" does not exist')
    assert capture.read_bytes() == b"an earlier capture", "an existing file was emptied"


@pytest.mark.parametrize(("micros", "shown"), [(2**63 - 1, "infinity"), (9 * 10**18, "287198-")])
def test_decode_a_commit_time_outside_pythons_range(
    micros: int, shown: str, names: dict[str, str], tmp_path: Path
) -> None:
    """Any int64 is a valid timestamp on the wire; it is printed as the server prints it."""
    with open(names["capture"], "rb") as file:
        reader = CaptureReader(file)
        header, frames = reader.header, [(r.frame, r.received_at) for r in reader]
    path = tmp_path / "far.pgcap"
    with open(path, "wb") as out:
        writer = CaptureWriter(out, header)
        for frame, received_at in frames:
            if frame[:1] == b"w" and frame[25:26] == b"B":  # Begin: final_lsn, commit_ts, xid
                frame = frame[:34] + struct.pack(">q", micros) + frame[42:]
            writer.write(frame, received_at)
        writer.close()
    for fmt, expected in (("text", f'commit_ts="{shown}'), ("json", f'"commit_ts": "{shown}')):
        result = run_cli("decode", "--format", fmt, str(path))
        assert result.returncode == 0 and not result.stderr, result.stderr
        assert expected in result.stdout, result.stdout
