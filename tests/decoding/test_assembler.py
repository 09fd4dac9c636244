"""The transaction assembler from hand-built message sequences (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.decoding import (
    DecodingContext,
    OutputPlugin,
    SpillPool,
    TransactionAssembler,
    capabilities,
    load_plugin,
)
from pgcdc.errors import PluginLoadError, UnexpectedMessage
from pgcdc.protocol import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Insert,
    Lsn,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    UndecodedChanges,
    XLogData,
    encode,
    encode_frame,
)

REL = Relation(16384, "public", "t", "d", (Column(1, "id", 23, -1), Column(0, "v", 25, -1)))


def row(i: int, v: str = "x") -> TupleData:
    return TupleData(b"tt", (str(i).encode(), v.encode()))


def ins(i: int, xid: int | None = None) -> Insert:
    return Insert(REL.relid, row(i), xid)


class Recorder(OutputPlugin):
    """Logs every callback as a tuple."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []

    def begin(self, ctx, txn):
        self.log.append(("begin", txn.xid))

    def change(self, ctx, txn, relation, change):
        self.log.append(("change", txn.xid, change.new.values[0].decode()))

    def commit(self, ctx, txn, commit_lsn):
        self.log.append(("commit", txn.xid, commit_lsn))


class WithTruncate(Recorder):
    def truncate(self, ctx, txn, relations, change):
        self.log.append(("truncate", [r.relname for r in relations], change.cascade))


class WithMessages(Recorder):
    def message(self, ctx, txn, lsn, transactional, prefix, content):
        self.log.append(("message", txn and txn.xid, transactional, prefix, content))


class OriginFilter(Recorder):
    def filter_by_origin(self, ctx, origin):
        return origin == "remote"


class Streaming(Recorder):
    def stream_start(self, ctx, txn):
        self.log.append(("stream_start", txn.xid, txn.origin))

    def stream_stop(self, ctx, txn):
        self.log.append(("stream_stop", txn.xid))

    def stream_abort(self, ctx, txn, abort_lsn):
        self.log.append(("stream_abort", txn.xid))

    def stream_commit(self, ctx, txn, commit_lsn):
        self.log.append(("stream_commit", txn.xid, commit_lsn))

    def stream_change(self, ctx, txn, relation, change):
        self.log.append(("stream_change", txn.xid, change.subxid))


class TwoPhase(Recorder):
    def filter_prepare(self, ctx, xid, gid):
        return "_nodecode" in gid

    def begin_prepare(self, ctx, txn):
        self.log.append(("begin_prepare", txn.gid))

    def prepare(self, ctx, txn, prepare_lsn):
        self.log.append(("prepare", txn.gid))

    def commit_prepared(self, ctx, txn, commit_lsn):
        self.log.append(("commit_prepared", txn.gid))

    def rollback_prepared(self, ctx, txn, prepare_end_lsn, prepare_ts):
        self.log.append(("rollback_prepared", txn.gid))


def assemble(plugin: Recorder, *, two_phase: bool = False, **kwargs: Any) -> TransactionAssembler:
    caps = capabilities(type(plugin))
    ctx = DecodingContext(streaming=caps.streaming, two_phase=caps.two_phase and two_phase)
    return TransactionAssembler(plugin, ctx, **kwargs)


def feed(assembler: TransactionAssembler, *messages: Any) -> list[Lsn | None]:
    return [assembler.feed(m, Lsn(0)) for m in messages]


def L(n: int) -> Lsn:
    return Lsn(n)


# -- load-time rules ------------------------------------------------------------------------


def test_required_callbacks_are_named() -> None:
    class NoCommit(OutputPlugin):
        def begin(self, ctx, txn): ...
        def change(self, ctx, txn, relation, change): ...

    with pytest.raises(PluginLoadError, match="does not implement commit"):
        capabilities(NoCommit)


def test_half_a_streaming_group_is_refused() -> None:
    class Half(Recorder):
        def stream_start(self, ctx, txn): ...
        def stream_stop(self, ctx, txn): ...

    with pytest.raises(PluginLoadError, match="stream_abort, stream_commit, stream_change"):
        capabilities(Half)


def test_filter_prepare_alone_needs_the_two_phase_group() -> None:
    class OnlyFilter(Recorder):
        def filter_prepare(self, ctx, xid, gid):
            return False

    with pytest.raises(PluginLoadError, match="begin_prepare, prepare, commit_prepared"):
        capabilities(OnlyFilter)


