"""Decoder throughput: pgcdc's codec against pypgoutput's, on the same captured bytes.

What is compared
    A capture (a pgcdc ``.pgcap`` file: the raw CopyData frames of one replication session) of
    N inserts into the 5-column ``bench`` table, committed in transactions of ``--txn-rows``
    rows (default 1000), so the message mix is realistic: Begin, a Relation, Inserts, Commit, and
    the odd keepalive. All frames are loaded into memory first; then, in the same run:

    pgcdc       ``parse_frame`` + ``Decoder.decode`` for every frame (typed, validated messages;
                column values stay ``bytes``, timestamps stay integer microseconds), with the
                C fast path for XLogData and Insert/Update/Delete when it is built.
    pgcdc-py    the same in pure Python (``Decoder(speedups=False)``, ``frames.parse_frame``).
    pypgoutput  the 25-byte XLogData header (and the keepalive) unpacked with ``struct``, as its
                reader gets them from psycopg2, then ``pypgoutput.decoders.<Type>(payload)`` for
                every message (its message objects: values decoded to ``str``, timestamps to
                ``datetime``).

    Each decoder runs ``--runs`` times (default 3), the best run counts. Reported: rows/s and
    µs per row (wall), the ratio pgcdc/pypgoutput, and pgcdc's CPU time per row
    (``time.process_time``), to set against the ~4 µs of server CPU per row that a walsender
    spends producing it (DESIGN.md, "Performance anchors"): a consumer keeps up only if its
    CPU per row stays below that.

Where the capture comes from
    ``--capture PATH`` decodes an existing capture. Otherwise the script looks in
    ``benchmarks/.cache/`` for one of the right size and PostgreSQL version and, if there is
    none (or with ``--refresh``), makes it: it starts a throwaway server
    (``pgcdc.embedded.EmbeddedServer``, newest installed version unless ``--pg-version``),
    creates the table, a publication and a pgoutput slot, inserts the rows and records the slot
    with ``pgcdc.replication.record.record`` (proto_version 1, text). The server is gone
    before anything is timed.

How to run (from the repository root)
    .venv/bin/python benchmarks/decode.py                 # 1,000,000 inserts
    .venv/bin/python benchmarks/decode.py --rows 100000   # a quick run
    .venv/bin/python benchmarks/decode.py --capture some.pgcap --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pypgoutput import decoders as pgo

from pgcdc.capture import CaptureReader
from pgcdc.embedded import EmbeddedServer, find_bindir, installations
from pgcdc.protocol import Decoder, Insert, XLogData, parse_frame
from pgcdc.protocol import frames as frames_module
from pgcdc.protocol.speedups import SPEEDUPS
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions
from pgcdc.replication.record import record

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
SERVER_CPU_US_PER_ROW = 4.3  # DESIGN.md: walsender CPU per row, pg_recvlogical, proto 1

SCHEMA = "CREATE TABLE bench (id bigint PRIMARY KEY, n int, t text, ts timestamptz, amt numeric)"
INSERT = (
    "INSERT INTO bench SELECT g, g % 1000, md5(g::text) || 'abcdefgh', now(), "
    "(g * 1.25)::numeric(12,2) FROM generate_series({lo}, {hi}) AS g"
)


# --------------------------------------------------------------------------- the capture


def make_capture(
    path: Path, rows: int, txn_rows: int, version: int | None, *, binary: bool = False
) -> None:
    """Start a server, insert `rows` rows in transactions of `txn_rows`, record the slot
    (text column values, or the types' binary send forms with `binary`)."""
    with EmbeddedServer(version, settings={"autovacuum": False}) as server:
        print(f"making the capture on PostgreSQL {server.version_string} ...", flush=True)
        db = server.create_database("bench")
        db.execute(SCHEMA)
        db.execute("CREATE PUBLICATION pub FOR TABLE bench")
        with ReplicationConnection.connect(db.dsn) as conn:
            conn.create_slot("bench_decode")
        t0 = time.perf_counter()
        for lo in range(1, rows + 1, txn_rows):
            db.execute(INSERT.format(lo=lo, hi=min(lo + txn_rows - 1, rows)))
        print(f"  inserted {rows:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        client = ReplicationClient(
            db.dsn,
            "bench_decode",
            StreamOptions(("pub",), proto_version=1, binary=binary),
            until_idle=True,
            reconnect=False,
        )
        tmp = path.with_suffix(".pgcap.tmp")
        t0 = time.perf_counter()
        count = record(client, tmp, note=f"benchmarks/decode.py: {rows} inserts")
        tmp.replace(path)
        print(f"  recorded {count:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
        db.close()


def load_frames(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        reader = CaptureReader(f, str(path))
        if reader.header.proto_version != 1 or reader.header.streaming != "off":
            sys.exit(f"{path}: need a proto_version 1 capture without streaming")
        return [rec.frame for rec in reader]


# --------------------------------------------------------------------------- the decoders


def decode_pgcdc(frames: list[bytes], speedups: bool = True) -> int:
    """parse_frame + Decoder.decode, as pgcdc's own stream loop does; returns the inserts."""
    decode = Decoder(1, speedups=speedups).decode
    parse = parse_frame if speedups else frames_module.parse_frame
    inserts = 0
    for data in frames:
        frame = parse(data)
        if type(frame) is XLogData:
            message = decode(frame.payload, frame.data_start)
            if type(message) is Insert:
                inserts += 1
    return inserts


_XLOG_HEADER = struct.Struct(">cQQq")
_KEEPALIVE = struct.Struct(">cQqB")
_PGO_TYPES: dict[int, type[pgo.PgoutputMessage]] = {
    ord("B"): pgo.Begin,
    ord("C"): pgo.Commit,
    ord("R"): pgo.Relation,
    ord("I"): pgo.Insert,
    ord("U"): pgo.Update,
    ord("D"): pgo.Delete,
    ord("T"): pgo.Truncate,
}


def decode_pgcdc_pure(frames: list[bytes]) -> int:
    """The same without the C fast path (``PGCDC_PURE_PYTHON=1``)."""
    return decode_pgcdc(frames, speedups=False)


def decode_pypgoutput(frames: list[bytes]) -> int:
    """The XLogData header with struct (psycopg2 does it for pypgoutput's reader), then
    pypgoutput's message class for the payload; returns the inserts."""
    header = _XLOG_HEADER.unpack_from
    keepalive = _KEEPALIVE.unpack
    types = _PGO_TYPES
    insert = pgo.Insert
    inserts = 0
    for data in frames:
        if data[0] == 0x77:  # 'w'
            _, _data_start, _wal_end, _send_time = header(data)
            payload = data[25:]
            message = types[payload[0]](payload)
            if type(message) is insert:
                inserts += 1
        else:
            keepalive(data)
    return inserts


def best_of(
    name: str, fn: Callable[[list[bytes]], int], frames: list[bytes], runs: int
) -> tuple[float, float, int]:
    """(best wall seconds, CPU seconds of that run, inserts) over `runs` runs."""
    best: tuple[float, float, int] | None = None
    for i in range(runs):
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        inserts = fn(frames)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"  {name:<10} run {i + 1}: {wall:7.3f} s wall, {cpu:7.3f} s CPU", flush=True)
        if best is None or wall < best[0]:
            best = (wall, cpu, inserts)
    assert best is not None
    return best


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Decode a capture of N inserts with pgcdc and with pypgoutput; compare."
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="inserts (default 1e6)")
    parser.add_argument(
        "--txn-rows", type=int, default=1000, help="rows per transaction (default 1000)"
    )
    parser.add_argument("--capture", type=Path, help="decode this capture instead")
    parser.add_argument(
        "--pg-version", type=int, help="PostgreSQL major for a new capture (default: newest)"
    )
    parser.add_argument("--refresh", action="store_true", help="re-record the cached capture")
    parser.add_argument("--runs", type=int, default=3, help="runs per decoder, best counts")
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile one pgcdc run and print hotspots"
    )
    args = parser.parse_args(argv)

    if args.capture is not None:
        path = args.capture
    else:
        version = args.pg_version or max(installations())
        find_bindir(version)  # a clear error if it is not installed
        CACHE_DIR.mkdir(exist_ok=True)
        path = CACHE_DIR / f"decode-pg{version}-{args.rows}rows-{args.txn_rows}txn.pgcap"
        if args.refresh or not path.exists():
            make_capture(path, args.rows, args.txn_rows, version)
        else:
            print(f"reusing {path} (--refresh to record it again)")

    t0 = time.perf_counter()
    frames = load_frames(path)
    kinds = Counter(chr(f[25]) if f[0] == 0x77 and len(f) > 25 else chr(f[0]) for f in frames)
    mix = ", ".join(f"{k}={v:,}" for k, v in sorted(kinds.items()))
    size = sum(map(len, frames))
    print(
        f"{path.name}: {len(frames):,} frames, {size / 1e6:.1f} MB, loaded in "
        f"{time.perf_counter() - t0:.1f} s\n  message mix (k = keepalive): {mix}"
    )
    rows = kinds["I"] + kinds["U"] + kinds["D"]
    if not rows:
        sys.exit(f"{path}: no row changes in the capture")

    print(f"\ndecoding {rows:,} row changes, best of {args.runs} runs each")
    if SPEEDUPS is None:
        print("  (the C fast path is not built or PGCDC_PURE_PYTHON is set: pgcdc = pure Python)")
    p_wall, p_cpu, p_ins = best_of("pgcdc", decode_pgcdc, frames, args.runs)
    y_wall, y_cpu, y_ins = best_of("pgcdc-py", decode_pgcdc_pure, frames, args.runs)
    o_wall, o_cpu, o_ins = best_of("pypgoutput", decode_pypgoutput, frames, args.runs)
    if not p_ins == y_ins == o_ins == kinds["I"]:
        sys.exit(
            f"insert counts differ: capture {kinds['I']}, pgcdc {p_ins}, pure Python {y_ins}, "
            f"pypgoutput {o_ins}"
        )

    def line(name: str, wall: float, cpu: float) -> str:
        return (
            f"  {name:<10} {rows / wall:>12,.0f} rows/s  {wall / rows * 1e6:6.2f} µs/row wall"
            f"  {cpu / rows * 1e6:6.2f} µs/row CPU"
        )

    python = sys.version.split()[0]
    print(f"\nresults ({rows:,} row changes, {len(frames):,} frames, Python {python})")
    print(f"  load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (skews wall times)")
    print(line("pgcdc", p_wall, p_cpu))
    print(line("pgcdc-py", y_wall, y_cpu))
    print(line("pypgoutput", o_wall, o_cpu))
    print(
        f"  speed ratio pgcdc/pypgoutput (rows/s): {o_wall / p_wall:.2f}x"
        f"  (time ratio {p_wall / o_wall:.2f}); pure Python: {o_wall / y_wall:.2f}x"
    )
    p_cpu_us = p_cpu / rows * 1e6
    print(
        f"  pgcdc CPU per row {p_cpu_us:.2f} µs vs ~{SERVER_CPU_US_PER_ROW} µs server CPU per row "
        f"(DESIGN.md anchor): {SERVER_CPU_US_PER_ROW / p_cpu_us:.1f}x headroom"
        if p_cpu_us
        else ""
    )

    if args.profile:
        print("\ncProfile of one pgcdc run (tottime, top 15):")
        profiler = cProfile.Profile()
        profiler.runcall(decode_pgcdc, frames)
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
