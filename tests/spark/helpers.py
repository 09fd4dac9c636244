"""Running pgoutput streams in tests: availableNow queries that collect their micro-batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pgcdc.embedded import Database


def source_options(db: Database, slot: str, publication: str, **extra: Any) -> dict[str, str]:
    options = {"conninfo": db.dsn, "slot": slot, "publication": publication, "statusInterval": "1"}
    options.update({k: str(v) for k, v in extra.items()})
    return options


def collect_stream(
    spark: Any,
    options: dict[str, str],
    checkpoint: Path,
    *,
    fail_on: int | None = None,
    batches: list[tuple[int, list[Any]]] | None = None,
) -> list[tuple[int, list[Any]]]:
    """Run the stream to the server's current position; (batch id, rows in sequence order) per
    micro-batch, also appended to `batches`. With `fail_on`, that batch raises after being
    collected (a crash)."""
    batches = [] if batches is None else batches

    def each(df: Any, batch_id: int) -> None:
        rows = sorted(df.collect(), key=lambda r: (r.commit_lsn, r.ordinal))
        batches.append((batch_id, rows))
        if batch_id == fail_on:
            raise RuntimeError(f"injected failure in batch {batch_id}")

    query = (
        spark.readStream.format("pgoutput")
        .options(**options)
        .load()
        .writeStream.foreachBatch(each)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return batches


def pipeline_config(
    db: Database,
    slot: str,
    publication: str,
    lake: Path,
    tables: dict[str, Any],
    **trigger: Any,
) -> dict[str, Any]:
    """A pipeline configuration (as parsed TOML) that catches up and stops."""
    return {
        "name": "test",
        "source": {
            "conninfo": db.dsn,
            "publication": publication,
            "slot": slot,
            "status_interval": 1,
        },
        "target": {"path": str(lake)},
        "trigger": {"available_now": True, **trigger},
        "tables": dict(tables),  # a test may add one; the module's own dict stays as it is
    }


def run_pipeline(spark: Any, config: dict[str, Any]) -> Any:
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import parse_config

    pipeline = Pipeline(parse_config(config), spark)
    pipeline.run()
    return pipeline


def verdicts(db: Database, config: dict[str, Any]) -> list[Any]:
    """Every target of `config` compared with its source table (mirror: equal rows; history:
    current versions equal, no version twice)."""
    from pgcdc.pipeline.config import parse_config
    from pgcdc.pipeline.verify import compare_history, compare_mirror
    from pgcdc.targets import open_target

    out = []
    for spec in parse_config(config).targets():
        if spec.mode == "changelog":
            continue
        target = open_target(spec.spec, app_id="pgcdc:test")  # (on an object store too)
        compare = compare_mirror if spec.mode == "mirror" else compare_history
        out.append(compare(db.dsn, spec.table, target.to_arrow() if target.exists else None))
    return out


def assert_identical(db: Database, config: dict[str, Any]) -> None:
    results = verdicts(db, config)
    assert results and all(v.equal for v in results), "\n".join(
        f"{v} missing={v.missing} extra={v.extra}" for v in results
    )


class RunningPipeline:
    """A continuous pipeline (`available_now = false`) run in a thread: `wait_for` a state,
    `stop` it; an error it stopped with is in `failure` (and raised by `stop`)."""

    def __init__(self, spark: Any, config: dict[str, Any], interval: str = "0.3 seconds") -> None:
        import threading

        from pgcdc.pipeline import Pipeline
        from pgcdc.pipeline.config import parse_config

        config = {**config, "trigger": {"available_now": False, "interval": interval}}
        self.pipeline = Pipeline(parse_config(config), spark)
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-pipeline", daemon=True)

    def _run(self) -> None:
        try:
            self.pipeline.run()
        except BaseException as exc:
            self.failure = exc

    def __enter__(self) -> RunningPipeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pipeline.stop()
        self._thread.join(120)

    def wait_for(self, condition: Any, what: str, timeout: float = 120) -> None:
        """Until `condition()` holds (raises when the pipeline stopped with an error)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.failure is not None:
                raise AssertionError(f"the pipeline stopped: {self.failure}") from self.failure
            if condition():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def caught_up(self, db: Database) -> bool:
        """Whether the slot is confirmed up to the server's current WAL position."""
        row = db.execute(
            "SELECT confirmed_flush_lsn >= pg_current_wal_lsn() FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.pipeline.config.slot,),
        )
        return bool(row and row[0][0])

    def stop(self) -> None:
        self.pipeline.stop()
        self._thread.join(120)
        if self.failure is not None:
            raise self.failure


#: A pipeline run in a process of its own (`start_child`): its own process group, so a test
#: can kill the whole of it (the JVM included).
PIPELINE_CHILD = Path(__file__).with_name("pipeline_child.py")


def child_path() -> str:
    """A child process's PYTHONPATH: ``tests/``, then the caller's own (a run of another
    checkout's sources, ``PYTHONPATH=<checkout>/src``, reaches the children too)."""
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(Path(__file__).parents[1]), *([inherited] if inherited else [])])


def start_child(config: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    """`pipeline_child.py` running `config` (`extra`: its options) in a new session."""
    env = dict(os.environ, PYTHONPATH=child_path())
    return subprocess.Popen(
        [sys.executable, str(PIPELINE_CHILD), json.dumps(config), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def finish_child(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    """The child's exit status and all it printed."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err
