"""Runs one pipeline in its own process, for the crash tests.

    python pipeline_child.py CONFIG_JSON [--exit-after-batches N | --exit-after-chunks N |
                                          --exit-after-slot 1 | --kill-group-after-batches N]

With ``--exit-after-batches N`` the process dies (``os._exit``) right after the N-th batch's
Delta commits and before Spark records the batch as done: the worst moment to crash. With
``--exit-after-chunks N`` (or ``TABLE:N``) it dies once the initial copy has committed N
chunks (of TABLE); with
``--exit-after-slot 1`` right after the replication slot was created (before anything else).
``--kill-group-after-batches N`` is the first at its worst: SIGKILL to the process's whole
group (a classic session's JVM with it), as ``kill -9 -PGID`` would.

The session is a local one, unless the configuration has a ``[spark]`` section: then it is
the one that section describes (a cluster's master, a Spark Connect server), and after the
first batch the process says, in a line ``probe {...}``, whether its spool directory, which
the driver sees, exists for the tasks the pipeline's dispatcher runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from pgcdc.pipeline import BatchReport, Pipeline, TableProgress
from pgcdc.pipeline.config import parse_config
from pgcdc.spark.session import local_session


def main() -> None:
    config = parse_config(json.loads(sys.argv[1]))
    flag = sys.argv[2] if len(sys.argv) > 3 else None
    given = config.spark_master is not None or config.spark_remote is not None
    exit_after = int(sys.argv[3]) if flag == "--exit-after-batches" else None
    kill_after = int(sys.argv[3]) if flag == "--kill-group-after-batches" else None
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
        if done == 1 and given:
            probe()
        if exit_after is not None and done >= exit_after:
            os._exit(3)
        if kill_after is not None and done >= kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    def probe() -> None:
        assert pipeline.spooler is not None
        spool = str(pipeline.spooler.spool.directory)
        tasks = pipeline.dispatcher.map(os.path.exists, [spool] * pipeline.dispatcher.parallelism)
        seen = {"spool": spool, "driver": os.path.exists(spool), "tasks": tasks}
        print(f"probe {json.dumps(seen)}", flush=True)

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

    spark = None if given else local_session("pgcdc-crash-test", cores="2")
    pipeline = Pipeline(config, spark, on_batch=on_batch, on_copy=on_copy)
    pipeline.run()
    print("caught up", flush=True)


if __name__ == "__main__":
    main()
