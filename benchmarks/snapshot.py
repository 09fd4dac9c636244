"""Initial copy throughput: pgcdc's snapshot into a Delta mirror against ``COPY … TO`` a null
sink through psql.

What is compared
    One throwaway PostgreSQL server (newest installed unless ``--pg-version``) with the
    5-column ``bench`` table of ``benchmarks/stream.py`` holding N rows (``--rows``, default
    10,000,000), vacuumed and checkpointed. Then, in the same run:

    psql COPY   ``psql -c "COPY bench TO STDOUT" > /dev/null``: the server reads and formats
                every row, the client throws the bytes away (the floor of any copy).
    pgcdc       a pipeline's first run (`pgcdc.pipeline.Pipeline`, available-now, the
                table in mirror mode): the slot is created with an exported snapshot, the
                table is cut into block ranges (``--chunk-blocks``) and Spark tasks copy them
                in parallel into the Delta mirror; timed from the start of the copy to its
                end (Spark's start-up is reported apart).

    Reported: wall seconds and rows/s of both, the ratio pgcdc/psql (target <= 2), and where
    the copy's time went: summed over its Spark tasks, reading the COPY (the server, the
    transfer, splitting rows into Arrow strings), typing the columns and writing Delta,
    against the cores' time the copy had. Then the mirror is checked against the table:
    aggregates of every column computed on each side (rows, distinct ids, sums, text
    lengths, first and last timestamps), and every row whose id is a multiple of N /
    ``--sample`` (default 20,000 rows) compared value by value (`pgcdc.pipeline.verify`).

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
from decimal import Decimal
from pathlib import Path
from typing import Any

from psycopg import sql

from pgcdc.embedded import Database, EmbeddedServer
from pgcdc.pipeline import TableProgress

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


def pgcdc_copy(
    dsn: str, lake: Path, chunk_blocks: int, cores: str
) -> tuple[float, float, TableProgress, int]:
    from pgcdc.pipeline import Pipeline
    from pgcdc.pipeline.config import parse_config
    from pgcdc.spark.session import local_session

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
    pipeline.prepare()  # the source checked, the start decided (a copy: the slot is new)
    started = time.monotonic()
    pipeline.start()  # the copy, before any streaming
    seconds = time.monotonic() - started
    cores_used = int(spark.sparkContext.defaultParallelism)
    return startup, seconds, pipeline.copy_progress["public.bench"], cores_used


#: The bench table's aggregates, computed by the server and, on the mirror, by Arrow.
AGGREGATES = (
    "SELECT count(*), count(DISTINCT id), sum(id), sum(n), sum(length(t)), "
    "min(ts), max(ts), sum(amt) FROM bench"
)


def mirror_aggregates(mirror: Any) -> tuple[Any, ...]:
    import pyarrow.compute as pc

    return (
        mirror.num_rows,
        pc.count_distinct(mirror.column("id")).as_py(),
        pc.sum(mirror.column("id")).as_py(),
        pc.sum(mirror.column("n")).as_py(),
        pc.sum(pc.utf8_length(mirror.column("t"))).as_py(),
        pc.min(mirror.column("ts")).as_py(),
        pc.max(mirror.column("ts")).as_py(),
        # numeric without a precision is text in the targets: summed exactly here
        sum((Decimal(v) for v in mirror.column("amt").to_pylist() if v is not None), Decimal()),
    )


def check_mirror(db: Database, lake: Path, sample: int) -> str:
    """The mirror against the table: the aggregates of every column, then the rows whose id
    is a multiple of a step (about `sample` of them) compared value by value."""
    import pyarrow.compute as pc

    from pgcdc.pipeline.verify import compare_mirror
    from pgcdc.targets import DeltaTarget

    mirror = DeltaTarget(str(lake / "public.bench"), "mirror", app_id="x").to_arrow()
    want = tuple(db.execute(AGGREGATES)[0])
    got = mirror_aggregates(mirror)
    if want != got:
        return f"DIFFERENT: aggregates of the source {want}, of the mirror {got}"
    step = max(1, mirror.num_rows // max(1, sample))
    ids = mirror.column("id")
    picked = mirror.filter(pc.equal(pc.subtract(ids, pc.multiply(pc.divide(ids, step), step)), 0))
    where = sql.SQL("id % {} = 0").format(sql.Literal(step))
    verdict = compare_mirror(db.dsn, "public.bench", picked, where)
    if not verdict.equal:
        return f"DIFFERENT: {verdict}; missing {verdict.missing}, extra {verdict.extra}"
    return (
        f"identical (the aggregates of all {got[0]:,} rows; {verdict.source_rows:,} of them "
        "value by value)"
    )


def breakdown(progress: TableProgress, seconds: float, cores: int) -> list[str]:
    """Where the copy's time went: its tasks' phases against the cores' time."""
    phases = progress.phases
    busy = sum(phases.values())
    available = seconds * cores
    lines = [
        f"  where the copy's time went ({progress.chunks} chunks on {cores} cores: "
        f"{available:.1f} core-seconds in {seconds:.2f} s)",
    ]
    for name, what in (
        ("read", "the COPY: server, transfer, rows split into Arrow strings"),
        ("type", "text to typed columns"),
        ("write", "Delta: Parquet files and commits"),
    ):
        value = phases.get(name, 0.0)
        lines.append(f"    {name:<6} {value:7.2f} s  {value / available:6.1%}  {what}")
    rest = available - busy
    lines.append(f"    other  {rest:7.2f} s  {rest / available:6.1%}  Spark, planning, idle cores")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--pg-version", type=int, default=None)
    parser.add_argument("--chunk-blocks", type=int, default=16384)
    parser.add_argument("--cores", default="*")
    parser.add_argument("--sample", type=int, default=20_000)
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
            startup, seconds, progress, cores = pgcdc_copy(
                db.dsn, Path(lake), args.chunk_blocks, args.cores
            )
            rate = args.rows / baseline
            print(f"psql COPY TO /dev/null: {baseline:8.2f} s  {rate:12,.0f} rows/s")
            print(
                f"pgcdc copy into Delta:  {seconds:8.2f} s  {args.rows / seconds:12,.0f} rows/s"
                f"  (Spark start-up {startup:.1f} s, not counted)"
            )
            print(f"ratio pgcdc / psql: {seconds / baseline:.2f}  (target <= 2)")
            print("\n".join(breakdown(progress, seconds, cores)))
            print(f"load average: {os.getloadavg()[0]:.2f}")
            print(f"mirror check: {check_mirror(db, Path(lake), args.sample)}")


if __name__ == "__main__":
    main()