def test_streaming_and_two_phase_need_stream_prepare() -> None:
    class Both(Streaming, TwoPhase):
        pass

    with pytest.raises(PluginLoadError, match="stream_prepare"):
        capabilities(Both)


def test_capabilities_of_complete_plugins() -> None:
    assert capabilities(Recorder).streaming is False
    assert capabilities(Streaming).streaming is True
    assert capabilities(TwoPhase).two_phase is True
    assert capabilities(WithMessages).has("message")


def test_load_plugin_by_name_and_by_path() -> None:
    assert load_plugin("json").__name__ == "JsonEnvelope"
    assert load_plugin(f"{__name__}:Recorder") is Recorder
    with pytest.raises(PluginLoadError, match="unknown output plugin"):
        load_plugin("nope")
    with pytest.raises(PluginLoadError, match="cannot import"):
        load_plugin("no_such_module_xyz:P")
    with pytest.raises(PluginLoadError, match="has no output plugin class"):
        load_plugin(f"{__name__}:Missing")


# -- ordinary transactions ------------------------------------------------------------------


def test_transaction_callbacks_and_confirmable_position() -> None:
    plugin = Recorder()
    a = assemble(plugin)
    acks = feed(a, REL, Begin(L(100), 0, 7), ins(1), ins(2), Commit(L(100), L(120), 0))
    assert plugin.log == [("begin", 7), ("change", 7, "1"), ("change", 7, "2"), ("commit", 7, 100)]
    assert acks == [None, None, None, None, L(120)]


def test_truncate_is_ignored_without_a_truncate_callback() -> None:
    plugin, with_cb = Recorder(), WithTruncate()
    messages = (REL, Begin(L(1), 0, 7), Truncate(1, (REL.relid,)), Commit(L(1), L(2), 0))
    feed(assemble(plugin), *messages)
    feed(assemble(with_cb), *messages)
    assert plugin.log == [("begin", 7), ("commit", 7, 1)]
    assert ("truncate", ["t"], True) in with_cb.log


def test_messages_transactional_and_not() -> None:
    plugin = WithMessages()
    a = assemble(plugin)
    acks = feed(
        a,
        Message(0, L(50), "p", b"now"),
        Begin(L(60), 0, 8),
        Message(1, L(55), "p", b"in txn"),
        Commit(L(60), L(70), 0),
    )
    assert plugin.log == [
        ("message", None, False, "p", b"now"),
        ("begin", 8),
        ("message", 8, True, "p", b"in txn"),
        ("commit", 8, 60),
    ]
    assert acks[0] == L(51), "handled: everything before the byte after its start"


def test_filter_by_origin_skips_the_whole_transaction_but_confirms_it() -> None:
    plugin = OriginFilter()
    a = assemble(plugin)
    acks = feed(
        a,
        REL,
        Begin(L(10), 0, 5),
        Origin(L(999), "remote"),
        ins(1),
        Commit(L(10), L(20), 0),
        Begin(L(30), 0, 6),
        Origin(L(999), "other"),
        ins(2),
        Commit(L(30), L(40), 0),
    )
    assert plugin.log == [("begin", 6), ("change", 6, "2"), ("commit", 6, 30)]
    assert acks[4] == L(20) and acks[-1] == L(40)
    assert a.stats.skipped_by_origin == 1


def test_only_local_emulation_skips_any_origin() -> None:
    plugin = Recorder()
    a = assemble(plugin, only_local=True)
    feed(a, REL, Begin(L(10), 0, 5), Origin(L(1), "x"), ins(1), Commit(L(10), L(20), 0))
    feed(a, Begin(L(30), 0, 6), ins(2), Commit(L(30), L(40), 0))
    assert plugin.log == [("begin", 6), ("change", 6, "2"), ("commit", 6, 30)]


# -- runs of undecoded row changes ------------------------------------------------------------

REL2 = Relation(16385, "public", "u", "d", REL.columns)


def run(*changes: tuple[int, Relation, int]) -> UndecodedChanges:
    """The XLogData frames of Inserts of (position, relation, id): what a stream with
    `undecoded_rows` hands over for rows that arrived together."""
    return UndecodedChanges(
        [
            encode_frame(XLogData(L(at), L(at), 0, encode(Insert(rel.relid, row(i)))))
            for at, rel, i in changes
        ]
    )


class Undecoded(Recorder):
    undecoded_rows = True

    def change(self, ctx, txn, relation, change):
        self.log.append(("change", txn.xid, relation.relname, change.lsn, change.raw))


