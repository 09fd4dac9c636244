"""Runs one pipeline in its own process, for the crash tests.

    python pipeline_child.py CONFIG_JSON [--exit-after-batches N | --exit-after-chunks N |
                                          --exit-after-slot 1]

With ``--exit-after-batches N`` the process dies (``os._exit``) right after the N-th batch's
Delta commits and before Spark records the batch as done: the worst moment to crash. With
``--exit-after-chunks N`` (or ``TABLE:N``) it dies once the initial copy has committed N
chunks (of TABLE); with
``--exit-after-slot 1`` right after the replication slot was created (before anything else).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pgcdc.pipeline import BatchReport, Pipeline, TableProgress
from pgcdc.pipeline.config import parse_config
from pgcdc.spark.session import local_session


def main() -> None:
    config = parse_config(json.loads(sys.argv[1]))
    flag = sys.argv[2] if len(sys.argv) > 3 else None
    exit_after = int(sys.argv[3]) if flag == "--exit-after-batches" else None
    # N (chunks of every table) or TABLE:N (of that table: which table's chunks the tasks
    # finish first depends on the machine's load)
    chunks_of, _, count = (
        sys.argv[3].rpartition(":") if flag == "--exit-after-chunks" else ("", "", "")
    )
    exit_after_chunks = int(count) if count else None
    done = 0

    def on_batch(report: BatchReport) -> None:
        nonlocal done
        done += 1
        print(
            f"batch {report.batch_id} changes {report.changes} skipped {report.skipped}",
            flush=True,
        )
        if exit_after is not None and done >= exit_after:
            os._exit(3)

    def on_copy(progress: dict[str, TableProgress]) -> None:
        copied = sum(p.chunks_done for t, p in progress.items() if t == chunks_of or not chunks_of)
        if exit_after_chunks is not None and copied >= exit_after_chunks:
            print(f"copied {copied} chunks", flush=True)
            os._exit(3)

    if flag == "--exit-after-slot":
        from pgcdc.replication.connection import ReplicationConnection

        create_slot = ReplicationConnection.create_slot

        def create_then_die(self: ReplicationConnection, *args: Any, **kwargs: Any) -> Any:
            create_slot(self, *args, **kwargs)
            print("slot created", flush=True)
            os._exit(3)

        ReplicationConnection.create_slot = create_then_die  # type: ignore[method-assign]

    spark = local_session("pgcdc-crash-test", cores="2")
    Pipeline(config, spark, on_batch=on_batch, on_copy=on_copy).run()
    print("caught up", flush=True)


if __name__ == "__main__":
    main()
