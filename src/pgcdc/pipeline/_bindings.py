"""Which source relations feed which configured table: tables are followed by OID, not name,
and the pipeline watches what the stream cannot show it.

A pipeline names its tables in the configuration (``"public.orders" = "mirror"``); the stream
names them by what each Relation message says, which changes with ``ALTER TABLE … RENAME``
while the relation's OID stays. So on its first run a pipeline records, per configured table,
the OID the name resolved to (``<state>/tables.json``), and from then on routes every change by
its ``relation_oid``: a renamed table keeps streaming into the same targets. A partitioned
table binds its partitions too (their changes arrive under their own OIDs unless the
publication publishes via the root).

Some things change a table's rows, or which of its changes come, without any change the
stream carries. `inspect_tables` looks for them at start and, while the pipeline runs,
every few seconds (`TableEvent`, each with one line):

* the table is gone, or was dropped and created again under its name (a new OID: its targets
  describe another table) — the pipeline stops;
* it left the publication (``ALTER PUBLICATION … DROP TABLE``) — its changes no longer come:
  the pipeline stops (or quarantines it);
* it left the publication and came back, or its entry was replaced (``SET TABLE``): the
  changes in between never came. The publication's catalog rows for the table are recorded
  (their OIDs): another row is another membership, and the table is resynchronized (copied
  under a new snapshot, its targets reconciled with the copy: only what differs changes);
* a partition was attached (its rows came with no change) or detached (its rows left with no
  change): resynchronized too (a detached partition's rows stay with ``on_detach = "keep"``);
* a publication stopped publishing inserts, updates, deletes or truncates: the targets could
  not stay equal to their tables — the pipeline stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pgcdc.errors import PgcdcError, PublicationNotFound
from pgcdc.replication.slots import connect_sql
from pgcdc.replication.sql_session import SqlSession
from pgcdc.storage import FileIO

__all__ = [
    "BindingError",
    "Inspection",
    "TableBindings",
    "TableEvent",
    "bind_partition",
    "inspect_tables",
    "partial_truncates",
]

log = logging.getLogger(__name__)

V = TypeVar("V")


class BindingError(PgcdcError):
    """A configured table cannot be followed: missing, re-created, or not published."""


@dataclass(slots=True)
class TableBindings:
    """Configured table name ⇄ the relation OIDs whose changes go to its targets."""

    #: configured name -> the table's own OID (as recorded on the first run).
    oids: dict[str, int]
    #: relation OID (the table's, or a partition's) -> configured name.
    routes: dict[int, str] = field(default_factory=dict)
    #: configured name -> the table's current "schema.name" in the source.
    current_names: dict[str, str] = field(default_factory=dict)
    #: configured name -> the OIDs of its leaf partitions (a partitioned table's only).
    leaves: dict[str, set[int]] = field(default_factory=dict)
    #: configured name -> the publications' catalog rows that publish it (their OIDs).
    membership: dict[str, list[str]] = field(default_factory=dict)

    def table_of(self, relation_oid: int) -> str | None:
        return self.routes.get(relation_oid)

    def oids_of(self, table: str) -> list[int]:
        return [oid for oid, name in self.routes.items() if name == table]


EventKind = Literal["gone", "recreated", "unpublished", "rejoined", "partitions", "publish"]


@dataclass(frozen=True, slots=True)
class TableEvent:
    """Something the stream cannot show happened to a table (see the module docstring)."""

    table: str
    kind: EventKind
    line: str
    #: For "partitions": the leaves attached and detached.
    attached: frozenset[int] = frozenset()
    detached: frozenset[int] = frozenset()

    @property
    def resync(self) -> bool:
        """Whether the table's targets are mended by a resynchronization."""
        return self.kind in ("rejoined", "partitions")