class TakesRuns(Undecoded):
    def undecoded_changes(self, ctx, txn, relation_of, changes):
        self.log.append(
            ("run", txn.xid, [relation_of(c.relid).relname for _, c in changes.changes()])
        )


def test_a_run_of_row_changes_goes_to_the_plugin_at_once() -> None:
    """Also the run that starts a transaction (it runs the begin callback first); the changes
    count as the transaction's entries one by one."""
    plugin = TakesRuns()
    a = assemble(plugin)
    feed(a, REL, REL2, Begin(L(10), 0, 5), run((1, REL, 1), (2, REL2, 2), (3, REL, 3)))
    feed(a, run((4, REL2, 4)), Commit(L(10), L(20), 0))
    assert plugin.log == [
        ("begin", 5),
        ("run", 5, ["t", "u", "t"]),
        ("run", 5, ["u"]),
        ("commit", 5, 10),
    ]
    assert a.stats.changes == 4


def test_a_run_goes_change_by_change_to_a_plugin_without_runs() -> None:
    plugin = Undecoded()
    a = assemble(plugin)
    feed(a, REL, REL2, Begin(L(10), 0, 5), run((1, REL, 1), (2, REL2, 2)), Commit(L(10), L(20), 0))
    raw = [m.frames[i][25:] for m in [run((1, REL, 1), (2, REL2, 2))] for i in (0, 1)]
    assert plugin.log == [
        ("begin", 5),
        ("change", 5, "t", L(1), raw[0]),
        ("change", 5, "u", L(2), raw[1]),
        ("commit", 5, 10),
    ]


def test_a_run_of_a_skipped_or_held_transaction_is_not_taken_at_once() -> None:
    """A transaction filtered by its origin loses its run; a prepared one held until its
    COMMIT PREPARED (filter_prepare) gets its changes one by one then."""

    class Both(TakesRuns, OriginFilter, TwoPhase):
        pass

    plugin = Both()
    a = assemble(plugin, two_phase=True)
    feed(a, REL, Begin(L(10), 0, 5), Origin(L(9), "remote"), run((1, REL, 1)))
    feed(a, Commit(L(10), L(20), 0))
    feed(a, BeginPrepare(L(30), L(40), 0, 6, "g_nodecode"), run((31, REL, 2), (32, REL, 3)))
    feed(a, Prepare(L(30), L(40), 0, 6, "g_nodecode"))
    assert plugin.log == []
    feed(a, CommitPrepared(L(50), L(60), 0, 6, "g_nodecode"))
    assert [entry[:4] for entry in plugin.log] == [
        ("begin", 6),
        ("change", 6, "t", L(31)),
        ("change", 6, "t", L(32)),
        ("commit", 6, L(50)),
    ]


def test_a_run_outside_a_transaction_is_refused() -> None:
    with pytest.raises(UnexpectedMessage):
        feed(assemble(TakesRuns()), REL, run((1, REL, 1)))


# -- streamed transactions ------------------------------------------------------------------


def streamed_script(abort_sub: bool = True) -> list[Any]:
    """xid 900 in two blocks; subxact 901 (rows 3, 4) is rolled back in between."""
    script = [
        StreamStart(900, True),
        Relation(REL.relid, REL.namespace, REL.relname, "d", REL.columns, 900),
        ins(1, 900),
        ins(3, 901),
        StreamStop(),
        REL,
        Begin(L(50), 0, 950),  # an unrelated small transaction commits in between
        ins(100),
        Commit(L(50), L(60), 0),
        StreamStart(900, False),
        ins(4, 901),
        ins(2, 900),
        StreamStop(),
    ]
    if abort_sub:
        script.append(StreamAbort(900, 901))
    script.append(StreamCommit(900, L(200), L(210), 0))
    return script


def test_streamed_transaction_is_delivered_whole_at_stream_commit() -> None:
    plugin = Recorder()
    a = assemble(plugin)
    acks = feed(a, *streamed_script())
    assert plugin.log == [
        ("begin", 950),
        ("change", 950, "100"),
        ("commit", 950, 50),
        ("begin", 900),
        ("change", 900, "1"),
        ("change", 900, "2"),
        ("commit", 900, 200),
    ]
    assert acks[-1] == L(210)
    assert a.stats.streamed_buffered == 1


def test_streamed_transaction_aborted_at_top_level_is_dropped() -> None:
    plugin = Recorder()
    a = assemble(plugin)
    script = [*streamed_script()[:-1], StreamAbort(900, 900)]
    feed(a, *script)
    assert [entry[0] for entry in plugin.log] == ["begin", "change", "commit"]
    assert a.pool.memory_bytes == 0


