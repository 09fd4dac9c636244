"""Which source relations feed which configured table: tables are followed by OID, not name.

A pipeline names its tables in the configuration (``"public.orders" = "mirror"``); the stream
names them by what each Relation message says, which changes with ``ALTER TABLE … RENAME``
while the relation's OID stays. So on its first run a pipeline records, per configured table,
the OID the name resolved to (``<state>/tables.json``), and from then on routes every change by
its ``relation_oid``: a renamed table keeps streaming into the same targets. A partitioned
table binds its partitions too (their changes arrive under their own OIDs unless the
publication publishes via the root); a partition attached later is bound when its first
change arrives, with a warning: ``ATTACH PARTITION`` brings the rows the partition holds into
the table without a change the stream could carry (and ``DETACH`` takes them away likewise).

Checked before anything else runs, each with one line naming the table:

* the table exists (or its recorded OID does);
* it was not dropped and created again under the same name (a new OID: its targets describe
  another table);
* the publication publishes it (otherwise it would silently never receive a change).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgcdc.errors import PgcdcError, PublicationNotFound
from pgcdc.replication.slots import connect_sql

__all__ = ["BindingError", "TableBindings", "bind_partition", "bind_tables", "partial_truncates"]

log = logging.getLogger(__name__)


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

    def table_of(self, relation_oid: int) -> str | None:
        return self.routes.get(relation_oid)

    def oids_of(self, table: str) -> list[int]:
        return [oid for oid, name in self.routes.items() if name == table]


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


def _quoted(table: str) -> str:
    schema, _, name = table.rpartition(".")
    return '"{}"."{}"'.format((schema or "public").replace('"', '""'), name.replace('"', '""'))


def _load(path: Path) -> tuple[dict[str, int], dict[str, set[int]]]:
    """The recorded OIDs of the tables, and of the leaf partitions of partitioned ones."""
    if not path.exists():
        return {}, {}
    try:
        data = json.loads(path.read_text())
        oids = {str(k): int(v) for k, v in data["oids"].items()}
        leaves = {str(k): {int(o) for o in v} for k, v in data.get("leaves", {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BindingError(f"{path}: unreadable table bindings ({exc})") from None
    return oids, leaves


def _save(path: Path, oids: dict[str, int], leaves: dict[str, set[int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    recorded = {"oids": oids, "leaves": {t: sorted(o) for t, o in leaves.items()}}
    tmp.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    tmp.replace(path)


def _warn_partitions(table: str, attached: set[int], detached: set[int]) -> None:
    """ATTACH and DETACH PARTITION move rows into and out of a table without a change the
    stream could carry: the targets cannot know them."""
    if attached:
        log.warning(
            "%s: partition(s) attached since the pipeline last ran (OID %s) stream into it; "
            "rows one held before it was attached came with no change: if it had any, "
            "`pgcdc recopy` the table",
            table,
            ", ".join(map(str, sorted(attached))),
        )
    if detached:
        log.warning(
            "%s: partition(s) detached since the pipeline last ran (OID %s): their rows "
            "left the table with no change, and its targets still hold them: "
            "`pgcdc recopy` the table",
            table,
            ", ".join(map(str, sorted(detached))),
        )


def bind_tables(
    conninfo: str, publications: Iterable[str], tables: Iterable[str], state_file: Path
) -> TableBindings:
    """Resolve (first run) or re-check (later runs) every configured table, record the OIDs,
    and check that the publications publish each one (or all of its partitions)."""
    recorded, recorded_leaves = _load(state_file)
    pubs = [p.strip() for p in publications if p.strip()]
    bindings = TableBindings({})
    with connect_sql(conninfo) as conn:
        for pub in pubs:
            row = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,))
            if row.fetchone() is None:
                raise PublicationNotFound(f'publication "{pub}" does not exist')
        published = {r[0] for r in conn.execute(_PUBLISHED, (pubs,))}
        for table in tables:
            resolved = conn.execute(_RESOLVE, (_quoted(table),)).fetchone()
            now = resolved[0] if resolved is not None else None
            oid = recorded.get(table)
            if oid is None:
                if now is None:
                    raise BindingError(f"table {table} does not exist in the source database")
                oid = now
            described = conn.execute(_DESCRIBE, (oid,)).fetchone()
            if described is None:
                if now is not None:
                    raise BindingError(
                        f"table {table} was dropped and created again (OID {oid}, now {now}): "
                        "its targets hold the old table; move them away (or delete them) and "
                        f"remove {table} from {state_file} to copy the new one"
                    )
                raise BindingError(f"table {table} (OID {oid}) no longer exists in the source")
            current, partitions, leaves = described
            if current != table:
                log.info(
                    "%s is now %s (renamed): its changes keep going to %s's targets",
                    table,
                    current,
                    table,
                )
            if oid not in published and not (leaves and set(leaves) <= published):
                raise BindingError(
                    f"table {current} is not in publication {', '.join(pubs)}: it would never "
                    f"receive a change (ALTER PUBLICATION {pubs[0]} ADD TABLE {current}, "
                    "or remove it from [tables])"
                )
            bindings.oids[table] = oid
            bindings.current_names[table] = current
            if partitions:
                bindings.leaves[table] = set(leaves)
            if table in recorded_leaves:
                before = recorded_leaves[table]
                _warn_partitions(table, set(leaves) - before, before - set(leaves))
            for member in (oid, *partitions):
                bindings.routes[member] = table
    if bindings.oids != recorded or any(
        recorded_leaves.get(t) != o for t, o in bindings.leaves.items()
    ):
        _save(state_file, {**recorded, **bindings.oids}, {**recorded_leaves, **bindings.leaves})
    return bindings


def bind_partition(conninfo: str, bindings: TableBindings, relation_oid: int) -> str | None:
    """A relation the bindings do not know: a partition attached since the start is routed to
    its root's table; anything else is not the pipeline's (None)."""
    with connect_sql(conninfo) as conn:
        row = conn.execute(_ROOT, (relation_oid,)).fetchone()
    root: Any = row[0] if row else None
    table = None if root is None else bindings.table_of(root)
    if table is not None:
        bindings.routes[relation_oid] = table
        bindings.leaves.setdefault(table, set()).add(relation_oid)
        _warn_partitions(table, {relation_oid}, set())
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
