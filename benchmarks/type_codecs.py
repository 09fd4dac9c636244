"""Type conversion throughput: pgcdc's codecs against psycopg's loaders, text and binary.

What is measured
    Two captures of the same 1 M inserts into the 5-column ``bench`` table (bigint, int,
    text of ~40 chars, timestamptz, numeric(12,2)) from ``benchmarks/decode.py``'s recipe: one
    with text column values, one with ``binary 'true'`` (the types' send forms). Every frame is
    decoded to messages first (not timed). Then, for each capture, in the same run:

    pgcdc python   every column value through ``pgcdc.types`` codecs (`TypeCodec.decode`)
                   into Python values: int, str, datetime (UTC), Decimal.
    psycopg        the same bytes through psycopg's own loaders for the same OIDs and format
                   (psycopg_binary's compiled loaders): the baseline.
    pgcdc arrow    the rows into Arrow record batches of 10,000 rows with the Spark mapping
                   (`pgcdc.types.arrow.ArrowBatchBuilder`: append, then flush), when
                   pyarrow is installed.

    Reported: rows/s and µs per row for each, and the ratios against psycopg.

How to run (from the repository root)
    .venv/bin/python benchmarks/type_codecs.py --rows 100000    # quick check
    .venv/bin/python benchmarks/type_codecs.py                  # 1,000,000 rows (captures cached)
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

from psycopg.adapt import Transformer
from psycopg.pq import Format

from decode import CACHE_DIR, make_capture
from pgcdc.capture import CaptureReader
from pgcdc.embedded import installations
from pgcdc.protocol import Decoder, Insert, Relation, TupleData, XLogData, parse_frame
from pgcdc.types import DEFAULT_REGISTRY

Rows = list[TupleData]


def load(path: Path) -> tuple[Relation, Rows]:
    """The capture's Relation and the new tuples of its Inserts."""
    with open(path, "rb") as f:
        reader = CaptureReader(f, str(path))
        decoder = Decoder(reader.header.proto_version, reader.header.streaming)
        rows: Rows = []
        relation = None
        for record in reader:
            frame = parse_frame(record.frame)
            if type(frame) is not XLogData:
                continue
            message = decoder.decode(frame.payload)
            if type(message) is Insert:
                rows.append(message.new)
            elif type(message) is Relation:
                relation = message
    assert relation is not None
    return relation, rows


def pgcdc_python(relation: Relation, rows: Rows) -> int:
    codecs = [DEFAULT_REGISTRY.get(c.type_oid).decode for c in relation.columns]
    count = 0
    for row in rows:
        values = [
            None if v is None else decode(k, v)
            for decode, k, v in zip(codecs, row.kinds, row.values, strict=True)
        ]
        count += len(values)
    return count


def psycopg_loaders(relation: Relation, rows: Rows) -> int:
    transformer = Transformer()
    binary = rows[0].kinds[0] == 0x62
    fmt = Format.BINARY if binary else Format.TEXT
    loaders = [transformer.get_loader(c.type_oid, fmt).load for c in relation.columns]
    count = 0
    for row in rows:
        values = [
            None if v is None else load(v) for load, v in zip(loaders, row.values, strict=True)
        ]
        count += len(values)
    return count


def pgcdc_arrow(relation: Relation, rows: Rows) -> int:
    from pgcdc.types.arrow import ArrowBatchBuilder

    builder = ArrowBatchBuilder(
        relation, DEFAULT_REGISTRY, schema_name="public", table_name="bench"
    )
    count = 0
    for start in range(0, len(rows), 10_000):
        for row in rows[start : start + 10_000]:
            builder.append(row)
        count += builder.flush().num_rows
    return count


def best(fn: Callable[[Relation, Rows], int], relation: Relation, rows: Rows, runs: int) -> float:
    times = []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        fn(relation, rows)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pg-version", type=int, default=None)
    args = parser.parse_args()
    version = args.pg_version or max(installations())
    CACHE_DIR.mkdir(exist_ok=True)
    try:
        import pyarrow  # noqa: F401

        consumers = [("pgcdc python", pgcdc_python), ("psycopg", psycopg_loaders)]
        consumers.append(("pgcdc arrow", pgcdc_arrow))
    except ImportError:
        consumers = [("pgcdc python", pgcdc_python), ("psycopg", psycopg_loaders)]
        print("(pyarrow is not installed: no Arrow run)")
    results = {}
    for mode in ("text", "binary"):
        path = CACHE_DIR / f"types-pg{version}-{args.rows}rows-{mode}.pgcap"
        if not path.exists():
            make_capture(path, args.rows, 1000, version, binary=mode == "binary")
        relation, rows = load(path)
        print(f"{path.name}: {len(rows):,} rows, best of {args.runs}")
        for name, fn in consumers:
            seconds = best(fn, relation, rows, args.runs)
            results[mode, name] = seconds
            print(
                f"  {mode:<6} {name:<13} {len(rows) / seconds:>12,.0f} rows/s "
                f"{seconds / len(rows) * 1e6:6.2f} µs/row",
                flush=True,
            )
    print("\nratios (time, lower is faster) against psycopg's loaders on the same bytes")
    for mode in ("text", "binary"):
        base = results[mode, "psycopg"]
        for name, _ in consumers:
            if name != "psycopg":
                print(f"  {mode:<6} {name:<13} {results[mode, name] / base:5.2f}x")


if __name__ == "__main__":
    sys.exit(main())
