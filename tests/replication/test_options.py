"""Every START_REPLICATION option combination, against the real server of each version.

The matrix is proto_version 1-4 x binary x messages x streaming off/on/parallel x two_phase x
origin unset/any/none. `StreamOptions.negotiate` decides which combinations the server accepts:

* accepted: the combination streams one fixed workload (insert/update/delete, key change, NULLs,
  a rolled-back and an unpublished transaction, logical messages, a transaction large enough to be
  streamed, a prepared transaction, a transaction from a replication origin) and every decoded
  value equals what was written, in text or binary form; the option visibly took effect (stream
  blocks, Begin Prepare, messages, origin filtering) and the slot was acknowledged to the end;
* rejected: `UnsupportedOption` naming the option and the version, raised before any command
  is sent, and the server itself refuses the same START_REPLICATION.

All combinations of one version share one database and one workload: each accepted combination
streams a copy of a template slot created before the workload (two_phase on a slot is permanent
once enabled, and a copy keeps the template untouched), then drops it.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.errors import ReplicationError, UnsupportedOption
from pgcdc.protocol import INVALID_LSN, StreamingMode
from pgcdc.replication import (
    OriginFilter,
    ReplicationClient,
    ReplicationConnection,
    StreamOptions,
)

from .helpers import Collector, confirmed_flush, server_version_num

PUB = "opt_pub"
BIG_ROWS = range(100, 900)  # 800 rows of ~40 bytes: well over logical_decoding_work_mem=64kB
SETTINGS = {"logical_decoding_work_mem": "64kB"}

SETUP = f"""
CREATE TABLE t (id int4 PRIMARY KEY, n int4, s text);
CREATE TABLE unpublished (id int4);
CREATE PUBLICATION {PUB} FOR TABLE t;
"""

QUOTED = "três 'quoted' ✓"

# (id, n, s) rows as Python values; the expected stream is built from these.
T1 = [("I", (1, 10, "one")), ("I", (2, -20, None)), ("I", (3, 2147483647, QUOTED))]
T2 = [("U", None, None, (1, 11, "uno"))]
T3 = [("D", "K", (2, None, None))]
T6 = [("I", (5, 50, "five"))]
T8 = [("I", (g, -g, f"{'x' * 30}{g}")) for g in BIG_ROWS]
T9 = [("I", (6, 60, "prepared")), ("U", None, None, (6, 60, "six"))]
T10 = [("U", "K", (5, None, None), (7, 50, "five"))]
T11 = [("I", (8, 80, "from origin"))]
TX_MESSAGE = ("M", True, "opt", b"transactional")
NONTX_MESSAGE = ("M", False, "opt", b"not transactional \x00\xff")


def run_workload(db: Database, origin: str) -> None:
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO t VALUES (1, 10, 'one'), (2, -20, NULL), (3, 2147483647, %s)", (QUOTED,)
        )
        conn.execute("UPDATE t SET n = n + 1, s = 'uno' WHERE id = 1")
        conn.execute("DELETE FROM t WHERE id = 2")
        conn.execute("INSERT INTO unpublished VALUES (1)")
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO t VALUES (4, 40, 'rolled back')")
        with conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, 'opt', 'transactional')")
            conn.execute("INSERT INTO t VALUES (5, 50, 'five')")
        conn.execute(
            "SELECT pg_logical_emit_message(false, 'opt', %s::bytea)",
            (b"not transactional \x00\xff",),
        )
        conn.execute(
            "INSERT INTO t SELECT g, -g, repeat('x', 30) || g"
            " FROM generate_series(%s::int, %s::int) g",
            (BIG_ROWS.start, BIG_ROWS.stop - 1),
        )
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (6, 60, 'prepared')")
        conn.execute("UPDATE t SET s = 'six' WHERE id = 6")
        conn.execute("PREPARE TRANSACTION 'opt-gid'")
        conn.execute("COMMIT PREPARED 'opt-gid'")
        conn.execute("UPDATE t SET id = 7 WHERE id = 5")
        conn.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        conn.execute("BEGIN")
        conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
        conn.execute("INSERT INTO t VALUES (8, 80, 'from origin')")
        conn.execute("COMMIT")
        conn.execute("SELECT pg_replication_origin_session_reset()")


def encode_row(row: tuple[Any, ...] | None, binary: bool) -> tuple[Any, ...] | None:
    """A (id int4, n int4, s text) row as pgoutput sends it: text, or int4send/textsend."""
    if row is None:
        return None
    out: list[Any] = []
    for value, is_int in zip(row, (True, True, False), strict=True):
        if value is None:
            out.append(None)
        elif binary:
            out.append(struct.pack(">i", value) if is_int else value.encode())
        else:
            out.append(str(value))
    return tuple(out)


def encode_txn(changes: list[tuple[Any, ...]], binary: bool) -> tuple[tuple[Any, ...], ...]:
    out = []
    for change in changes:
        if change[0] == "I":
            out.append(("I", "t", encode_row(change[1], binary)))
        elif change[0] == "U":
            _, kind, old, new = change
            out.append(("U", "t", kind, encode_row(old, binary), encode_row(new, binary)))
        elif change[0] == "D":
            _, kind, old = change
            out.append(("D", "t", kind, encode_row(old, binary)))
        else:
            out.append(change)
    return tuple(out)


def expected_items(*, binary: bool, messages: bool, origin_sent: bool) -> list[tuple[str, Any]]:
    def txn(changes: list[tuple[Any, ...]]) -> tuple[str, Any]:
        return ("txn", encode_txn(changes, binary))

    items = [txn(T1), txn(T2), txn(T3)]
    items.append(txn([TX_MESSAGE, *T6] if messages else T6))
    if messages:
        items.append(("msg", NONTX_MESSAGE))
    items += [txn(T8), txn(T9), txn(T10)]
    if origin_sent:
        items.append(txn(T11))
    return items


@dataclass
class Env:
    server: EmbeddedServer
    db: Database
    version_num: int
    template: str
    probe: str


@pytest.fixture(scope="module")
def env(pg_server: EmbeddedServer) -> Iterator[Env]:
    db = pg_server.create_database()
    origin = f"{db.dbname}_origin"
    template, probe = f"{db.dbname}_tmpl", f"{db.dbname}_probe"
    try:
        db.execute(SETUP)
        db.execute("SELECT pg_replication_origin_create(%s)", (origin,))
        with ReplicationConnection.connect(db.dsn) as conn:
            conn.create_slot(template)
            conn.create_slot(probe)
        run_workload(db, origin)
        yield Env(pg_server, db, server_version_num(db), template, probe)
    finally:
        db.drop()
        pg_server.query("SELECT pg_replication_origin_drop(%s)", (origin,))


PROTOS = (1, 2, 3, 4)
ORIGINS = (None, OriginFilter.ANY, OriginFilter.NONE)
COMBOS = list(
    itertools.product(
        PROTOS, (False, True), (False, True), tuple(StreamingMode), (False, True), ORIGINS
    )
)


def combo_id(combo: tuple[Any, ...]) -> str:
    proto, binary, messages, streaming, two_phase, origin = combo
    return "-".join(
        [
            f"p{proto}",
            "binary" if binary else "text",
            "msgs" if messages else "nomsgs",
            f"stream_{streaming}",
            "2pc" if two_phase else "no2pc",
            f"origin_{origin or 'unset'}",
        ]
    )


def expected_problems(combo: tuple[Any, ...], major: int) -> list[tuple[str, ...]]:
    """From the reference (§1, §4), independent of pgcdc: why the server would refuse `combo`.

    Each problem is a tuple of strings the error message must all contain (option and version).
    """
    proto, _binary, _messages, streaming, two_phase, origin = combo
    highest = 4 if major >= 16 else 3 if major >= 15 else 2 if major >= 14 else 1
    problems: list[tuple[str, ...]] = []
    if proto > highest:
        problems.append(("proto_version", str(major), str(proto)))
    if streaming is StreamingMode.ON and proto < 2:
        problems.append(("streaming", "proto_version 2", str(proto)))
    if streaming is StreamingMode.PARALLEL and major < 16:
        problems.append(("parallel", "16", str(major)))
    if streaming is StreamingMode.PARALLEL and proto < 4:
        problems.append(("parallel", "proto_version 4", str(proto)))
    if two_phase and proto < 3:
        problems.append(("two_phase", "proto_version 3", str(proto)))
    if origin is not None and major < 16:
        problems.append(("origin", "16", str(major)))
    return problems


@pytest.mark.parametrize("combo", COMBOS, ids=[combo_id(c) for c in COMBOS])
def test_option_combination(
    env: Env, combo: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    proto, binary, messages, streaming, two_phase, origin = combo
    options = StreamOptions(
        (PUB,),
        proto_version=proto,
        binary=binary,
        messages=messages,
        streaming=streaming,
        two_phase=two_phase,
        origin=origin,
        settings=SETTINGS,
    )
    problems = expected_problems(combo, env.version_num // 10000)
    try:
        negotiated = options.negotiate(env.version_num)
    except UnsupportedOption as exc:
        assert problems, f"negotiate() rejected a combination the server accepts: {exc}"
        check_rejected(env, options, problems, monkeypatch)
        return
    assert not problems, f"negotiate() accepted a combination the server refuses: {problems}"
    assert negotiated.proto_version == proto
    check_accepted(env, options, combo_id(combo).replace("-", "_"))


def check_accepted(env: Env, options: StreamOptions, name: str) -> None:
    slot = f"{env.db.dbname}_{name}"[:63]
    env.db.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (env.template, slot))
    try:
        collector = Collector()
        with ReplicationClient(
            env.db.dsn, slot, options, until_idle=True, reconnect=False, status_interval=1.0
        ) as client:
            for _frame, message in client:
                end = collector.feed(message)
                if end is not None:
                    client.confirm(end)
        origin_sent = options.origin is not OriginFilter.NONE
        expected = expected_items(
            binary=options.binary, messages=options.messages, origin_sent=origin_sent
        )
        assert collector.items == expected
        (relation,) = {r.relid: r for r in collector.relations.values()}.values()
        assert [(c.name, c.type_oid) for c in relation.columns] == [
            ("id", 23),
            ("n", 23),
            ("s", 25),
        ]
        seen = collector.seen
        # The options took effect, not just passed through.
        if options.streaming is StreamingMode.OFF:
            assert seen["StreamStart"] == 0
        else:
            assert seen["StreamStart"] >= 1 and seen["StreamCommit"] == 1, seen
        if options.two_phase:
            assert (seen["BeginPrepare"], seen["Prepare"], seen["CommitPrepared"]) == (1, 1, 1)
        else:
            assert seen["BeginPrepare"] == seen["Prepare"] == seen["CommitPrepared"] == 0
        assert seen["Origin"] == (1 if origin_sent else 0), seen
        # Everything delivered was acknowledged: the copy's confirmed_flush is past the end.
        assert collector.last_end is not None
        assert confirmed_flush(env.db, slot) >= collector.last_end
    finally:
        env.db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def check_rejected(
    env: Env,
    options: StreamOptions,
    problems: list[tuple[str, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1. The client refuses before it sends any command. The slot and the publication do not
    #    exist, so anything sent first would fail differently.
    sent: list[str] = []
    for method in ("execute", "start_replication", "send_copy_data", "create_slot"):
        original = getattr(ReplicationConnection, method)

        def spy(
            self: Any, *args: Any, _name: str = method, _orig: Any = original, **kw: Any
        ) -> Any:
            sent.append(_name)
            return _orig(self, *args, **kw)

        monkeypatch.setattr(ReplicationConnection, method, spy)
    missing = dataclasses.replace(options, publication_names=("no_such_publication",))
    client = ReplicationClient(
        env.db.dsn, "no_such_slot", missing, until_idle=True, reconnect=False
    )
    with pytest.raises(UnsupportedOption) as raised, client:
        for _ in client:
            raise AssertionError("a rejected combination streamed")
    assert sent == [], f"commands were sent before the option was rejected: {sent}"
    message = str(raised.value)
    assert any(all(token in message for token in problem) for problem in problems), (
        f"{message!r} names none of {problems}"
    )
    monkeypatch.undo()

    # 2. The server agrees: the same options, sent without negotiate(), are refused.
    with ReplicationConnection.connect(env.db.dsn) as conn:
        try:
            conn.start_replication(env.probe, INVALID_LSN, options)
        except ReplicationError:
            return
        conn.end_copy()
    raise AssertionError(f"the server accepted {options.command_options()}")


def test_negotiated_defaults_stream(env: Env) -> None:
    """No proto_version given: the server's highest is used and the workload streams."""
    options = StreamOptions((PUB,), messages=True, settings=SETTINGS)
    negotiated = options.negotiate(env.version_num)
    assert negotiated.proto_version == (4 if env.server.version >= 16 else 3)
    check_accepted(env, options, "defaults")


