"""Where the pipeline's work runs: a `Dispatcher` maps a function over work items in parallel
and gives back the results in order.

The driver plans; a dispatcher runs. `pgcdc.spark.dispatch.SparkDispatcher` runs the items
as Spark tasks (the copy's chunks, a large batch's tables); `InlineDispatcher` runs them in
this process, in threads (delta-rs and the COPY reader release the GIL), for the work too
small to pay a Spark job's set-up. A function and its items must pickle for Spark; a failure
is one `DispatchError` line (pgcdc's own error when the work raised one). `same_host` says
whether the work runs on the driver's machine: only then may it read the driver's files (the
spool); otherwise what it needs travels inside its items.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from pgcdc.errors import PgcdcError

__all__ = ["DispatchError", "Dispatcher", "InlineDispatcher"]

T = TypeVar("T")
R = TypeVar("R")


class DispatchError(PgcdcError):
    """Work failed where it ran (the first line of what it raised)."""


class Dispatcher(Protocol):
    """Runs work items in parallel."""

    @property
    def parallelism(self) -> int:
        """How many items run at once."""
        ...

    @property
    def same_host(self) -> bool:
        """Whether the items run on this machine, where the driver's files are."""
        ...

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`function` of each item, in the items' order; raises `DispatchError`."""
        ...


class InlineDispatcher:
    """Runs the items in this process, `parallelism` at a time."""

    def __init__(self, parallelism: int = 2) -> None:
        self._parallelism = max(1, parallelism)

    @property
    def parallelism(self) -> int:
        return self._parallelism

    @property
    def same_host(self) -> bool:
        return True

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if len(items) <= 1:
            return [function(item) for item in items]
        with ThreadPoolExecutor(min(self._parallelism, len(items))) as pool:
            return list(pool.map(function, items))
