"""The pipeline's work as Spark tasks (`pgcdc.pipeline._dispatch.Dispatcher`), one path for
classic and Spark Connect sessions.

`SparkDispatcher.map(function, items)` makes a small DataFrame of work items, one row each
(``index``, ``item``: the item pickled, with what the work needs: on a cluster or through
Spark Connect, a batch's change bytes), maps it with ``mapInArrow`` and collects one outcome
row per item (``index``, ``outcome`` pickled, ``error``). Only DataFrame operations are
used: no SparkContext, RDD or accumulator, none of which exists under Spark Connect. A
DataFrame made from local data is split into at most `parallelism` partitions, so up to that
many items run in tasks of their own; more are cut into `parallelism` runs of consecutive
items. `same_host`: a classic session on a local master runs its tasks on this machine.

Large items are slow on this path (every byte crosses the JVM: about 30-40 MB/s a task on a
loaded 2-core machine) and weigh on the driver's heap (several copies while a job starts),
which is why a batch's bytes travel only to tasks on other machines, and a batch holds at
most ``max_bytes_per_batch`` of them.

`function` is pickled by reference (a module-level function of pgcdc): executors import it,
and what its module keeps (targets left open) lives as long as Spark reuses the Python
worker. An exception of `function` comes back as the item's error line and the map raises
`DispatchError` (Spark does not retry it: the work would fail the same way again); a task
that Spark itself could not run (an executor lost four times) fails the job, which is the
same `DispatchError`.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from pgcdc.errors import PgcdcError
from pgcdc.pipeline._dispatch import DispatchError
from pgcdc.spark.session import error_line

__all__ = ["SparkDispatcher", "default_parallelism", "failure_line", "is_connect"]

T = TypeVar("T")
R = TypeVar("R")

WORK_SCHEMA = pa.schema([("index", pa.int64()), ("item", pa.binary())])
OUTCOME_SCHEMA = pa.schema(
    [("index", pa.int64()), ("outcome", pa.binary()), ("error", pa.string())]
)
_OUTCOME_DDL = "index long, outcome binary, error string"


#: A local master: ``local``, ``local[N]``, ``local[*]``, with failures allowed or not.
_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def default_parallelism(spark: Any) -> int:
    """How many tasks `spark` runs at once: Spark's default parallelism. A local master says
    it (unless ``spark.default.parallelism`` does); otherwise it is the partitions of a range
    Spark is not told how to split, asked with a query, since a Spark Connect session has no
    SparkContext to tell it."""
    from pyspark.sql import functions as F

    if not is_connect(spark) and spark.conf.get("spark.default.parallelism", None) is None:
        local = _LOCAL.fullmatch(spark.conf.get("spark.master"))
        if local is not None:
            cores = local.group(1) or "1"
            return (os.cpu_count() or 1) if cores == "*" else max(1, int(cores))
    ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("id"))
    return max(1, int(ids.agg(F.max("id").alias("last")).first()["last"]) + 1)


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (its driver is the server's)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def failure_line(exc: BaseException) -> str:
    """What an exception of the work says, in one line: pgcdc's own message, or the
    exception's qualified class and its first line."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, PgcdcError):
        return text or type(exc).__name__
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{name}: {text}" if text else name


def run_items(
    function: Callable[[Any], Any], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task (``mapInArrow``): `function` of each work item, one outcome row
    each, yielded as soon as it is done."""
    for batch in batches:
        indexes = batch.column("index")
        items = batch.column("item")
        for at in range(batch.num_rows):
            outcome: bytes | None = None
            error: str | None = None
            try:
                outcome = pickle.dumps(function(pickle.loads(items[at].as_buffer())))
            except Exception as exc:
                error = failure_line(exc)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([indexes[at].as_py()], pa.int64()),
                    pa.array([outcome], pa.binary()),
                    pa.array([error], pa.string()),
                ],
                schema=OUTCOME_SCHEMA,
            )


class SparkDispatcher:
    """Runs work items as the tasks of one Spark job per `map` on `spark` (a classic or a
    Spark Connect session)."""

    def __init__(self, spark: Any, parallelism: int | None = None) -> None:
        self.spark = spark
        self._parallelism = parallelism
        #: A classic session on a local master: its tasks run in processes of this machine.
        #: (A Spark Connect server may be anywhere, whatever master it runs.)
        self._same_host = not is_connect(spark) and spark.conf.get("spark.master").startswith(
            "local"
        )

    @property
    def same_host(self) -> bool:
        return self._same_host

    @property
    def parallelism(self) -> int:
        if self._parallelism is None:
            try:
                self._parallelism = default_parallelism(self.spark)
            except Exception as exc:
                raise DispatchError(error_line(exc)) from None
        return self._parallelism

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if not items:
            return []
        # One record batch per item: above its local-relation threshold a classic session
        # makes a partition of each batch (below it, and on Connect, rows are split evenly).
        work = pa.Table.from_batches(
            [
                pa.RecordBatch.from_arrays(
                    [pa.array([at], pa.int64()), pa.array([pickle.dumps(item)], pa.binary())],
                    schema=WORK_SCHEMA,
                )
                for at, item in enumerate(items)
            ]
        )
        try:
            frame = self.spark.createDataFrame(work)
            rows = frame.mapInArrow(functools.partial(run_items, function), _OUTCOME_DDL)
            outcomes = rows.toArrow()
        except Exception as exc:
            raise DispatchError(error_line(exc)) from None
        by_index = {row["index"]: row for row in outcomes.to_pylist()}
        results: list[R] = []
        for at in range(len(items)):
            row = by_index.get(at)
            if row is None:
                raise DispatchError(f"work item {at} of {len(items)} came back without an outcome")
            if row["error"] is not None:
                raise DispatchError(row["error"])
            results.append(pickle.loads(row["outcome"]))
        return results
