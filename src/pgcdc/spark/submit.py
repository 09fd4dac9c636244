"""A pipeline on a Spark session someone else made: `run` for a notebook or a job that has its
session, and a script for ``spark-submit``, which makes the session from its own options::

    spark-submit --master spark://host:7077 \\
        --conf spark.pyspark.python=./environment/bin/python \\
        --archives pgcdc-env.tar.gz#environment \\
        "$(python -c 'import pgcdc.spark.submit as s; print(s.__file__)')" pipeline.toml

The session given is used as it is (classic, or Spark Connect with ``--remote``): the
configuration's ``[spark]`` section is not. The first SIGINT or SIGTERM finishes the batch in
progress and stops; the exit status is 0 when the pipeline stopped cleanly (available-now:
caught up), 1 with one line on stderr when it failed, 2 for a wrong command line.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "run"]


def run(spark: Any, config: Any, **options: Any) -> Any:
    """Run the pipeline `config` describes (a `PipelineConfig`, or the path of its TOML file)
    on `spark` until it stops (`pgcdc.pipeline.Pipeline.run`; `options` go to `Pipeline`);
    its `PipelineStats`."""
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import PipelineConfig, load_config

    if not isinstance(config, PipelineConfig):
        config = load_config(Path(config))
    return Pipeline(config, spark, **options).run()


def main(argv: list[str] | None = None) -> int:
    """``spark-submit submit.py PIPELINE.toml`` (see the module)."""
    from pgcdc.errors import PgcdcError
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import load_config

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: spark-submit [options] submit.py PIPELINE.toml", file=sys.stderr)
        return 2
    try:
        pipeline = Pipeline(load_config(Path(args[0])), _session())

        def stop(signum: int, frame: Any) -> None:
            pipeline.stop()
            signal.signal(signum, signal.default_int_handler)  # a second one stops at once

        pipeline.prepare()  # (Spark's handlers are installed by then: ours replace them)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        stats = pipeline.run()
    except PgcdcError as exc:
        print(f"pgcdc: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"Stopped cleanly after {stats.batches} batches, {stats.changes:,} changes.")
    return 0


def _session() -> Any:
    """spark-submit's session, with pgcdc's source registered."""
    from pyspark.sql import SparkSession

    from pgcdc.spark.source import register

    spark = SparkSession.builder.getOrCreate()
    register(spark)
    return spark


if __name__ == "__main__":
    sys.exit(main())
