"""A durable change consumer, run as a separate process by test_crash_resume.py.

It tails a slot with `ReplicationClient` and, for every committed transaction, appends one JSON
line ``{"end": "X/Y", "changes": [["I", id, v], ["U", id, v], ["D", id], ...]}`` to `--out`,
fsyncs it, and only then confirms the transaction's end LSN to the client. On start it reads its
own file: the highest end LSN there is its durable high-water mark, passed as `start_lsn`, so
that transactions already on file are not handed over again even if the server's slot lags
behind (after kill -9 the last lines may be durable but not yet confirmed to the server). A torn
last line (killed in the middle of a write) is cut off first.

The consumer itself trusts the client: it never filters by LSN, so duplicates on file would be
the client's doing.

    python consumer.py --dsn DSN --slot S --publication P --out FILE
                       [--until-idle] [--reconnect] [--stop-at-id N] [--status-interval SEC]
                       [--no-start-lsn]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pgcdc.protocol import INVALID_LSN, Begin, Commit, Delete, Insert, Lsn, Update
from pgcdc.replication import ReplicationClient, StreamOptions
from pgcdc.replication.stream import LogicalStream


def high_water_mark(path: Path) -> Lsn:
    """The highest end LSN on file, after cutting off a torn last line."""
    if not path.exists():
        return INVALID_LSN
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "r+b") as file:
            file.truncate(keep)
            os.fsync(file.fileno())
    ends = [Lsn.parse(json.loads(line)["end"]) for line in data[:keep].splitlines() if line]
    return max(ends, default=INVALID_LSN)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--publication", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--until-idle", action="store_true")
    parser.add_argument("--reconnect", action="store_true")
    parser.add_argument("--stop-at-id", type=int, default=None)
    parser.add_argument("--status-interval", type=float, default=0.5)
    parser.add_argument(
        "--no-start-lsn",
        action="store_true",
        help="(negative control) resume from the slot, not from the file's high-water mark",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="consumer: %(levelname)s %(message)s")

    start = high_water_mark(args.out)
    if args.no_start_lsn:
        start = INVALID_LSN
    print(f"consumer: start_lsn {start}", file=sys.stderr, flush=True)

    def on_session(stream: LogicalStream) -> None:
        print(f"consumer: connected, resuming at {stream.start_lsn}", file=sys.stderr, flush=True)

    client = ReplicationClient(
        args.dsn,
        args.slot,
        StreamOptions((args.publication,)),
        start_lsn=start,
        until_idle=args.until_idle,
        reconnect=args.reconnect,
        reconnect_timeout=60.0,
        max_backoff=1.0,
        status_interval=args.status_interval,
        on_session=on_session,
    )
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    changes: list[list[object]] = []
    with client:
        for _frame, message in client:
            if isinstance(message, Begin):
                changes = []
            elif isinstance(message, Insert):
                changes.append(["I", int(message.new.text(0) or 0), int(message.new.text(1) or 0)])
            elif isinstance(message, Update):
                changes.append(["U", int(message.new.text(0) or 0), int(message.new.text(1) or 0)])
            elif isinstance(message, Delete):
                changes.append(["D", int(message.old.text(0) or 0)])
            elif isinstance(message, Commit):
                line = json.dumps({"end": str(message.end_lsn), "changes": changes}) + "\n"
                os.write(fd, line.encode())
                os.fsync(fd)  # durable first ...
                client.confirm(message.end_lsn)  # ... then confirmed
                if args.stop_at_id is not None and ["I", args.stop_at_id] in [
                    c[:2] for c in changes
                ]:
                    break
    os.close(fd)
    print("consumer: done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
