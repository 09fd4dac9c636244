"""The pipeline with its targets and its state on an object store, for real: an S3 API (moto's
server) and Azure Blob (Azurite), both started on 127.0.0.1 by the fixtures of
``tests/clusters``. The initial copy and the stream into mirror, history and change log,
quarantine and recopy, `pgcdc status`; kills during the copy and between a batch's commits
and the slot's confirmation; a store that refuses is one line. Nothing of the pipeline's
own is written to the local disk but the spool."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import MonitoringError, StorageError
from pgcdc.monitoring import BatchLog
from pgcdc.protocol import Lsn
from pgcdc.storage import FileIO, open_file_io
from replication.helpers import assert_one_error_line, confirmed_flush, run_cli, unique
from spark.helpers import assert_identical, finish_child, pipeline_config, run_pipeline, start_child


@dataclass(frozen=True, slots=True)
class Store:
    """A fresh bucket (or container) on one of the servers: `root` is its URI."""

    kind: str
    root: str
    storage_options: dict[str, str]

    def io(self, name: str = "") -> FileIO:
        return open_file_io(f"{self.root}/{name}".rstrip("/"), self.storage_options)


@pytest.fixture(params=["s3", "azure"])
def store(request: pytest.FixtureRequest) -> Store:
    server = request.getfixturevalue("moto_s3" if request.param == "s3" else "azurite")
    return Store(request.param, server.new_root(), server.storage_options)


def on_store(config: dict[str, Any], store: Store) -> dict[str, Any]:
    """`config` with its targets and its state under the store's root."""
    config["target"] = {
        "path": f"{store.root}/lake",
        "state": f"{store.root}/state/{config['name']}",
        "storage_options": store.storage_options,
    }
    return config


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(_toml(v) for v in value) + "]"


