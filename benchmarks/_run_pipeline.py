"""The pipeline in a process of its own, for benchmarks/sustained.py.

    python benchmarks/_run_pipeline.py PIPELINE.toml REPORTS.jsonl [--cores N]

Runs ``Pipeline(load_config(PIPELINE.toml), local_session(...), on_batch=...).run()`` (what
``pgcdc run`` does, without the progress view) and appends every `BatchReport` to
REPORTS.jsonl as one JSON line: batch id, changes, last commit time, seconds and the phases.
SIGINT or SIGTERM stops it cleanly (the batch in progress finishes). Its own process, so
that the benchmark can sum the CPU of exactly its tree (driver, JVM, Python workers).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from _common import QUIET
from pgcdc.pipeline import Pipeline
from pgcdc.pipeline.config import load_config
from pgcdc.spark.session import local_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("reports")
    parser.add_argument("--cores", default="*")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    out = open(args.reports, "a", buffering=1)  # noqa: SIM115 (open for the whole run)

    def on_batch(report: Any) -> None:
        last = report.last_commit_time
        line = {
            "batch": report.batch_id,
            "at": time.time(),
            "changes": report.changes,
            "last_commit_time": None if last is None else last.isoformat(),
            "seconds": report.seconds,
            "phases": dict(getattr(report, "phases", {}) or {}),
        }
        out.write(json.dumps(line) + "\n")

    spark = local_session(f"pgcdc-bench-{config.name}", cores=args.cores, **QUIET)
    pipeline = Pipeline(config, spark, on_batch=on_batch)
    pipeline.prepare()  # Spark installs its own SIGINT handler: ours go in after it

    def stop(signum: int, frame: Any) -> None:
        pipeline.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        pipeline.run()
    except Exception as exc:
        print(f"the pipeline failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        out.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
