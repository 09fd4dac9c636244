"""A target kept open over a long run of small batches: does a batch cost more by the hour?

What is measured
    One `pgcdc.targets.DeltaTarget` (a mirror, local, deletion vectors), as the pipeline's
    driver keeps it between batches: a table of ``--rows`` rows (10,000), then ``--batches``
    batches (4,000) of ``--updates`` random updates each (20), each followed by
    ``DeltaTarget.maintain()`` as the driver calls it (a pass every 25 versions: compaction,
    vacuum, a checkpoint every 100 commits). Per window of ``--window`` batches (500): the
    process's CPU milliseconds per batch (all threads: delta-rs works in its own) and the
    entries in the table's ``_delta_log``. The baseline is the run's own first window: the
    ratio last / first says whether a batch grows dearer as the run goes on (before pgcdc
    read the table anew now and then, delta-rs's ``update_incremental`` cost grew with every
    commit it had read since the table was opened). Then the same table opened anew (a fresh
    `DeltaTarget`) takes ``--window`` more batches: the cost of a kept table against a fresh
    one, on the same log.

How to run (from the repository root)
    .venv/bin/python benchmarks/target_batches.py                 # about 2 minutes
    .venv/bin/python benchmarks/target_batches.py --batches 20000 # the log of ~3 hours at 2/s
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pgcdc.targets import DeltaTarget
from targets.envelopes import INT4, TEXT, envelope, insert, relation, txn, update

REL = relation(("id", INT4, True), ("v", INT4), ("pad", TEXT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=4_000)
    parser.add_argument("--updates", type=int, default=20, help="updates per batch (20)")
    parser.add_argument("--window", type=int, default=500, help="batches per line (500)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pgcdc-target-batches-"))
    path = str(work / "mirror")
    rng = random.Random(1)
    lsn = 0x1000

    def batch(target: DeltaTarget) -> None:
        nonlocal lsn
        lsn += 0x100
        changes = [
            update(REL, {"id": rng.randrange(args.rows), "v": lsn, "pad": "q"})
            for _ in range(args.updates)
        ]
        target.apply(envelope(txn(lsn, *changes)))
        target.maintain()

    def window(target: DeltaTarget) -> float:
        started = time.process_time()
        for _ in range(args.window):
            batch(target)
        return (time.process_time() - started) / args.window * 1000

    try:
        kept = DeltaTarget(path, "mirror", app_id="pgcdc:bench")
        rows = (insert(REL, id=i, v=0, pad="p" * 50) for i in range(args.rows))
        kept.apply(envelope(txn(lsn, *rows)))
        print(f"a mirror of {args.rows:,} rows; batches of {args.updates} updates, kept open")
        print("   batches   CPU ms/batch   _delta_log entries")
        costs = []
        for start in range(0, args.batches, args.window):
            costs.append(window(kept))
            entries = len(os.listdir(os.path.join(path, "_delta_log")))
            print(f"  {start + 1:>5}-{start + args.window:<6} {costs[-1]:>9.1f} {entries:>14,}")
        fresh = window(DeltaTarget(path, "mirror", app_id="pgcdc:bench"))
        print(f"  then {args.window} batches of the same table opened anew: {fresh:.1f} ms/batch")
        print(f"last window / first window: {costs[-1] / costs[0]:.2f}")
        print(f"kept table / table opened anew (last window): {costs[-1] / fresh:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