def test_streaming_plugin_gets_blocks_with_subxids() -> None:
    plugin = Streaming()
    a = assemble(plugin)
    feed(a, *streamed_script())
    assert plugin.log == [
        ("stream_start", 900, None),
        ("stream_change", 900, 900),
        ("stream_change", 900, 901),
        ("stream_stop", 900),
        ("begin", 950),
        ("change", 950, "100"),
        ("commit", 950, 50),
        ("stream_start", 900, None),
        ("stream_change", 900, 901),
        ("stream_change", 900, 900),
        ("stream_stop", 900),
        ("stream_abort", 901),
        ("stream_commit", 900, 200),
    ]


def test_stream_origin_is_known_at_stream_start() -> None:
    plugin = Streaming()
    a = assemble(plugin)
    feed(a, REL, StreamStart(5, True), Origin(L(1), "o"), ins(1, 5), StreamStop())
    assert plugin.log[0] == ("stream_start", 5, "o")


@pytest.mark.parametrize("rows", [2000])
def test_streamed_transaction_larger_than_the_budget_spills_and_cleans_up(
    tmp_path: Path, rows: int
) -> None:
    plugin = Recorder()
    pool = SpillPool(memory_limit=20_000, directory=str(tmp_path))
    a = assemble(plugin, pool=pool)
    peak = 0
    feed(a, StreamStart(1, True), REL)
    for i in range(rows):
        sub = 2 if i % 10 == 0 else 1  # every tenth row in a subxact that is rolled back
        a.feed(Insert(REL.relid, row(i, "v" * 50), sub), Lsn(0))
        peak = max(peak, pool.memory_bytes)
    feed(a, StreamStop(), StreamAbort(1, 2), StreamCommit(1, L(10), L(20), 0))

    delivered = [int(e[2]) for e in plugin.log if e[0] == "change"]
    assert delivered == [i for i in range(rows) if i % 10 != 0]
    assert pool.spill_count > 5
    assert peak <= pool.memory_limit + 1000  # at most one entry over before it spills
    assert pool.memory_bytes == 0
    assert list(tmp_path.glob("pgcdc-spill-*/*")) == []  # spill files are gone
    a.close()
    assert list(tmp_path.iterdir()) == []


def test_stale_spill_directories_of_dead_processes_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / "pgcdc-spill-999999999-abc"
    stale.mkdir()
    (stale / "x.spill").write_bytes(b"old")
    pool = SpillPool(memory_limit=0, directory=str(tmp_path))
    buffer = pool.buffer("t")
    buffer.append(10, None, "payload")  # over a zero budget: spills at once
    assert not stale.exists()
    assert list(buffer) == ["payload"]
    pool.close()


def test_a_corrupt_spill_file_is_a_clear_error(tmp_path: Path) -> None:
    from pgcdc.errors import SpillError

    pool = SpillPool(memory_limit=0, directory=str(tmp_path))
    buffer = pool.buffer("t")
    buffer.append(10, None, "payload")
    assert buffer.path is not None
    data = bytearray(buffer.path.read_bytes())
    data[-1] ^= 0xFF
    buffer.path.write_bytes(bytes(data))
    with pytest.raises(SpillError, match="damaged: record at byte 0: checksum mismatch"):
        list(buffer)
    pool.close()


# -- two-phase ------------------------------------------------------------------------------


def prepared(gid: str, xid: int, at: int) -> list[Any]:
    return [
        BeginPrepare(L(at), L(at + 5), 0, xid, gid),
        ins(at),
        Prepare(L(at), L(at + 5), 0, xid, gid),
    ]


def test_two_phase_plugin_gets_prepare_callbacks() -> None:
    plugin = TwoPhase()
    a = assemble(plugin, two_phase=True)
    acks = feed(a, REL, *prepared("g1", 10, 100), CommitPrepared(L(150), L(160), 0, 10, "g1"))
    assert plugin.log == [
        ("begin_prepare", "g1"),
        ("change", 10, "100"),
        ("prepare", "g1"),
        ("commit_prepared", "g1"),
    ]
    assert acks[-2] == L(105) and acks[-1] == L(160)


