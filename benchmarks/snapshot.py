"""Initial copy throughput: pgcdc's snapshot into a Delta mirror against ``COPY … TO`` a null
sink through psql.

What is compared
    One throwaway PostgreSQL server (newest installed unless ``--pg-version``) with the
    5-column ``bench`` table of ``benchmarks/stream.py`` holding N rows (``--rows``, default
    10,000,000), vacuumed and checkpointed. Then, in the same run:

    psql COPY   ``psql -c "COPY bench TO STDOUT" > /dev/null``: the server reads and formats
                every row, the client throws the bytes away (the floor of any copy).
    pgcdc       a pipeline's first run (`pgcdc.spark.pipeline.Pipeline`, available-now, the
                table in mirror mode): the slot is created with an exported snapshot, the
                table is cut into block ranges (``--chunk-blocks``) and Spark tasks copy them
                in parallel into the Delta mirror; timed from the start of the copy to its
                end (Spark's start-up is reported apart).

    Reported: wall seconds and rows/s of both, and the ratio pgcdc/psql (target <= 3). The
    mirror's row count is checked against N.

How to run (from the repository root)
    .venv/bin/python benchmarks/snapshot.py --rows 1000000   # quick check
    .venv/bin/python benchmarks/snapshot.py                  # 10,000,000 rows
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from pgcdc.embedded import EmbeddedServer

SCHEMA = "CREATE TABLE bench (id bigint PRIMARY KEY, n int, t text, ts timestamptz, amt numeric)"
FILL = """
INSERT INTO bench
SELECT g, g % 1000, md5(g::text) || ' some text', now() - g * interval '1 second',
       (g % 100000) / 100.0
FROM generate_series({first}, {last}) g
"""


def fill(db: object, rows: int) -> None:
    step = 1_000_000
    for first in range(1, rows + 1, step):
        db.execute(FILL.format(first=first, last=min(first + step - 1, rows)))  # type: ignore[attr-defined]


def psql_copy(server: EmbeddedServer, dsn: str) -> float:
    psql = str(server.bindir / "psql")
    started = time.monotonic()
    with open(os.devnull, "wb") as null:
        subprocess.run([psql, dsn, "-c", "COPY bench TO STDOUT"], stdout=null, check=True)
    return time.monotonic() - started


def pgcdc_copy(dsn: str, lake: Path, chunk_blocks: int, cores: str) -> tuple[float, float, int]:
    from pgcdc.spark.config import parse_config
    from pgcdc.spark.pipeline import Pipeline
    from pgcdc.spark.session import local_session
    from pgcdc.targets import DeltaTarget

    started = time.monotonic()
    spark = local_session("pgcdc-bench-snapshot", cores=cores)
    spark.sparkContext.parallelize([0], 1).count()  # start the Python workers
    startup = time.monotonic() - started
    config = parse_config(
        {
            "name": "bench",
            "source": {
                "conninfo": dsn,
                "publication": "bench_pub",
                "slot": "bench_slot",
                "create_slot": True,
            },
            "snapshot": {"chunk_blocks": chunk_blocks},
            "target": {"path": str(lake)},
            "trigger": {"available_now": True},
            "tables": {"public.bench": "mirror"},
        }
    )
    pipeline = Pipeline(config, spark)
    started = time.monotonic()
    pipeline.initial_copy()
    seconds = time.monotonic() - started
    rows = DeltaTarget(str(lake / "public.bench"), "mirror", app_id="x").exists and sum(
        p.rows_done for p in pipeline.copy_progress.values()
    )
    return startup, seconds, int(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--pg-version", type=int, default=None)
    parser.add_argument("--chunk-blocks", type=int, default=16384)
    parser.add_argument("--cores", default="*")
    args = parser.parse_args(argv)
    settings = {"autovacuum": "off", "shared_buffers": "512MB", "max_wal_size": "4GB"}
    with EmbeddedServer(args.pg_version, settings=settings) as server:
        db = server.create_database()
        db.execute(SCHEMA)
        print(f"PostgreSQL {server.version_string}: filling bench with {args.rows:,} rows ...")
        fill(db, args.rows)
        db.execute("CREATE PUBLICATION bench_pub FOR TABLE bench")
        db.execute("VACUUM ANALYZE bench")
        db.execute("CHECKPOINT")
        psql_copy(server, db.dsn)  # warm the cache once, like the copy will find it
        baseline = psql_copy(server, db.dsn)
        with tempfile.TemporaryDirectory(prefix="pgcdc-bench-lake-") as lake:
            startup, seconds, rows = pgcdc_copy(db.dsn, Path(lake), args.chunk_blocks, args.cores)
        print(f"psql COPY TO /dev/null: {baseline:8.2f} s  {args.rows / baseline:12,.0f} rows/s")
        print(
            f"pgcdc copy into Delta:  {seconds:8.2f} s  {args.rows / seconds:12,.0f} rows/s"
            f"  (Spark start-up {startup:.1f} s, not counted)"
        )
        print(f"ratio pgcdc / psql: {seconds / baseline:.2f}  (target <= 3)")
        status = "matches" if rows == args.rows else f"MISMATCH: {rows:,}"
        print(f"mirror rows copied: {rows:,} ({status})")


if __name__ == "__main__":
    main()
