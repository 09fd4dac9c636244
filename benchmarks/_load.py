"""The open-loop load of benchmarks/sustained.py: its tables and the worker processes.

Five tables of different shapes (and a heartbeat, written by the benchmark itself):

    orders      bigint key; numeric(12,2), text, timestamptz, jsonb
    line_items  composite key (order_id, line_no); text, int, numeric
    counters    a few hot rows, updated all the time
    wide        30 columns: integers, floats, numerics, booleans, timestamps, short texts
                and one 1-3 kB text (often TOASTed: updates that leave it alone send it
                as "unchanged")
    big         --big-rows rows under uniformly random updates

A worker (one process, one connection) owns the orders, line items and wide rows whose
order id is congruent to its index modulo the number of workers, so the live keys it updates
and deletes are known without asking the server; big and counters rows are shared. Each
transaction is 1-20 row changes (uniform), each change drawn by `WEIGHTS` and `OPS`, sent
as one ``BEGIN; ...; COMMIT`` round trip: one statement per table and operation, rows in
key order and tables in one order (no deadlocks between workers), at most one hot counter.

Open loop: transaction i is due at step start + (changes of the transactions before it) /
rate; a worker behind schedule sends the next at once and never skips one, so a server that
cannot keep up shows as a lower achieved rate and a growing delay, not as a lower offered one.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

COUNTERS = 16

SCHEMA = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, amount numeric(12,2), status text,
    created_at timestamptz, updated_at timestamptz, attrs jsonb);
CREATE TABLE line_items (
    order_id bigint, line_no int, sku text, qty int, price numeric(10,2), note text,
    PRIMARY KEY (order_id, line_no));
CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL, updated_at timestamptz);
CREATE TABLE wide (
    id bigint PRIMARY KEY,
    i01 int, i02 int, i03 int, i04 int, i05 bigint, i06 bigint, i07 bigint, i08 bigint,
    f01 float8, f02 float8, f03 float8, f04 float8,
    n01 numeric(14,4), n02 numeric(14,4), n03 numeric(14,4),
    b01 bool, b02 bool, b03 bool,
    t01 timestamptz, t02 timestamptz, t03 timestamptz, t04 timestamptz,
    s01 text, s02 text, s03 text, s04 text, s05 text, s06 text, body text);
CREATE TABLE big (id bigint PRIMARY KEY, v bigint NOT NULL, touched timestamptz, pad text);
"""
TABLES = ("orders", "line_items", "counters", "wide", "big")

#: 1-3 kB of hex text for row `i` (32 to 96 md5s).
BODY = (
    "(SELECT string_agg(md5(({i} * 100 + k)::text), '') "
    "FROM generate_series(1, 32 + ({i} + (random() * 64)::int) % 65) AS k)"
)
WIDE_VALUES = ", ".join(
    [
        "{i}",
        *(f"({{i}} * {k}) % 1000003" for k in range(1, 9)),
        *(f"random() * {k}" for k in range(1, 5)),
        *("round((random() * 10000)::numeric, 4)" for _ in range(3)),
        *("random() < 0.5" for _ in range(3)),
        *("now() - random() * interval '1 day'" for _ in range(4)),
        *(f"md5(({{i}} + {k})::text)" for k in range(6)),
        BODY,
    ]
)
ORDER_VALUES = (
    "{i}, {i} % 100000, ({i} % 100000) / 100.0, 'new', now(), now(), "
    "jsonb_build_object('channel', 'web', 'items', {i} % 10, 'rev', 0)"
)


def fill_statements(orders: int, wide: int, big: int, chunk: int = 500_000) -> list[str]:
    """The statements that pre-populate the tables: `orders` orders with three line items
    each, the counters, `wide` wide rows and `big` big rows."""
    out = [f"INSERT INTO counters SELECT g, 0, now() FROM generate_series(1, {COUNTERS}) g"]

    def chunks(total: int, step: int, sql: str) -> None:
        for lo in range(1, total + 1, step):
            hi = min(lo + step - 1, total)
            out.append(sql.format(lo=lo, hi=hi))

    chunks(
        orders,
        chunk,
        f"INSERT INTO orders SELECT {ORDER_VALUES.format(i='g')} "
        "FROM generate_series({lo}, {hi}) g",
    )
    chunks(
        orders,
        chunk,
        "INSERT INTO line_items SELECT g, l, 'sku-' || g % 9973, 1 + l, (g % 1000) / 10.0, "
        "md5(g::text) FROM generate_series({lo}, {hi}) g, generate_series(1, 3) l",
    )
    chunks(
        wide,
        20_000,
        f"INSERT INTO wide SELECT {WIDE_VALUES.format(i='g')} "
        "FROM generate_series({lo}, {hi}) g",
    )
    chunks(
        big,
        chunk,
        "INSERT INTO big SELECT g, 0, now(), md5(g::text) FROM generate_series({lo}, {hi}) g",
    )
    return out