def write_toml(config: dict[str, Any], path: Path) -> Path:
    """`config` as a pipeline.toml (the little TOML it needs)."""
    lines = [f"{k} = {_toml(v)}" for k, v in config.items() if not isinstance(v, dict)]

    def table(name: str, section: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        lines.extend(
            f"{json.dumps(k)} = {_toml(v)}" for k, v in section.items() if not isinstance(v, dict)
        )
        for key, inner in section.items():
            if isinstance(inner, dict):
                table(f"{name}.{key}", inner)

    for name, section in config.items():
        if isinstance(section, dict) and name != "tables":
            table(name, section)
    lines.append("[tables]")
    for table_name, modes in config["tables"].items():
        if isinstance(modes, dict):
            inner = ", ".join(f"{k} = {_toml(v)}" for k, v in modes.items())
            lines.append(f"{json.dumps(table_name)} = {{ {inner} }}")
        else:
            lines.append(f"{json.dumps(table_name)} = {_toml(modes)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def replay_changelog(store: Store, config: dict[str, Any], table: str) -> dict[str, dict[str, Any]]:
    """The rows a change log says its table holds now (its changes replayed in order), by
    their key column ``id``, each as the server's text of its columns."""
    from pgcdc.pipeline.config import parse_config
    from pgcdc.targets import open_target

    (spec,) = [
        s for s in parse_config(config).targets() if s.table == table and s.mode == "changelog"
    ]
    changes = open_target(spec.spec, app_id="pgcdc:test").to_arrow().to_pylist()
    rows: dict[str, dict[str, Any]] = {}
    for change in sorted(changes, key=lambda c: (c["commit_lsn"], c["ordinal"])):
        op = change["op"]
        if op == "truncate":
            rows.clear()
            continue
        if op in ("update", "delete"):
            rows.pop(dict(change["key"])["id"])
        if op in ("read", "insert", "update"):
            after = dict(change["after"])
            rows[after["id"]] = after
    columns = {c for row in rows.values() for c in row}  # a column added later: NULL before
    return {k: {c: row.get(c) for c in columns} for k, row in rows.items()}


def source_text(pg: Database, table: str) -> dict[str, dict[str, Any]]:
    """The table's rows as the server's text output, by ``id``."""
    columns = [
        r[0]
        for r in pg.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (table,),
        )
    ]
    select = ", ".join(f'"{c}"::text' for c in columns)
    return {
        row[0]: dict(zip(columns, row, strict=True))
        for row in pg.execute(f"SELECT {select} FROM {table}")
    }


def assert_all_equal(pg: Database, store: Store, config: dict[str, Any]) -> None:
    """Every mirror and history equal to its source (`assert_identical`), and every change
    log replays to it."""
    assert_identical(pg, config)
    for table, modes in config["tables"].items():
        if "changelog" in (modes["modes"] if isinstance(modes, dict) else modes):
            assert replay_changelog(store, config, table) == source_text(pg, table), table


SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10,2));
CREATE TABLE notes (id int PRIMARY KEY, body text);
"""
TABLES: dict[str, Any] = {
    "public.items": ["mirror", "history", "changelog"],
    "public.notes": {"modes": ["mirror"], "on_error": "quarantine"},
}


def prepare(pg: Database, rows: int) -> tuple[str, str]:
    """The tables with `rows` items and a few notes, a publication, no slot yet."""
    pg.execute(SCHEMA)
    pg.execute(
        "INSERT INTO items SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, %s) g", (rows,)
    )
    pg.execute("INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 20) g")
    publication = unique("pub")
    pg.execute(f"CREATE PUBLICATION {publication} FOR TABLE items, notes")
    return unique("store"), publication


def changes(pg: Database, round: int) -> None:
    """About 150 changes in a few transactions: inserts, updates (one of a key), deletes."""
    base = 100_000 * round
    pg.execute(
        f"INSERT INTO items SELECT {base} + g, 'new' || g, g FROM generate_series(1, 40) g;"
        f"UPDATE items SET v = 'round {round}' WHERE id % 37 = {round};"
        f"DELETE FROM items WHERE id % 61 = {round} AND id < 2000;"
        f"UPDATE items SET id = {base} + 900 WHERE id = {base} + 1;"
        f"INSERT INTO notes VALUES ({base}, 'round {round}')"
    )


# -- the storage interface on each store -------------------------------------------------


@pytest.fixture(params=["local", "s3", "azure"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return Store("local", str(tmp_path / "root"), {})
    return request.getfixturevalue("store_" + request.param)  # type: ignore[no-any-return]


@pytest.fixture
def store_s3(moto_s3: Any) -> Store:
    return Store("s3", moto_s3.new_root(), moto_s3.storage_options)


@pytest.fixture
def store_azure(azurite: Any) -> Store:
    return Store("azure", azurite.new_root(), azurite.storage_options)


def test_state_files(any_store: Store) -> None:
    """Absent is None, a file reads back what was written, a rewrite replaces it whole,
    names list per directory, trees go at once, a child sees its part."""
    io = any_store.io("state")
    io.check()
    assert io.read("slot.json") is None and not io.exists("slot.json") and io.list() == []
    io.write("slot.json", b'{"v": 1}')
    io.write("slot.json", b'{"v": 2}')
    io.write("pending/public.t/_delta_log/0.json", b"{}")
    io.write("batches/0000000001.jsonl", b"line\n", durable=False)
    assert io.read("slot.json") == b'{"v": 2}'
    assert io.list() == ["slot.json"] and io.list("batches") == ["0000000001.jsonl"]
    assert io.exists("pending/public.t") and io.exists("pending")
    assert io.child("batches").read("0000000001.jsonl") == b"line\n"
    assert io.location("slot.json") == f"{any_store.root}/state/slot.json"
    io.delete_tree("pending/public.t")
    io.delete("slot.json")
    io.delete("slot.json")  # (absent: nothing to do)
    assert not io.exists("pending") and io.read("slot.json") is None
    io.delete_tree()
    assert io.list("batches") == [] and not io.exists("batches")


def test_a_rewrite_is_never_seen_in_part(any_store: Store) -> None:
    """Readers that read while a file is rewritten (a few hundred kB, many times) always get
    one whole version."""
    io = any_store.io("state")
    versions = [json.dumps({"v": i, "pad": str(i) * 60_000}).encode() for i in range(12)]
    io.write("copy.json", versions[0])
    seen: set[int] = set()
    torn: list[bytes] = []
    failed: list[StorageError] = []
    stop = threading.Event()

    def read() -> None:
        reader = any_store.io("state")
        while not stop.is_set():
            try:
                data = reader.read("copy.json")
            except StorageError as exc:  # the writer outlasted the reader's patience
                failed.append(exc)
                return
            try:
                seen.add(json.loads(data or b"")["v"])
            except ValueError:
                torn.append((data or b"")[:80])

    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(3):
            for version in versions:
                io.write("copy.json", version)
    finally:
        stop.set()
        for thread in readers:
            thread.join(60)
    assert not torn, torn[:3]
    assert not failed, failed
    assert len(seen) > 1


class _BetweenSizeAndBytes:
    """A reader's handler that runs `during` (once) after a read asked the object's size
    and before it reads the bytes, and `after` once those bytes are read."""

    def __init__(self, io: FileIO, during: Callable[[], None], after: Callable[[], None]) -> None:
        self.handler = io._handler  # type: ignore[attr-defined]
        self.pending = [(during, after)]
        io._handler = self  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handler, name)

    def open_input_file(self, name: str) -> Any:
        file = self.handler.open_input_file(name)
        pending = self.pending

        class File:
            def size(self) -> int:
                return int(file.size())

            def read(self, size: int) -> bytes:
                if not pending:
                    return file.read(size)  # type: ignore[no-any-return]
                during, after = pending.pop()
                during()
                data: bytes = file.read(size)
                after()
                return data

        return File()


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_a_rewrite_back_to_the_same_size_during_a_read_is_not_seen(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The interleaving that tore a read on Azure, made to happen: between the size asked and
    the bytes read, a longer version is written (the read gets its start), and before the
    size is asked again a version of the first size (the size alone cannot tell). The read
    gives a whole version."""
    store: Store = request.getfixturevalue("store_" + kind)
    short = [json.dumps({"v": i, "pad": "s" * 1000}).encode() for i in range(2)]
    long = json.dumps({"v": 9, "pad": "l" * 5000}).encode()
    writer = store.io("state")
    writer.write("copy.json", short[0])
    reader = store.io("state")
    racer = _BetweenSizeAndBytes(
        reader,
        lambda: writer.write("copy.json", long),
        lambda: writer.write("copy.json", short[1]),
    )
    assert reader.read("copy.json") == short[1]
    assert not racer.pending


