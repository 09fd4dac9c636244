"""Merge-on-read (deletion vectors written by pgcdc) against copy-on-write MERGE (delta-rs).

What is measured
    A mirror-shaped table: ``id bigint`` (the key), ``a int``, ``b numeric(14,2)``,
    ``c timestamptz``, ``d`` ~100 bytes of JSON-ish text; written sorted by ``id`` in files of
    ``delta.targetFileSize`` = 8 MB (``--rows``, 2 M and 20 M by default). Two copies of it:

    cow  delta-rs 1.6's MERGE, as pgcdc applies a batch today but with an explicit target
         predicate so that delta-rs prunes files: ``t.id IN (<keys>) AND t.id = s.id``,
         update when matched, insert otherwise. Every file holding a key is rewritten.
    dv   ``pgcdc.targets._mor``: the batch's keys located (file statistics, then the cached
         per-file key index), their rows marked deleted in one DV file, the new row versions
         appended, one commit (with the watermark).

    Per batch of N random updates (``--batches``, 1, 100 and 10,000 by default): the bytes
    the commit writes (data files, DV file, log entry), the rewrite amplification (those bytes
    / N x the table's bytes per row) and the process's CPU seconds (all threads); the first
    batch of the dv method also builds the key index of each file it touches ("cold"), the
    later ones use it (the median of the warm batches is shown, with the cold one).

    Then ``--steady`` seconds (600 by default) of steady random updates on the 2 M-row dv copy:
    a batch of ``--rate`` updates every second, and the maintenance policy every
    ``--maintain-every`` batches (purge files past 30% deleted, compact small files, lite
    vacuum with ``delta.deletedFileRetentionDuration`` = ``--retention``, collection of
    unreferenced DV files, a checkpoint every 100 commits). The lake's size (every file under
    the table) is sampled every 30 s, with the live size (the bytes of the live files).

    The machine is shared (2 cores): CPU seconds and bytes are the columns to trust; wall
    times are shown for completeness.

How to run (from the repository root; several GB of disk under ``--data``)
    nice -n 10 .venv/bin/python benchmarks/deletion_vectors.py --rows 200000 --steady 30
    nice -n 10 .venv/bin/python benchmarks/deletion_vectors.py          # 2 M + 20 M, 10 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pgcdc.targets._mor import (
    MaintenancePolicy,
    MergeOnReadTable,
    RowLocator,
    commit_delete_and_append,
    enable_deletion_vectors,
    logical_row_count,
    maintain_deletion_vectors,
)

FILE_BYTES = 8 << 20
CHUNK = 1_000_000
_WORDS = np.array(
    ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"], "S8"
)
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def rows(ids: np.ndarray, version: int) -> pa.Table:
    """Rows for `ids` (a version number goes into ``c`` and ``d``)."""
    n = len(ids)
    rng = np.random.default_rng(int(ids[0]) * 7919 + version if n else 0)
    cents = np.zeros((n, 2), np.int64)
    cents[:, 0] = rng.integers(0, 10_000_000, n)
    b = pa.Array.from_buffers(pa.decimal128(14, 2), n, [None, pa.py_buffer(cents.tobytes())])
    c = pa.array(
        1_700_000_000_000_000 + ids.astype(np.int64) * 1000 + version,
        pa.timestamp("us", "UTC"),
    )
    tag = _WORDS[rng.integers(0, len(_WORDS), n)]
    ref = _HEX[rng.integers(0, 16, (n, 32))].view("S32").ravel()
    d = pc.binary_join_element_wise(
        pa.array(np.char.add(b'{"user":', rng.integers(0, 99_999, n).astype("S5")), pa.binary()),
        pa.array(np.char.add(b',"tag":"', tag), pa.binary()),
        pa.array(np.char.add(b'","ref":"', ref), pa.binary()),
        pa.array(np.full(n, f'","status":"active","v":{version}}}'.encode()), pa.binary()),
        b"",
    ).cast(pa.string())
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "a": pa.array(rng.integers(0, 1_000_000, n), pa.int32()),
            "b": b,
            "c": c,
            "d": d,
        }
    )


def table_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, names in os.walk(path)
        if "_delta_log" not in d
        for f in names
    )


def lake_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def live_bytes(table: DeltaTable) -> int:
    return int(pc.sum(pa.table(table.get_add_actions(flatten=True)).column("size_bytes")).as_py())


def base_table(data: str, count: int) -> str:
    """The base table of `count` rows under `data` (built once, reused)."""
    path = os.path.join(data, f"base-{count}")
    if os.path.exists(os.path.join(path, "_delta_log")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    configuration = {
        "delta.targetFileSize": str(FILE_BYTES),
        "delta.deletedFileRetentionDuration": "interval 0 seconds",
    }
    for start in range(0, count, CHUNK):
        ids = np.arange(start, min(count, start + CHUNK))
        write_deltalake(
            path,
            rows(ids, 0),
            mode="append",
            target_file_size=FILE_BYTES,
            configuration=configuration if start == 0 else None,
        )
    return path


def copy(base: str, path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(base, path)
    return path


@dataclass
class Clock:
    cpu: float = 0.0
    wall: float = 0.0

    def __enter__(self) -> Clock:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = time.process_time() - self._cpu
        self.wall = time.perf_counter() - self._wall


def commit_bytes(path: str, version: int) -> int:
    """Bytes a delta-rs commit wrote: the files it added and its log entry."""
    log = os.path.join(path, "_delta_log", f"{version:020d}.json")
    added = 0
    with open(log) as f:
        for line in f:
            action = json.loads(line)
            if "add" in action:
                added += int(action["add"]["size"])
    return added + os.path.getsize(log)


def cow_batch(table: DeltaTable, ids: np.ndarray, version: int) -> tuple[int, Clock]:
    source = rows(ids, version)
    keys = ", ".join(map(str, ids.tolist()))
    with Clock() as clock:
        (
            table.merge(
                source,
                f"t.id IN ({keys}) AND t.id = s.id",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    return commit_bytes(table.table_uri.removeprefix("file://"), table.version()), clock


def dv_batch(
    mor: MergeOnReadTable, locator: RowLocator, ids: np.ndarray, version: int
) -> tuple[int, Clock]:
    source = rows(ids, version)
    with Clock() as clock:
        matches = locator.locate(source.select(["id"]))
        result = commit_delete_and_append(
            mor, matches.by_file(), source, ("bench", version), {"pgcdc.columns": "[]"}
        )
    return result.data_bytes + result.dv_bytes + result.log_bytes, clock


@dataclass
class Cell:
    method: str
    rows: int
    batch: int
    bytes_written: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)


def amplification(
    data: str, count: int, batches: list[int], reps: int, methods: set[str], out: list[Cell]
) -> None:
    base = base_table(data, count)
    row_bytes = table_bytes(base) / count
    files = len(DeltaTable(base).file_uris())
    print(f"\n{count:,} rows, {files} files, {row_bytes:.1f} bytes a row", flush=True)
    rng = np.random.default_rng(count)
    cow_path = os.path.join(data, "cow")
    cow = DeltaTable(copy(base, cow_path)) if "cow" in methods else None
    dv_table = DeltaTable(copy(base, os.path.join(data, "dv")))
    enable_deletion_vectors(dv_table)
    mor = MergeOnReadTable(dv_table)
    locator = RowLocator(mor, ["id"])
    version = 0
    for batch in batches:
        cells = {m: Cell(m, count, batch) for m in ("cow", "dv")}
        for rep in range(reps + 1):  # dv: one cold batch, then `reps` warm ones
            ids = np.sort(rng.choice(count, batch, replace=False))
            version += 1
            runs: list[tuple[str, Callable[[], tuple[int, Clock]]]] = [
                ("dv", lambda ids=ids, v=version: dv_batch(mor, locator, ids, v))
            ]
            if rep < reps and cow is not None:
                runs.append(("cow", lambda ids=ids, v=version, t=cow: cow_batch(t, ids, v)))
            for method, run in runs:
                written, clock = run()
                cell = cells[method]
                cell.bytes_written.append(written)
                cell.cpu.append(clock.cpu)
                cell.wall.append(clock.wall)
        for cell in cells.values():
            if cell.cpu:
                out.append(cell)
                show_cell(cell, row_bytes)
    assert logical_row_count(dv_table) == count
    shutil.rmtree(cow_path, ignore_errors=True)
    shutil.rmtree(mor.table_dir, ignore_errors=True)


def show_cell(cell: Cell, row_bytes: float) -> None:
    changed = cell.batch * row_bytes
    if cell.method == "dv":
        cold = (cell.bytes_written[0], cell.cpu[0])
        warm_bytes = statistics.median(cell.bytes_written[1:])
        warm_cpu = statistics.median(cell.cpu[1:])
        warm_wall = statistics.median(cell.wall[1:])
        extra = f"   (cold: {cold[0] / 1e6:.2f} MB, {cold[1]:.3f} CPU-s)"
    else:
        warm_bytes = statistics.median(cell.bytes_written)
        warm_cpu = statistics.median(cell.cpu)
        warm_wall = statistics.median(cell.wall)
        extra = ""
    print(
        f"  {cell.method:4} {cell.batch:>7,} updates  {warm_bytes / 1e6:10.2f} MB written"
        f"  x{warm_bytes / changed:>10,.1f}  {warm_cpu:7.3f} CPU-s  {warm_wall:7.2f} s{extra}",
        flush=True,
    )


def steady(data: str, count: int, seconds: float, rate: int, every: int, retention: str) -> None:
    base = base_table(data, count)
    table = DeltaTable(copy(base, os.path.join(data, "steady")))
    enable_deletion_vectors(table)
    table.alter.set_table_properties(
        {
            "delta.deletedFileRetentionDuration": retention,
            "delta.logRetentionDuration": "interval 0 seconds",
        }
    )
    mor = MergeOnReadTable(table)
    locator = RowLocator(mor, ["id"])
    policy = MaintenancePolicy(purge_fraction=0.3, compact_min_files=8, min_orphan_age_s=60)
    rng = np.random.default_rng(1)
    row_bytes = table_bytes(base) / count
    print(
        f"\nsteady: {rate:,} random updates/s on {count:,} rows for {seconds:.0f} s, "
        f"maintenance every {every} batches, retention {retention!r}",
        flush=True,
    )
    print("    time   lake MB   live MB   files  batches  CPU-s/batch  maint CPU-s  written MB")
    start = time.perf_counter()
    batch_cpu: list[float] = []
    maintain_cpu = 0.0
    written = 0
    version = 0
    next_sample = 0.0
    while (elapsed := time.perf_counter() - start) < seconds:
        if elapsed >= next_sample:
            mor.sync()
            print(
                f"  {elapsed:6.0f}  {lake_bytes(mor.table_dir) / 1e6:8.1f}  "
                f"{sum(a['size'] for a in mor.state.adds.values()) / 1e6:8.1f}  "
                f"{len(mor.state.adds):6}  {len(batch_cpu):7}  "
                f"{statistics.median(batch_cpu) if batch_cpu else 0:11.3f}  "
                f"{maintain_cpu:11.2f}  {written / 1e6:10.1f}",
                flush=True,
            )
            next_sample += 30
        version += 1
        ids = np.sort(rng.choice(count, rate, replace=False))
        size, clock = dv_batch(mor, locator, ids, version)
        written += size
        batch_cpu.append(clock.cpu)
        if version % every == 0:
            before = {os.path.join(mor.table_dir, a["path"]) for a in mor.state.adds.values()}
            with Clock() as maint:
                maintain_deletion_vectors(mor, policy)
            maintain_cpu += maint.cpu
            written += sum(
                a["size"]
                for a in mor.state.adds.values()
                if os.path.join(mor.table_dir, a["path"]) not in before
            )
        pause = version - (time.perf_counter() - start)  # one batch a second
        if pause > 0:
            time.sleep(pause)
    hours = (time.perf_counter() - start) / 3600
    changed = len(batch_cpu) * rate * row_bytes
    print(
        f"  {len(batch_cpu)} batches ({len(batch_cpu) / (hours * 3600):.2f}/s); written "
        f"{written / 1e6:.0f} MB = x{written / changed:.1f} the changed bytes, "
        f"{written / hours / 1e9:.1f} GB/h; lake {lake_bytes(mor.table_dir) / 1e6:.0f} MB; "
        f"rows {logical_row_count(mor.table):,}",
        flush=True,
    )
    shutil.rmtree(mor.table_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2000000,20000000")
    parser.add_argument("--batches", default="1,100,10000")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--methods", default="cow,dv", help="cow: delta-rs MERGE too")
    parser.add_argument("--steady", type=float, default=600)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--maintain-every", type=int, default=30)
    parser.add_argument("--retention", default="interval 2 minutes")
    parser.add_argument("--data", default="/tmp/pgcdc-bench-dv")
    parser.add_argument("--keep", action="store_true", help="keep the base tables")
    args = parser.parse_args()
    os.makedirs(args.data, exist_ok=True)
    counts = [int(n) for n in args.rows.split(",")]
    cells: list[Cell] = []
    for count in counts:
        batches = [int(b) for b in args.batches.split(",")]
        methods = set(args.methods.split(","))
        amplification(args.data, count, batches, args.reps, methods, cells)
    if args.steady > 0:
        steady(args.data, counts[0], args.steady, args.rate, args.maintain_every, args.retention)
    if not args.keep:
        shutil.rmtree(args.data, ignore_errors=True)


if __name__ == "__main__":
    main()
