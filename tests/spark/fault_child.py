"""Runs one pipeline (what `pgcdc run` runs) in its own process, for the fault-injection test.

    python fault_child.py CONFIG_JSON [--crash-at slot-created | --crash-at chunk N |
                                       --crash-at batch N]

The configuration says whether it runs continuously or catches up and stops. It prints one
line per event, flushed, so the test can time its kills on them:

    spark ready
    slot created <name>
    copy <chunks done>/<chunks planned> chunks, <rows> rows
    batch <id> changes <n> skipped <n> last <commit LSN> applied <per target>
    caught up
    stopped: <the one line `pgcdc run` says when the pipeline stops with an error>

A crash point ends the process with ``os._exit(3)`` (no cleanup, like a kill) at a moment
random timing rarely hits; the functions are wrapped here, in the child, never in `src`:

* ``slot-created``: right after `ReplicationConnection.create_slot` returned the pipeline's
  slot, before the initial copy's plan is saved;
* ``chunk N``: once N chunks of the initial copy are committed (seen by the copy's progress);
* ``batch N``: right after the N-th batch's Delta commits, before Spark records the batch.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

CRASH_EXIT = 3
STOPPED_EXIT = 1


def say(line: str) -> None:
    print(line, flush=True)


def arm_slot_crash() -> None:
    from pgcdc.replication.connection import ReplicationConnection

    create_slot = ReplicationConnection.create_slot

    def create_then_die(self: ReplicationConnection, name: str, *args: Any, **kwargs: Any) -> Any:
        created = create_slot(self, name, *args, **kwargs)
        if not kwargs.get("temporary", False):  # an online copy's slot is temporary
            say(f"slot created {name}")
            say("crash at slot-created")
            os._exit(CRASH_EXIT)
        return created

    ReplicationConnection.create_slot = create_then_die  # type: ignore[method-assign]


def main() -> None:
    args = sys.argv[1:]
    config_json = args.pop(0)
    crash_at: str | None = None
    crash_n = 0
    if args[:1] == ["--crash-at"]:
        crash_at = args[1]
        crash_n = int(args[2]) if len(args) > 2 else 0
        if crash_at not in ("slot-created", "chunk", "batch"):
            raise SystemExit(f"unknown crash point {crash_at!r}")

    from pgcdc.errors import PgcdcError
    from pgcdc.pipeline import BatchReport, Pipeline, TableProgress
    from pgcdc.pipeline.config import parse_config
    from pgcdc.spark.session import local_session

    config = parse_config(json.loads(config_json))
    if crash_at == "slot-created":
        arm_slot_crash()
    else:
        # Not a crash point, but say when the pipeline made its slot (a kill may follow).
        from pgcdc.replication.connection import ReplicationConnection

        create_slot = ReplicationConnection.create_slot

        def create_and_say(self: ReplicationConnection, name: str, *a: Any, **kw: Any) -> Any:
            created = create_slot(self, name, *a, **kw)
            say(f"slot created {name}")
            return created

        ReplicationConnection.create_slot = create_and_say  # type: ignore[method-assign]

    batches = 0
    last_copy: tuple[int, int, int] | None = None

    def on_batch(report: BatchReport) -> None:
        nonlocal batches
        batches += 1
        applied = ",".join(f"{k.replace(' ', ':')}={v}" for k, v in sorted(report.applied.items()))
        say(
            f"batch {report.batch_id} changes {report.changes} skipped {report.skipped} "
            f"last {report.last_commit_lsn} applied {applied or '-'}"
        )
        if crash_at == "batch" and batches >= crash_n:
            say(f"crash at batch {batches}")
            os._exit(CRASH_EXIT)

    def on_copy(progress: dict[str, TableProgress]) -> None:
        nonlocal last_copy
        done = sum(p.chunks_done for p in progress.values())
        planned = sum(p.chunks for p in progress.values())
        rows = sum(p.rows_done for p in progress.values())
        if (done, planned, rows) != last_copy:
            last_copy = (done, planned, rows)
            errors = [f"{t}: {p.error}" for t, p in progress.items() if p.error]
            say(f"copy {done}/{planned} chunks, {rows} rows" + "".join(f"; {e}" for e in errors))
        if crash_at == "chunk" and done >= crash_n:
            say(f"crash at chunk {done}")
            os._exit(CRASH_EXIT)

    spark = local_session("pgcdc-fault-test", cores="2")
    say("spark ready")
    try:
        stats = Pipeline(config, spark, on_batch=on_batch, on_copy=on_copy).run()
    except PgcdcError as exc:  # what `pgcdc run` says in one line, exit status 1
        say(f"stopped: {exc}")
        os._exit(STOPPED_EXIT)
    say(f"caught up after {stats.batches} batches, {stats.changes} changes")


if __name__ == "__main__":
    main()