@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_an_object_removed_during_a_read_is_absent(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The class beside: the object goes between the size asked and the bytes read (a
    state file removed by a pipeline that finishes its copy): the read says absent, not an
    error and not the bytes of a version that is gone."""
    store: Store = request.getfixturevalue("store_" + kind)
    writer = store.io("state")
    writer.write("copy.json", b'{"v": 1}')
    reader = store.io("state")
    racer = _BetweenSizeAndBytes(reader, lambda: writer.delete("copy.json"), lambda: None)
    assert reader.read("copy.json") is None
    assert not racer.pending


def test_the_batch_log_without_append(any_store: Store) -> None:
    """The batch log on the store: segments written whole, the oldest dropped, a writer that
    starts again goes on with the newest segment."""
    from monitoring.helpers import batch_records

    records = batch_records(60)
    size = max(len(json.dumps(r.to_json(), separators=(",", ":"))) + 1 for r in records)
    limits = {"max_bytes": 30 * size, "segment_bytes": 8 * size}
    io = any_store.io("state/batches")
    log = BatchLog(io, **limits)
    for record in records[:25]:
        log.append(record)
    log = BatchLog(io, **limits)  # another run
    for record in records[25:]:
        log.append(record)
    kept = BatchLog(any_store.io("state/batches")).read()
    assert 24 <= len(kept) < 60 and kept == records[-len(kept) :]
    assert len(io.list()) <= 4


def test_a_store_that_refuses_is_one_line(
    moto_s3: Any, azurite: Any, store_s3: Store, store_azure: Store
) -> None:
    """A missing bucket or container, a wrong key: one line naming the URI and the store's
    reason, on the first use (a missing bucket is not taken for an absent file)."""
    refusing = [
        ("s3://pgcdcnosuchbucket/state", store_s3.storage_options, "NoSuchBucket"),
        ("az://pgcdcnosuchcontainer/state", store_azure.storage_options, "ContainerNotFound"),
        (
            f"{store_azure.root}/state",
            {**store_azure.storage_options, "AZURE_STORAGE_ACCOUNT_KEY": "d3Jvbmc="},
            "AuthorizationFailure",
        ),
    ]
    for uri, options, reason in refusing:
        io = open_file_io(uri, options)
        for use in (io.check, lambda io=io: io.read("slot.json")):
            with pytest.raises(StorageError) as refused:
                use()
            line = str(refused.value)
            assert line.startswith(f"{uri}: the store refuses: {reason}"), line
            assert "\n" not in line and "\x1b" not in line, line
        with pytest.raises(StorageError, match=f"^{uri}/slot.json: cannot write it: {reason}"):
            io.write("slot.json", b"{}")
        with pytest.raises(MonitoringError, match=f"cannot read the batch log: {uri}.*{reason}"):
            BatchLog.at(uri, options).read()


# -- the pipeline ---------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("where", ["state", "targets"])
def test_the_pipeline_refuses_a_refusing_store_in_one_line(
    pg: Database, tmp_path: Path, store_azure: Store, where: str
) -> None:
    """`pgcdc run` and `pgcdc status` with the state, or the targets, in a container that
    does not exist: one line naming the setting and the URI, before a slot is made."""
    if pg.version < 18:
        pytest.skip("the storage is the same on every server")
    slot, publication = prepare(pg, 10)
    config = on_store(
        pipeline_config(pg, slot, publication, tmp_path / "lake", TABLES), store_azure
    )
    config["source"]["create_slot"] = True
    missing = store_azure.root + "x"  # a container of another name
    setting = "target.state" if where == "state" else "target.path"
    config["target"]["state" if where == "state" else "path"] = f"{missing}/{where}"
    toml = write_toml(config, tmp_path / "pipeline.toml")
    assert_one_error_line(
        run_cli("run", str(toml)), f"{setting} {missing}/{where}: ", "ContainerNotFound"
    )
    assert pg.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}'") == []
    if where == "state":
        assert_one_error_line(
            run_cli("status", str(toml)), f"{missing}/state: the store refuses: ContainerNotFound"
        )


@pytest.mark.server
def test_copy_stream_quarantine_and_recopy_on_the_store(
    spark: Any, pg: Database, tmp_path: Path, store: Store
) -> None:
    """The copy (Spark tasks writing chunks to the store), batches applied by the driver and
    by Spark jobs, a table quarantined (its changes go to its pending log on the store),
    copied again by `pgcdc recopy` (targets removed on the store) and resynchronized (staged
    on the store), `pgcdc status` reading the state from there: every target equal to its
    source at each step."""
    if pg.version < 18:
        pytest.skip("the storage is the same on every server")
    from pgcdc.cli.status import pipeline_sections
    from pgcdc.pipeline import request_recopy
    from pgcdc.pipeline.config import parse_config

    slot, publication = prepare(pg, 3000)
    local = tmp_path / "local"
    config = on_store(pipeline_config(pg, slot, publication, local, TABLES), store)
    config["source"]["create_slot"] = True
    config["snapshot"] = {"chunk_blocks": 4}  # several chunks, in parallel tasks
    first = run_pipeline(spark, config)
    assert first.copy_progress["public.items"].chunks > 1
    assert_all_equal(pg, store, config)

    state = store.io(f"state/{config['name']}")
    assert {"slot.json", "snapshot.json", "tables.json"} <= set(state.list())
    assert json.loads(state.read("snapshot.json") or b"")["status"] == "done"
    assert json.loads(state.read("slot.json") or b"")["slot"] == slot
    assert not local.exists(), "nothing of the pipeline's own on the local disk"

    changes(pg, 1)  # applied by the driver (a small batch)
    run_pipeline(spark, config)
    changes(pg, 2)
    pg.execute("ALTER TABLE items ADD COLUMN extra text")
    pg.execute("UPDATE items SET extra = 'y' WHERE id % 5 = 0")
    config["trigger"]["inline_max_changes"] = 0  # by a Spark job's tasks
    run_pipeline(spark, config)
    assert_all_equal(pg, store, config)
    assert state.list("batches"), "the batch log is on the store"

    # A change notes' targets cannot take: notes is set aside, its changes go on into its
    # pending change log on the store while items streams on and the slot moves.
    pg.execute("ALTER TABLE notes ALTER id TYPE text USING 'k' || id")
    pg.execute("UPDATE notes SET body = 'after' WHERE id = 'k3'; DELETE FROM notes WHERE id = 'k4'")
    held = confirmed_flush(pg, slot)
    changes(pg, 3)
    pipeline = run_pipeline(spark, config)
    assert pipeline.quarantine.records()["public.notes"].status == "quarantined"
    assert confirmed_flush(pg, slot) > held
    assert state.exists("pending/public.notes/_delta_log/00000000000000000000.json")
    toml = write_toml(config, tmp_path / "pipeline.toml")
    shown = {s.key: s.data for s in pipeline_sections(toml) if s.key is not None}
    assert shown["stopped_tables"]["public.notes"]["status"] == "quarantined"
    assert shown["batches"]["count"] >= 3
    assert shown["targets"]["public.items mirror"]["exists"]

    removed = request_recopy(parse_config(config), "public.notes")
    assert removed == [f"{store.root}/lake/public.notes"]
    assert not store.io("lake").exists("public.notes")
    pg.execute("UPDATE notes SET body = 'recopied' WHERE id = 'k6'")
    pipeline = run_pipeline(spark, config)
    assert pipeline.quarantine.records() == {}
    assert not state.exists("pending/public.notes")
    assert_all_equal(pg, store, config)

    # Out of its publication and back while the pipeline was stopped: the change made in
    # between never comes, so the table is resynchronized (copied to a staging table in the
    # state on the store, its targets reconciled with it).
    pg.execute(f"ALTER PUBLICATION {publication} DROP TABLE notes")
    pg.execute("UPDATE notes SET body = 'unseen' WHERE id = 'k7'")
    pg.execute(f"ALTER PUBLICATION {publication} ADD TABLE notes")
    run_pipeline(spark, config)
    assert_all_equal(pg, store, config)
    assert not state.exists("resync") and not local.exists()


@pytest.mark.server
def test_killed_during_the_copy_and_between_commit_and_confirm(
    spark: Any, pg: Database, tmp_path: Path, store: Store
) -> None:
    """A pipeline process killed mid-copy: the next run copies again from the start, under
    a new slot. One killed right after a batch's commits to the store, before the slot was
    confirmed: the next run gets the batch again and its targets skip it. Every target
    equals its source, and the slot's record on the store is never behind the slot."""
    if pg.version < 18:
        pytest.skip("the storage is the same on every server")
    from pgcdc.pipeline import BatchReport, Pipeline
    from pgcdc.pipeline.config import parse_config

    slot, publication = prepare(pg, 3000)
    tables = {"public.items": ["mirror", "history"], "public.notes": "mirror"}
    config = pipeline_config(pg, slot, publication, tmp_path / "local", tables)
    config = on_store(config, store)
    config["source"]["create_slot"] = True
    config["snapshot"] = {"chunk_blocks": 4}
    config["trigger"]["max_changes_per_batch"] = 100
    state = store.io(f"state/{config['name']}")

    code, output = finish_child(start_child(config, "--exit-after-chunks", "public.items:2"))
    assert code == 3, output
    copying = json.loads(state.read("snapshot.json") or b"")
    assert copying["status"] == "copying"
    changes(pg, 1)
    run_pipeline(spark, config)
    done = json.loads(state.read("snapshot.json") or b"")
    assert done["status"] == "done" and done["point"] != copying["point"]
    assert_all_equal(pg, store, config)

    for round in (2, 3, 4):
        changes(pg, round)
    code, output = finish_child(start_child(config, "--exit-after-batches", "2"))
    assert code == 3, output
    changes(pg, 5)
    reports: list[BatchReport] = []
    Pipeline(parse_config(config), spark, on_batch=reports.append).run()
    # The slot sent what the killed run had committed again; the targets held it already.
    assert reports and reports[0].skipped > 0, reports[:1]
    assert_all_equal(pg, store, config)
    recorded = Lsn.parse(json.loads(state.read("slot.json") or b"")["confirmed"])
    assert recorded >= confirmed_flush(pg, slot) > Lsn(0)
