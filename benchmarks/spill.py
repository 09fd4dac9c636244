"""Memory of a huge streamed transaction delivered to a plugin without streaming callbacks.

What is measured
    One throwaway PostgreSQL server (newest installed version unless ``--pg-version``), a
    table ``big(id bigint, v text)`` in a publication, and one transaction inserting rows of
    ~1 kB until the pgoutput stream of it holds ``--gb`` GB (default 2) of row data. The
    walsender session runs with ``streaming on`` and ``logical_decoding_work_mem = 64kB``, so
    the server streams the transaction in chunks while it runs.

    Consumers, each on its own fresh slot created before the transaction, in this process:

    buffered   a plugin with only begin/change/commit: pgcdc's assembler buffers the streamed
               transaction by xid within ``--memory-limit`` (default 64 MB), spills the rest
               to disk, and delivers it at Stream Commit as one ordinary transaction.
    streaming  the same plugin plus the streaming callbacks: nothing is buffered (the
               baseline: what reading and decoding alone cost).

    Reported: the transaction's row-data bytes, the process's peak RSS before and after each
    run (``ru_maxrss``; the buffered run goes first so its peak is its own), rows/s, bytes
    spilled, and the ratios buffered/streaming (time) and peak RSS / transaction size.
    The target is a 2 GB transaction in under 500 MB RSS.

How to run (from the repository root)
    .venv/bin/python benchmarks/spill.py --gb 0.2    # quick check
    .venv/bin/python benchmarks/spill.py             # 2 GB (several minutes, ~6 GB of disk)
"""

from __future__ import annotations

import argparse
import resource
import time

from pgcdc.decoding import OutputPlugin, PluginRunner
from pgcdc.embedded import EmbeddedServer, available_versions
from pgcdc.replication import StreamOptions

ROW_TEXT_BYTES = 1000


class Count(OutputPlugin):
    """Counts rows and bytes; checks that rows arrive complete and in order."""

    rows = 0
    value_bytes = 0
    transactions = 0

    def begin(self, ctx, txn):
        pass

    def change(self, ctx, txn, relation, change):
        values = change.new.values
        if int(values[0]) != Count.rows + 1:
            raise AssertionError(f"row {values[0]!r} after {Count.rows}")
        Count.rows += 1
        Count.value_bytes += len(values[0]) + len(values[1])

    def commit(self, ctx, txn, commit_lsn):
        Count.transactions += 1


class StreamingCount(Count):
    def stream_start(self, ctx, txn):
        pass

    def stream_stop(self, ctx, txn):
        pass

    def stream_abort(self, ctx, txn, abort_lsn):
        raise AssertionError("unexpected abort")

    def stream_change(self, ctx, txn, relation, change):
        self.change(ctx, txn, relation, change)

    def stream_commit(self, ctx, txn, commit_lsn):
        Count.transactions += 1


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="transaction size in GB")
    parser.add_argument("--memory-limit", type=int, default=64, help="assembler budget, MB")
    parser.add_argument("--pg-version", type=int, default=None)
    args = parser.parse_args()
    version = args.pg_version or max(available_versions())
    rows = int(args.gb * 1e9 / (ROW_TEXT_BYTES + 7))
    settings = {"autovacuum": "off", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}
    print(f"PostgreSQL {version}: one transaction of {rows:,} rows of ~1 kB ({args.gb} GB)")
    with EmbeddedServer(version, settings=settings) as server:
        db = server.create_database("spill")
        db.execute("CREATE TABLE big (id bigint, v text)")
        db.execute("ALTER TABLE big ALTER v SET STORAGE PLAIN")
        db.execute("CREATE PUBLICATION pub FOR TABLE big")
        for slot in ("buffered", "streaming"):
            db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        t0 = time.perf_counter()
        db.execute(
            f"INSERT INTO big SELECT g, repeat(md5(g::text), {ROW_TEXT_BYTES // 32}) "
            f"|| lpad('', {ROW_TEXT_BYTES % 32}, 'x') FROM generate_series(1, {rows}) g"
        )
        print(f"  workload written in {time.perf_counter() - t0:.0f} s")
        options = StreamOptions(("pub",), settings={"logical_decoding_work_mem": "64kB"})
        results = {}
        for name, plugin in (("buffered", Count), ("streaming", StreamingCount)):
            Count.rows = Count.value_bytes = Count.transactions = 0
            before = peak_rss_mb()
            runner = PluginRunner(
                db.dsn,
                name,
                plugin,
                options,
                streaming="on",
                memory_limit=args.memory_limit << 20,
                until_idle=True,
            )
            t0 = time.perf_counter()
            stats = runner.run()
            elapsed = time.perf_counter() - t0
            if Count.rows != rows or Count.transactions != 1:
                raise SystemExit(f"{name}: got {Count.rows} rows in {Count.transactions} txns")
            results[name] = (elapsed, before, peak_rss_mb(), runner.pool, Count.value_bytes)
            print(
                f"  {name:<9} {elapsed:7.1f} s  {rows / elapsed:>9,.0f} rows/s  peak RSS "
                f"{before:6.0f} -> {peak_rss_mb():6.0f} MB  spilled "
                f"{runner.pool.spilled_bytes / 1e9:.2f} GB in {runner.pool.spill_count} spills  "
                f"(buffered txns: {stats.streamed_buffered})"
            )
    elapsed, _, peak, pool, value_bytes = results["buffered"]
    print(
        f"\nresults: transaction of {value_bytes / 1e9:.2f} GB of row data "
        f"(assembler budget {args.memory_limit} MB, "
        f"peak estimate {pool.peak_memory_bytes >> 20} MB)"
    )
    print(f"  buffered peak RSS {peak:.0f} MB = {peak * 1e6 / value_bytes:.3f} x the transaction")
    big_enough = value_bytes >= 1.98e9  # --gb 2 gives 2.00 GB of row data, give or take a row
    verdict = "OK" if peak < 500 and big_enough else "not shown (needs --gb 2 and < 500 MB)"
    print(f"  target < 500 MB RSS for a 2 GB transaction: {verdict}")
    print(f"  time buffered/streaming: {elapsed / results['streaming'][0]:.2f}x")


if __name__ == "__main__":
    main()