#: How a transaction's row changes spread over the tables, and each table's operations.
WEIGHTS = {"orders": 0.22, "line_items": 0.28, "counters": 0.10, "wide": 0.10, "big": 0.30}
OPS = {
    "orders": {"insert": 0.40, "update": 0.45, "delete": 0.15},
    "line_items": {"insert": 0.45, "update": 0.35, "delete": 0.20},
    "counters": {"update": 1.0},
    "wide": {"insert": 0.30, "update": 0.55, "delete": 0.15},
    "big": {"update": 1.0},
}
#: The order statements run in: every transaction locks tables (and keys) in this order.
ORDER = ("orders", "line_items", "wide", "big", "counters")


@dataclass(frozen=True, slots=True)
class Sizes:
    orders: int
    wide: int
    big: int


class Live:
    """A worker's live keys of one table: a random one in O(1), removal in O(1)."""

    def __init__(self, keys: list[Any]) -> None:
        self.keys = keys
        self.index = {k: i for i, k in enumerate(keys)}

    def pick(self, rng: random.Random, n: int, taken: set[Any]) -> list[Any]:
        """Up to `n` distinct keys not in `taken` (fewer when the table is nearly empty)."""
        out: list[Any] = []
        for _ in range(n * 3):
            if len(out) == n or not self.keys:
                break
            key = self.keys[rng.randrange(len(self.keys))]
            if key not in taken:
                taken.add(key)
                out.append(key)
        return out

    def add(self, key: Any) -> None:
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key: Any) -> None:
        i = self.index.pop(key)
        last = self.keys.pop()
        if i < len(self.keys):
            self.keys[i] = last
            self.index[last] = i


def _each(do: Callable[[Any], None], keys: list[Any]) -> None:
    for key in keys:
        do(key)


def _ids(values: list[int], kind: str = "bigint") -> str:
    return "'{" + ",".join(str(v) for v in values) + "}'::" + kind + "[]"


def _pairs(pairs: list[tuple[int, int]]) -> str:
    return f"unnest({_ids([o for o, _ in pairs])}, {_ids([n for _, n in pairs], 'int')}) AS u(o, l)"


@dataclass(slots=True)
class StepStats:
    """What one worker did in one step."""

    transactions: int = 0
    failed: int = 0
    changes: int = 0  # rows the committed statements reported
    planned: int = 0  # changes of the transactions sent
    late: int = 0  # transactions sent more than 50 ms after they were due
    max_behind: float = 0.0
    behind_at_end: float = 0.0  # seconds behind schedule when the step ended
    cpu: float = 0.0  # this worker's CPU seconds in the step