@pytest.mark.parametrize("proto", PROTOS)
def test_two_phase_slot_streamed_without_two_phase_option(pg: Database, proto: int) -> None:
    """A slot created with TWO_PHASE decodes prepared transactions at PREPARE time whatever
    the session asks for (logical.c: twophase = slot.two_phase || option given), so pgoutput
    sends Begin Prepare/Prepare/Commit Prepared even with two_phase off. pgcdc must either
    refuse such a session up front or decode it; it must not fail in the middle of the stream.
    """
    highest = 4 if pg.version >= 16 else 3
    if proto > highest:
        pytest.skip(f"proto_version {proto} is not supported by PostgreSQL {pg.version}")
    pg.execute(SETUP)
    slot = f"{pg.dbname}_2pc"
    with ReplicationConnection.connect(pg.dsn) as conn:
        conn.create_slot(slot, two_phase=True)
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1, 10, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'slot-gid'")
        conn.execute("COMMIT PREPARED 'slot-gid'")
    options = StreamOptions((PUB,), proto_version=proto)
    collector = Collector()
    try:
        with ReplicationClient(
            pg.dsn, slot, options, until_idle=True, reconnect=False, acknowledge=False
        ) as client:
            for _frame, message in client:
                collector.feed(message)
    except UnsupportedOption as exc:  # acceptable: refused before streaming
        assert "two_phase" in str(exc) or "two-phase" in str(exc)
        assert collector.seen.total() == 0
        return
    assert collector.transactions == [(("I", "t", ("1", "10", "prepared")),)]
