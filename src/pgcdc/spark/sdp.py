"""pgcdc in Spark Declarative Pipelines (``spark-pipelines run``): the ``pgoutput`` source
feeds a flow, and the ``pgcdc`` sink (`pgcdc.spark.sink`) applies it to mirror, history and
change log targets exactly once. A pipeline definition file (``spark`` is given to it)::

    from pyspark import pipelines as dp
    from pgcdc.spark import sdp

    sdp.register(spark)
    dp.create_sink("lake", format="pgcdc", options={
        "path": "/data/lake", "conninfo": CONNINFO, "modes": "mirror,history"})

    @dp.append_flow(target="lake")
    def changes():
        return (spark.readStream.format("pgoutput")
                .options(conninfo=CONNINFO, slot="shop_slot", publication="shop_pub",
                         createSlot="true")
                .load())

One flow per slot: a slot has one replication session, so the sink applies every table of
the stream (or those of its ``tables`` option). Each ``spark-pipelines run`` processes one
micro-batch (Python sources have no available-now trigger in Spark 4.3), and the slot is
confirmed for it at the start of the next run (the source's ``commit`` comes one batch late):
until then the server keeps that WAL, and a run that dies sends it again, which the targets
skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["register", "skip_profiler_metrics"]


def register(spark: Any) -> None:
    """Make ``format("pgoutput")`` and ``format("pgcdc")`` available in `spark` (a pipeline
    definition file's session), and let ``spark-pipelines run`` end with exit status 0
    (`skip_profiler_metrics`)."""
    from pgcdc.spark.sink import register_sink
    from pgcdc.spark.source import register as register_source

    register_source(spark)
    register_sink(spark)
    skip_profiler_metrics()


def skip_profiler_metrics() -> None:
    """Work around a pyspark 4.3 client bug that makes ``spark-pipelines run`` exit 1 after a
    run that completed, whenever a Python data source took part.

    Every Python worker of a Python data source reports its UDF profiler's accumulators
    (empty unless profiling is on); the Connect server returns them with the run command's
    responses as observed metrics named ``__python_accumulator__``. The client consumes them
    while it reads each response (the profiler gets its updates there), then hands them on;
    the query path ignores them, but the command iterator that ``spark-pipelines`` reads
    its events with accepts nothing but dictionaries and raises ``UNKNOWN_RESPONSE``. No
    accumulator of pgcdc's is involved, so pgcdc cannot avoid it; this drops those
    already-consumed metrics from the client's response stream. Idempotent; it changes only
    this process (the ``spark-pipelines`` client, where definition files run)."""
    from pyspark.sql.connect.client.core import PlanObservedMetrics, SparkConnectClient

    responses: Callable[..., Iterator[Any]] = SparkConnectClient._execute_and_fetch_as_iterator
    if getattr(responses, "pgcdc_skips_profiler_metrics", False):
        return

    def without_profiler_metrics(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for response in responses(self, *args, **kwargs):
            if isinstance(response, PlanObservedMetrics) and (
                response.name == "__python_accumulator__"
            ):
                continue
            yield response

    without_profiler_metrics.pgcdc_skips_profiler_metrics = True  # type: ignore[attr-defined]
    SparkConnectClient._execute_and_fetch_as_iterator = without_profiler_metrics  # type: ignore[method-assign]
