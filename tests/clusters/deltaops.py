"""delta-rs operations the object-store tests run against a store: a writer that commits from
a stale snapshot, and writers in separate processes that commit at the same moment."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

__all__ = ["CommitRace", "race_appends", "stale_append"]


def _rows(*keys: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([f"v{k}" for k in keys])})


def stale_append(uri: str, options: dict[str, str]) -> tuple[int, list[int]]:
    """Writers A and B both load the table at version 0; A appends (version 1), then B
    appends from its stale snapshot: delta-rs finds version 1 and commits B as version 2,
    (2, [0, 1, 2]). Returns (table version, keys)."""
    write_deltalake(uri, _rows(0), storage_options=options)
    a = DeltaTable(uri, storage_options=options)
    b = DeltaTable(uri, storage_options=options)
    write_deltalake(a, _rows(1), mode="append")
    write_deltalake(b, _rows(2), mode="append")
    table = DeltaTable(uri, storage_options=options)
    return table.version(), sorted(table.to_pyarrow_table()["k"].to_pylist())


@dataclass(frozen=True, slots=True)
class CommitRace:
    version: int
    keys: list[int]
    errors: list[str]


def _racer(uri: str, options: dict[str, str], key: int, start: Any, results: Any) -> None:
    try:
        table = DeltaTable(uri, storage_options=options)
        start.wait(60)
        write_deltalake(table, _rows(key), mode="append")
        results.put((key, ""))
    except Exception as exc:
        results.put((key, f"{type(exc).__name__}: {exc}"))


def race_appends(uri: str, options: dict[str, str], writers: int) -> CommitRace:
    """``writers`` processes load the table at version 0, wait for each other, and append
    one row each at the same moment."""
    write_deltalake(uri, _rows(0), storage_options=options)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(writers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(uri, options, key, start, results))
        for key in range(1, writers + 1)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(60)
    table = DeltaTable(uri, storage_options=options)
    return CommitRace(
        version=table.version(),
        keys=sorted(table.to_pyarrow_table()["k"].to_pylist()),
        errors=[f"writer {key}: {error}" for key, error in outcomes if error],
    )
