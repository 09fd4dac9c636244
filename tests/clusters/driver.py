"""A driver process for the cluster tests: one classic SparkSession per process (a JVM each),
so a test that drives a standalone cluster runs this module as a child, not in the pytest
process that may already hold the local ``spark`` fixture.

    python -m clusters.driver SPEC.json

SPEC: ``{"conf": {...}}`` for a classic session (e.g. ``StandaloneCluster.driver_conf()``)
or ``{"remote": "sc://..."}``, and a ``"job"``:

- ``digest``: random items of the given ``sizes``, dispatched ``rounds`` times (one job
  each) with ``digest_items``;
- ``read``: the driver writes a file into its own temporary directory, and the executors
  try to read it and the given ``paths`` with ``read_paths``.

Prints one JSON object: the outcome rows and what the driver saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pgcdc
from clusters.jobs import DIGEST_SCHEMA, READ_SCHEMA, digest_items, dispatch, read_paths
from clusters.spark import classic_session


def session_for(spec: Mapping[str, Any]) -> Any:
    if "remote" in spec:
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(spec["remote"]).getOrCreate()
    return classic_session(spec["conf"])


def run(spec: Mapping[str, Any]) -> dict[str, Any]:
    spark = session_for(spec)
    try:
        if spec["job"] == "digest":
            items = [(i, os.urandom(size)) for i, size in enumerate(spec["sizes"])]
            rounds = [
                dispatch(spark, items, digest_items, DIGEST_SCHEMA).to_pylist()
                for _ in range(spec.get("rounds", 1))
            ]
            return {
                "rounds": rounds,
                "expected": {i: hashlib.sha256(p).hexdigest() for i, p in items},
                "driver_pid": os.getpid(),
                "driver_pgcdc": pgcdc.__file__,
            }
        if spec["job"] == "read":
            secret = Path(tempfile.mkdtemp(prefix="pgcdc-driver-")) / "secret.bin"
            secret.write_bytes(b"only the driver can read this")
            paths = [str(secret), *spec.get("paths", [])]
            items = [(i, p.encode()) for i, p in enumerate(paths)]
            rows = dispatch(spark, items, read_paths, READ_SCHEMA).to_pylist()
            return {"rows": rows, "secret": str(secret), "driver_reads": secret.exists()}
        raise SystemExit(f"unknown job {spec['job']!r}")
    finally:
        spark.stop()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(run(spec)))


if __name__ == "__main__":
    main()