_RESOLVE = "SELECT to_regclass(%s)::oid"
_DESCRIBE = """
    SELECT n.nspname || '.' || c.relname,
           ARRAY(SELECT relid::oid FROM pg_partition_tree(c.oid) WHERE relid <> c.oid),
           ARRAY(SELECT relid::oid FROM pg_partition_tree(c.oid) WHERE isleaf)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = %s"""
_PUBLISHED = """
    SELECT DISTINCT c.oid
    FROM pg_publication_tables pt
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE pt.pubname = ANY(%s)"""
_ROOT = "SELECT pg_partition_root(%s::oid)::oid"
_PUBLISH_FLAGS = """
    SELECT pubname, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication
    WHERE pubname = ANY(%s)"""
#: The catalog rows that publish a table: FOR TABLE rows (of it, its partitions or its
#: ancestors), FOR TABLES IN SCHEMA rows (15+) of its schema, FOR ALL TABLES publications.
_MEMBERSHIP = """
    SELECT ARRAY(
        SELECT 'table ' || pr.oid FROM pg_publication_rel pr
        JOIN pg_publication p ON p.oid = pr.prpubid
        WHERE p.pubname = ANY(%(pubs)s)
          AND (pr.prrelid = %(oid)s
               OR pr.prrelid IN (SELECT relid FROM pg_partition_tree(%(oid)s))
               OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors(%(oid)s)))
      UNION ALL
        SELECT 'all ' || p.oid FROM pg_publication p
        WHERE p.pubname = ANY(%(pubs)s) AND p.puballtables
      {schema}
      ORDER BY 1)"""
_SCHEMA_MEMBERSHIP = """
      UNION ALL
        SELECT 'schema ' || pn.oid FROM pg_publication_namespace pn
        JOIN pg_publication p ON p.oid = pn.pnpubid
        JOIN pg_class c ON c.relnamespace = pn.pnnspid
        WHERE p.pubname = ANY(%(pubs)s) AND c.oid = %(oid)s"""
_FLAGS = ("inserts", "updates", "deletes", "truncates")


def _quoted(table: str) -> str:
    schema, _, name = table.rpartition(".")
    return '"{}"."{}"'.format((schema or "public").replace('"', '""'), name.replace('"', '""'))


@dataclass(slots=True)
class _Recorded:
    """Per configured table: its OID, its leaf partitions (a partitioned table's), the
    publications' catalog rows that publish it."""

    oids: dict[str, int] = field(default_factory=dict)
    leaves: dict[str, set[int]] = field(default_factory=dict)
    membership: dict[str, list[str]] = field(default_factory=dict)

    def updated(self, other: _Recorded) -> _Recorded:
        """These records, with `other`'s tables as `other` has them."""
        return _Recorded(
            {**self.oids, **other.oids},
            {**self.leaves, **other.leaves},
            {**self.membership, **other.membership},
        )

    def document(self) -> str:
        leaves = {t: sorted(o) for t, o in self.leaves.items()}
        data = {"oids": self.oids, "leaves": leaves, "membership": self.membership}
        return json.dumps(data, indent=1, sort_keys=True)


#: The file of the pipeline's state the bindings are recorded in.
TABLES_FILE = "tables.json"