class Worker:
    """One client connection's share of the load."""

    def __init__(self, index: int, workers: int, sizes: Sizes, seed: int) -> None:
        self.rng = random.Random(seed * 1000 + index)
        self.index, self.workers, self.sizes = index, workers, sizes
        mine = [i for i in range(1, sizes.orders + 1) if i % workers == index]
        self.orders = Live(mine)
        self.items = Live([(o, n) for o in mine for n in (1, 2, 3)])
        self.wide = Live([i for i in range(1, sizes.wide + 1) if i % workers == index])
        top = max(sizes.orders, sizes.wide)
        self.next_id = top - top % workers + workers + index  # ≡ index (mod workers)
        self.next_line = 4

    def _new_id(self) -> int:
        key = self.next_id
        self.next_id += self.workers
        return key

    def transaction(self) -> tuple[str, int, Callable[[], None]]:
        """One transaction's SQL, its planned changes, and what to record once committed."""
        rng = self.rng
        size = rng.randint(1, 20)
        counts: dict[tuple[str, str], int] = {}
        names, weights = list(WEIGHTS), list(WEIGHTS.values())
        for table in rng.choices(names, weights, k=size):
            if table == "counters" and ("counters", "update") in counts:
                table = "big"  # one hot counter per transaction at most
            ops = OPS[table]
            op = rng.choices(list(ops), list(ops.values()))[0]
            counts[(table, op)] = counts.get((table, op), 0) + 1
        sql, after = ["BEGIN"], []
        planned = 0
        for table in ORDER:
            taken: set[Any] = set()
            for op in ("delete", "update", "insert"):
                n = counts.get((table, op), 0)
                if not n:
                    continue
                statement, done, rows = self._statement(table, op, n, taken)
                if statement:
                    sql.append(statement)
                    planned += rows
                    if done is not None:
                        after.append(done)
        sql.append("COMMIT")

        def committed() -> None:
            for done in after:
                done()

        return "; ".join(sql), planned, committed

    def _statement(
        self, table: str, op: str, n: int, taken: set[Any]
    ) -> tuple[str, Callable[[], None] | None, int]:
        rng = self.rng
        if table == "big":
            keys = sorted({rng.randint(1, self.sizes.big) for _ in range(n)})
            return (
                f"UPDATE big SET v = v + 1, touched = now() WHERE id = ANY({_ids(keys)})",
                None,
                len(keys),
            )
        if table == "counters":
            key = rng.randint(1, COUNTERS)
            return f"UPDATE counters SET n = n + 1, updated_at = now() WHERE id = {key}", None, 1
        if table == "line_items":
            return self._line_items(op, n, taken)
        live = self.orders if table == "orders" else self.wide
        if op == "insert":
            keys = [self._new_id() for _ in range(n)]
            values = ORDER_VALUES if table == "orders" else WIDE_VALUES
            sql = (
                f"INSERT INTO {table} SELECT {values.format(i='i')} FROM unnest({_ids(keys)}) AS i"
            )
            return sql, lambda: _each(live.add, keys), n
        keys = sorted(live.pick(rng, n, taken))
        if not keys:
            return "", None, 0
        if op == "delete":
            sql = f"DELETE FROM {table} WHERE id = ANY({_ids(keys)})"
            return sql, lambda: _each(live.remove, keys), len(keys)
        if table == "orders":
            sets = (
                "status = (ARRAY['paid', 'shipped', 'done'])[1 + id % 3], amount = amount + 1.25, "
                "updated_at = now(), attrs = jsonb_set(attrs, '{rev}', "
                "to_jsonb(coalesce((attrs->>'rev')::int, 0) + 1))"
            )
        else:
            sets = "i01 = i01 + 1, f01 = random(), t01 = now(), s01 = md5(random()::text)"
            if rng.random() < 0.25:  # else the TOASTed body goes as "unchanged"
                sets += ", body = " + BODY.format(i="id")
        return f"UPDATE {table} SET {sets} WHERE id = ANY({_ids(keys)})", None, len(keys)

    def _line_items(
        self, op: str, n: int, taken: set[Any]
    ) -> tuple[str, Callable[[], None] | None, int]:
        items = self.items
        if op == "insert":
            orders = self.orders.keys
            if not orders:
                return "", None, 0
            pairs = []
            for _ in range(n):
                pairs.append((orders[self.rng.randrange(len(orders))], self.next_line))
                self.next_line += 1
            sql = (
                "INSERT INTO line_items SELECT o, l, 'sku-' || o % 9973, 1 + l % 5, "
                f"round((random() * 100)::numeric, 2), md5(random()::text) FROM {_pairs(pairs)}"
            )
            return sql, lambda: _each(items.add, pairs), n
        pairs = sorted(items.pick(self.rng, n, taken))
        if not pairs:
            return "", None, 0
        where = "li.order_id = u.o AND li.line_no = u.l"
        if op == "delete":
            sql = f"DELETE FROM line_items AS li USING {_pairs(pairs)} WHERE {where}"
            return sql, lambda: _each(items.remove, pairs), len(pairs)
        sql = (
            "UPDATE line_items AS li SET qty = qty + 1, price = price + 0.01 "
            f"FROM {_pairs(pairs)} WHERE {where}"
        )
        return sql, None, len(pairs)


def _changes(cur: Any) -> int:
    """Rows the statements of one simple-query round trip changed (their command tags)."""
    total = 0
    while True:
        tag = cur.statusmessage or ""
        if tag.startswith(("INSERT", "UPDATE", "DELETE")):
            total += int(tag.rsplit(" ", 1)[1])
        if not cur.nextset():
            return total


def run_step(conn: Any, worker: Worker, rate: float, start: float, seconds: float) -> StepStats:
    """Send transactions on the open-loop schedule of `rate` changes/s from wall time
    `start` for `seconds`."""
    import psycopg

    stats = StepStats()
    end = start + seconds
    cpu0 = time.process_time()
    planned = 0
    while True:
        due = start + planned / rate
        if due >= end:
            break
        now = time.time()
        if now < due:
            time.sleep(due - now)
        else:
            behind = now - due
            stats.max_behind = max(stats.max_behind, behind)
            stats.late += behind > 0.05
            if now >= end:
                stats.behind_at_end = behind
                break
        sql, rows, committed = worker.transaction()
        planned += rows
        stats.planned += rows
        try:
            stats.changes += _changes(conn.execute(sql))
        except psycopg.Error:
            stats.failed += 1
            conn.execute("ROLLBACK")
            continue
        stats.transactions += 1
        committed()
    stats.cpu = time.process_time() - cpu0
    return stats


def worker_main(
    dsn: str, index: int, workers: int, sizes: Sizes, seed: int, pipe: Connection
) -> None:
    """A worker process: builds its keys, connects, then runs the steps it is sent
    (``("run", rate, start, seconds)`` -> its `StepStats` as a dict) until ``("stop",)``."""
    import psycopg

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops us
    worker = Worker(index, workers, sizes, seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pipe.send("ready")
        while True:
            command = pipe.recv()
            if command[0] != "run":
                return
            _, rate, start, seconds = command
            try:
                pipe.send(asdict(run_step(conn, worker, rate, start, seconds)))
            except Exception as exc:
                pipe.send({"error": f"{type(exc).__name__}: {exc}"})
