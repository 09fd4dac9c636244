"""`SparkDispatcher`: work items as a DataFrame mapped with mapInArrow, on the local session
(tests/spark/test_cluster.py runs it on a standalone cluster and a Spark Connect server)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from pgcdc.errors import TargetError
from pgcdc.pipeline._dispatch import DispatchError
from pgcdc.spark.dispatch import SparkDispatcher, default_parallelism, failure_line

#: Above this many bytes of local data, a classic session makes a partition of each record
#: batch instead of a local relation split by the default parallelism.
THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


@pytest.fixture
def dispatcher(spark: Any) -> SparkDispatcher:
    return SparkDispatcher(spark)


def test_the_default_parallelism(spark: Any) -> None:
    """Read from a local master, else asked with a query (a Spark Connect session's way)."""
    assert default_parallelism(spark) == spark.sparkContext.defaultParallelism == 2

    class Remote:
        """The session as a Spark Connect one would answer (no master to read)."""

        def __init__(self) -> None:
            self.range = spark.range

    Remote.__module__ = "pyspark.sql.connect.session"
    assert default_parallelism(Remote()) == 2
    assert SparkDispatcher(spark).same_host  # local[2]: tasks may read the driver's files


@pytest.mark.parametrize("threshold", [None, "1"])
def test_items_come_back_in_order_one_task_each(
    dispatcher: SparkDispatcher, spark: Any, threshold: str | None
) -> None:
    """Up to `parallelism` items run in tasks of their own, more in runs of consecutive
    items, whichever way the session turns local data into partitions; results in order."""

    def where(item: Any) -> tuple[Any, int, int]:  # (by value: executors cannot import tests)
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        return item, context.partitionId(), os.getpid()

    previous = spark.conf.get(THRESHOLD)
    if threshold is not None:
        spark.conf.set(THRESHOLD, threshold)
    try:
        two = dispatcher.map(where, ["a", "b"])
        seven = dispatcher.map(where, list(range(7)))
    finally:
        spark.conf.set(THRESHOLD, previous)
    assert [item for item, _, _ in two] == ["a", "b"]
    assert len({partition for _, partition, _ in two}) == 2
    assert all(pid != os.getpid() for _, _, pid in two)
    assert [item for item, _, _ in seven] == list(range(7))
    partitions = [partition for _, partition, _ in seven]
    assert partitions == sorted(partitions) and len(set(partitions)) >= 2


def test_bytes_travel_inside_the_items(dispatcher: SparkDispatcher) -> None:
    items = [os.urandom(size) for size in (0, 1, 3 << 20)]

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    assert dispatcher.map(digest, items) == [digest(item) for item in items]
    assert dispatcher.map(digest, []) == []


def test_an_item_that_fails_is_one_line(dispatcher: SparkDispatcher) -> None:
    def work(item: int) -> int:
        if item == 2:
            raise TargetError("public.t: cannot apply 1 change\nsecond line")
        if item == 3:
            raise ValueError("bad value")
        return item

    with pytest.raises(DispatchError) as raised:
        dispatcher.map(work, [1, 2, 3])
    assert str(raised.value) == "public.t: cannot apply 1 change"
    with pytest.raises(DispatchError, match=r"^ValueError: bad value$"):
        dispatcher.map(work, [1, 3])


def test_failure_lines() -> None:
    class Odd(Exception):
        pass

    assert failure_line(KeyError("k")) == "KeyError: 'k'"
    assert failure_line(Odd()) == f"{__name__}.test_failure_lines.<locals>.Odd"
    assert failure_line(TargetError("one\ntwo")) == "one"