def _load(state: FileIO) -> _Recorded | None:
    """The recorded OIDs of the tables, of the leaf partitions of partitioned ones, and the
    publications' catalog rows that publish each (None: nothing recorded yet)."""
    text = state.read(TABLES_FILE)
    if text is None:
        return None
    try:
        data = json.loads(text)
        return _Recorded(
            {str(k): int(v) for k, v in data["oids"].items()},
            {str(k): {int(o) for o in v} for k, v in data.get("leaves", {}).items()},
            {str(k): [str(m) for m in v] for k, v in data.get("membership", {}).items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        where = state.location(TABLES_FILE)
        raise BindingError(f"{where}: unreadable table bindings ({exc})") from None


@dataclass(slots=True)
class Inspection:
    """What `inspect_tables` found: the bindings of now and what happened since (events).

    What was found is written down (`record`, into ``tables.json``) only after the events
    were acted upon durably (a resynchronization asked for, a table set aside): were it
    written first, a crash between the two would forget that the table's changes in between
    never came, and the next run would find nothing to mend."""

    bindings: TableBindings
    events: list[TableEvent]
    #: What the events were found against (the records, or the last inspection's findings).
    base: _Recorded
    #: What the next inspection is to compare with (this one's findings, once recorded).
    seen: _Recorded
    state: FileIO
    loaded: _Recorded | None

    def record(self, *, keep: Iterable[str] = ()) -> None:
        """Write the findings down. `keep`: tables whose membership and partitions stay as
        they were recorded: a copy of them is under way, under a snapshot that may be older
        than what changed — the next inspection after it finds the change again."""
        for table in keep:
            _restore(self.seen.membership, self.base.membership, table)
            _restore(self.seen.leaves, self.base.leaves, table)
        loaded = self.loaded or _Recorded()
        after = loaded.updated(self.seen).document()
        if self.loaded is None or after != loaded.document():
            self.state.write(TABLES_FILE, after.encode())


def _check_publications(conn: Any, pubs: list[str]) -> list[str]:
    """Lines for the publications that do not exist or leave out a kind of change."""
    rows = {r[0]: r[1:] for r in conn.execute(_PUBLISH_FLAGS, (pubs,)).fetchall()}
    for pub in pubs:
        if pub not in rows:
            raise PublicationNotFound(f'publication "{pub}" does not exist')
    lines = []
    for pub, flags in rows.items():
        missing = [kind for kind, on in zip(_FLAGS, flags, strict=True) if not on]
        if missing:
            lines.append(
                f"publication {pub} does not publish {' or '.join(missing)}: the targets "
                "could not stay equal to their tables (ALTER PUBLICATION "
                f"{pub} SET (publish = 'insert, update, delete, truncate'))"
            )
    return lines


def _restore(now: dict[str, V], base: dict[str, V], table: str) -> None:
    if table in base:
        now[table] = base[table]
    else:
        now.pop(table, None)


def inspect_tables(
    conninfo: str,
    publications: Iterable[str],
    tables: Iterable[str],
    state: FileIO,
    since: Inspection | None = None,
) -> Inspection:
    """Resolve (first run) or check again every configured table against what was recorded
    (``tables.json`` in the pipeline's `state`), or, while running, what the last inspection
    (`since`) found: its OID, its partitions, its membership in the publications. A table
    that cannot be bound at all raises `BindingError`; nothing is recorded until
    `Inspection.record`."""
    loaded = _load(state)
    base = _Recorded() if loaded is None else loaded
    if since is not None:
        base = base.updated(since.seen)
    pubs = [p.strip() for p in publications if p.strip()]
    tables = list(tables)

    def look(conn: Any) -> tuple[TableBindings, list[TableEvent]]:
        now = TableBindings({})
        events = [TableEvent("", "publish", line) for line in _check_publications(conn, pubs)]
        published = {r[0] for r in conn.execute(_PUBLISHED, (pubs,))}
        schemas = _SCHEMA_MEMBERSHIP if conn.info.server_version >= 150000 else ""
        membership_sql = _MEMBERSHIP.format(schema=schemas)
        for table in tables:
            event = _inspect(conn, table, pubs, published, membership_sql, base, now)
            if event is not None:
                events.append(event)
        return now, events

    if since is None:  # at the start: a server that is not there is said at once
        with connect_sql(conninfo) as conn:
            now, events = look(conn)
    else:  # while running, a restart's or a failover's moment without one is waited out
        with SqlSession(conninfo) as session:
            now, events = session.run(look)
    seen = _Recorded(
        dict(now.oids),
        {t: set(leaves) for t, leaves in now.leaves.items()},  # (routing adds partitions)
        dict(now.membership),
    )
    return Inspection(now, events, base, seen, state, loaded)


def _inspect(
    conn: Any,
    table: str,
    pubs: list[str],
    published: set[int],
    membership_sql: str,
    recorded: _Recorded,
    now: TableBindings,
) -> TableEvent | None:
    resolved = conn.execute(_RESOLVE, (_quoted(table),)).fetchone()
    oid_now = resolved[0] if resolved is not None else None
    oid = recorded.oids.get(table)
    if oid is None:
        if oid_now is None:
            raise BindingError(f"table {table} does not exist in the source database")
        oid = oid_now
    described = conn.execute(_DESCRIBE, (oid,)).fetchone()
    if described is None:
        if oid_now is not None:
            return TableEvent(
                table,
                "recreated",
                f"table {table} was dropped and created again (OID {oid}, now {oid_now}): "
                "its targets hold the old table; move them away (or delete them) and remove "
                f"{table} from the pipeline's tables.json to copy the new one",
            )
        return TableEvent(
            table,
            "gone",
            f"table {table} (OID {oid}) no longer exists in the source: its targets keep "
            "its last rows",
        )
    current, partitions, leaves = described
    if current != table and recorded.oids.get(table) == oid and table not in now.current_names:
        log.debug("%s is now %s (renamed): its changes keep going to its targets", table, current)
    now.oids[table] = oid
    now.current_names[table] = current
    for member in (oid, *partitions):
        now.routes[member] = table
    if partitions:
        now.leaves[table] = set(leaves)
    membership = conn.execute(membership_sql, {"pubs": pubs, "oid": oid}).fetchone()[0]
    now.membership[table] = list(membership)
    if oid not in published and not (leaves and set(leaves) <= published):
        return TableEvent(
            table,
            "unpublished",
            f"table {current} is not in publication {', '.join(pubs)}: its changes do not "
            f"come (ALTER PUBLICATION {pubs[0]} ADD TABLE {current}: it is then copied anew "
            "and its targets reconciled; or remove it from [tables])",
        )
    before = recorded.membership.get(table)
    if before is not None and before != now.membership[table]:
        return TableEvent(
            table,
            "rejoined",
            f"{table} left publication {', '.join(pubs)} and came back (or its entry there "
            "was replaced): the changes in between never came; it is copied anew and its "
            "targets reconciled with the copy",
        )
    old_leaves = recorded.leaves.get(table)
    if old_leaves is not None and partitions and old_leaves != set(leaves):
        attached, detached = set(leaves) - old_leaves, old_leaves - set(leaves)
        what = "; ".join(
            f"{verb} (OID {', '.join(map(str, sorted(oids)))})"
            for verb, oids in (("attached", attached), ("detached", detached))
            if oids
        )
        return TableEvent(
            table,
            "partitions",
            f"{table}: partitions {what}: their rows moved with no change the stream carries",
            frozenset(attached),
            frozenset(detached),
        )
    return None


def bind_partition(conninfo: str, bindings: TableBindings, relation_oid: int) -> str | None:
    """A relation the bindings do not know: a partition attached since the start is routed to
    its root's table; anything else is not the pipeline's (None)."""
    with SqlSession(conninfo) as session:
        rows = session.query(_ROOT, (relation_oid,))
    root: Any = rows[0][0] if rows else None
    table = None if root is None else bindings.table_of(root)
    if table is not None:
        bindings.routes[relation_oid] = table
        bindings.leaves.setdefault(table, set()).add(relation_oid)
    return table


def partial_truncates(bindings: TableBindings, table: str, truncated: Iterable[int]) -> set[int]:
    """Of the relations one transaction truncated, the partitions of `table` whose truncation
    leaves other partitions' rows in place (empty when it emptied the whole table)."""
    own = bindings.oids.get(table)
    oids = set(truncated)
    if own in oids:
        return set()
    leaves = bindings.leaves.get(table, set())
    return set() if leaves <= oids else oids & leaves
