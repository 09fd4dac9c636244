"""The pipeline's work as Spark tasks (`pgcdc.pipeline._dispatch.Dispatcher`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pgcdc.pipeline._dispatch import DispatchError
from pgcdc.spark.session import error_line

__all__ = ["SparkDispatcher"]

T = TypeVar("T")
R = TypeVar("R")


class SparkDispatcher:
    """Runs work items as the tasks of one Spark job per `map` on `spark` (a session)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    @property
    def parallelism(self) -> int:
        return max(1, int(self.spark.sparkContext.defaultParallelism))

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if not items:
            return []
        context = self.spark.sparkContext
        try:
            return list(context.parallelize(list(items), len(items)).map(function).collect())
        except Exception as exc:
            raise DispatchError(error_line(exc)) from None