def test_filter_prepare_defers_to_commit_prepared_and_holds_the_position() -> None:
    plugin = TwoPhase()
    a = assemble(plugin, two_phase=True)
    feed(a, REL, Begin(L(50), 0, 9), ins(50), Commit(L(50), L(60), 0))
    acks = feed(a, *prepared("g_nodecode", 10, 100))
    assert acks[-1] is None
    later = feed(a, Begin(L(200), 0, 11), ins(200), Commit(L(200), L(210), 0))
    assert later[-1] == L(210)
    a.acks.on_message(Begin(L(200), 0, 11), L(0))  # the stream's part: positions received
    a.acks.on_message(Commit(L(200), L(210), 0), L(210))
    a.acks.confirm(L(210))
    assert a.acks.flush_lsn == L(60)  # not past the held prepare
    final = feed(a, CommitPrepared(L(300), L(310), 0, 10, "g_nodecode"))
    assert final == [L(310)]
    assert plugin.log[-3:] == [("begin", 10), ("change", 10, "100"), ("commit", 10, 300)]


def test_rollback_prepared_of_a_held_transaction_drops_it() -> None:
    plugin = Recorder()  # no two-phase callbacks: every prepared transaction is held
    a = assemble(plugin)
    feed(a, REL, *prepared("g", 10, 100))
    acks = feed(a, RollbackPrepared(L(105), L(130), 0, 0, 10, "g"))
    assert plugin.log == []
    assert acks == [L(130)]
    assert a.acks.holds == {} and a.acks.handled == L(130)


def test_commit_prepared_for_an_unknown_gid() -> None:
    two_phase, plain = TwoPhase(), Recorder()
    message = CommitPrepared(L(150), L(160), 0, 10, "never-seen")
    assert feed(assemble(two_phase, two_phase=True), message) == [L(160)]
    assert two_phase.log == [("commit_prepared", "never-seen")]
    assert feed(assemble(plain), message) == [L(160)]
    assert plain.log == []


def test_streamed_prepared_transaction_without_streaming_callbacks() -> None:
    plugin = TwoPhase()
    a = assemble(plugin, two_phase=True)
    feed(
        a,
        StreamStart(7, True),
        REL,
        ins(1, 7),
        StreamStop(),
        StreamPrepare(L(40), L(45), 0, 7, "sp"),
        CommitPrepared(L(50), L(55), 0, 7, "sp"),
    )
    assert plugin.log == [
        ("begin_prepare", "sp"),
        ("change", 7, "1"),
        ("prepare", "sp"),
        ("commit_prepared", "sp"),
    ]


def test_reset_forgets_partial_state() -> None:
    """After a reconnect the server sends interrupted transactions again from their start:
    buffered streams are dropped, and an interrupted transaction begins again (as with the
    server's own plugins after a walsender restart; only commit makes output final)."""
    plugin = Recorder()
    a = assemble(plugin)
    feed(a, REL, StreamStart(1, True), ins(1, 1), StreamStop(), Begin(L(5), 0, 2), ins(5))
    assert a.pool.memory_bytes > 0
    a.reset()
    assert a.pool.memory_bytes == 0
    feed(a, Begin(L(5), 0, 2), ins(5), Commit(L(5), L(6), 0))
    feed(a, StreamStart(1, True), REL, ins(1, 1), StreamStop(), StreamCommit(1, L(8), L(9), 0))
    assert plugin.log == [
        ("begin", 2),
        ("change", 2, "5"),
        ("begin", 2),
        ("change", 2, "5"),
        ("commit", 2, 5),
        ("begin", 1),
        ("change", 1, "1"),
        ("commit", 1, 8),
    ]


def test_after_reset_finished_transactions_are_not_delivered_again() -> None:
    """A held prepare keeps the slot behind: the next session resends what followed it."""
    plugin = Recorder()
    a = assemble(plugin)
    first = [REL, Begin(L(50), 0, 9), ins(50), Commit(L(50), L(60), 0)]
    first += [*prepared("g", 10, 100), Begin(L(200), 0, 11), ins(200), Commit(L(200), L(210), 0)]
    feed(a, *first)
    assert a.acks.holds == {"g": L(60)}
    a.acks.handled_upto(L(210))
    a.acks.session_started()  # what the replication client does on a new session
    a.reset()
    resent = [*first[4:], CommitPrepared(L(300), L(310), 0, 10, "g")]
    # the client passes on what was not delivered before (the held prepare comes again)
    again = feed(a, *[m for _, m in a.acks.skip_delivered((None, m) for m in resent)])
    assert plugin.log == [
        ("begin", 9),
        ("change", 9, "50"),
        ("commit", 9, 50),
        ("begin", 11),
        ("change", 11, "200"),
        ("commit", 11, 200),
        ("begin", 10),
        ("change", 10, "100"),
        ("commit", 10, 300),
    ]
    assert again[-1] == L(310)
