"""Work dispatched to executors the way that works on classic and Spark Connect sessions alike:
a small DataFrame of work items (``id int, payload binary``) mapped with ``mapInArrow`` by a
function that returns one outcome row per item, collected on the driver. No RDD, no
SparkContext, no accumulator.

The functions here run on executors: they import what they need inside, and they must yield
Arrow batches whose types are exactly the declared schema's (an int64 column declared ``int``
fails in the JVM with ``Cannot call the method "getInt"``). This module must be importable on
the executors (the cluster fixtures put ``tests/`` on their PYTHONPATH) so that its
module-level state lives as long as the Python worker that imported it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

__all__ = [
    "DIGEST_SCHEMA",
    "READ_SCHEMA",
    "WORK_SCHEMA",
    "digest_items",
    "dispatch",
    "read_paths",
    "work_frame",
]

WORK_SCHEMA = pa.schema([("id", pa.int32()), ("payload", pa.binary())])

#: One row per work item: who ran it and what it saw.
DIGEST_SCHEMA = (
    "id int, size long, sha256 string, pid int, tmpdir string, cwd string, "
    "pgcdc string, worker_items long, worker_batches long"
)
READ_SCHEMA = "id int, path string, outcome string, pid int, tmpdir string"

#: Module-level state of a Python worker: it survives between tasks (and jobs) only when
#: Spark reuses the worker process (``spark.python.worker.reuse``, the default).
_WORKER_STATE: dict[str, int] = {"items": 0, "batches": 0}


def work_frame(spark: Any, items: Sequence[tuple[int, bytes]]) -> Any:
    """The DataFrame of work items; ``createDataFrame`` of an Arrow table works on a classic
    and a Connect session (on Connect the bytes travel inside the plan)."""
    table = pa.table(
        {
            "id": pa.array([i for i, _ in items], pa.int32()),
            "payload": pa.array([p for _, p in items], pa.binary()),
        },
        schema=WORK_SCHEMA,
    )
    return spark.createDataFrame(table)


def dispatch(
    spark: Any,
    items: Sequence[tuple[int, bytes]],
    fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: str,
) -> pa.Table:
    """Run ``fn`` over the work items on the executors; its outcome rows, as an Arrow table."""
    return work_frame(spark, items).mapInArrow(fn, schema).toArrow()


def digest_items(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """For each item: its size and SHA-256, and where it ran (process, TMPDIR, cwd, which
    pgcdc the executor's Python imports, how much this Python worker has done before)."""
    import pgcdc

    for batch in batches:
        _WORKER_STATE["batches"] += 1
        ids = batch.column("id").to_pylist()
        payloads = batch.column("payload").to_pylist()
        _WORKER_STATE["items"] += len(ids)
        n = len(ids)
        yield pa.RecordBatch.from_pydict(
            {
                "id": pa.array(ids, pa.int32()),
                "size": pa.array([len(p) for p in payloads], pa.int64()),
                "sha256": pa.array([hashlib.sha256(p).hexdigest() for p in payloads]),
                "pid": pa.array([os.getpid()] * n, pa.int32()),
                "tmpdir": pa.array([os.environ.get("TMPDIR", "")] * n),
                "cwd": pa.array([os.getcwd()] * n),
                "pgcdc": pa.array([pgcdc.__file__] * n),
                "worker_items": pa.array([_WORKER_STATE["items"]] * n, pa.int64()),
                "worker_batches": pa.array([_WORKER_STATE["batches"]] * n, pa.int64()),
            }
        )


def read_paths(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each item's payload is a file path: read it, and say what happened (``read N bytes``
    or the error's class), from the executor's point of view."""
    for batch in batches:
        ids = batch.column("id").to_pylist()
        paths = [p.decode() for p in batch.column("payload").to_pylist()]
        outcomes = []
        for path in paths:
            try:
                with open(path, "rb") as f:
                    outcomes.append(f"read {len(f.read())} bytes")
            except OSError as exc:
                outcomes.append(type(exc).__name__)
        n = len(ids)
        yield pa.RecordBatch.from_pydict(
            {
                "id": pa.array(ids, pa.int32()),
                "path": pa.array(paths),
                "outcome": pa.array(outcomes),
                "pid": pa.array([os.getpid()] * n, pa.int32()),
                "tmpdir": pa.array([os.environ.get("TMPDIR", "")] * n),
            }
        )
