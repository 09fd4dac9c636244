"""What each column of a Relation message is: its attnum, found from the catalog.

A Relation message lists a table's columns in attnum order with names and types only. Names
do not say what a column is: swapping two names, or dropping a column and adding another of
the same name, gives messages that a match by name cannot tell from no change. So each new
version of a relation the stream sends is resolved on the driver to the attnums of its
columns (`ColumnIdentities`), and targets follow columns by them, as tables are followed by
OID. A partition's columns are given the partitioned table's attnums (the same names: DDL on
the parent reaches every partition), so that the changes of every leaf speak of one set of
columns.

The catalog read is the one of now, which may be ahead of the message (more DDL since: a
backlog). `resolve_attnums` is exact when the catalog's columns still are the message's;
otherwise it works forward from the relation's previous version, which the same process
resolved: attnums are never reused (a new column takes a higher one than any the table had)
and a dropped column never comes back, so the message's columns are the previous version's
columns but the ones dropped since, followed by ones added since; the catalog says which were
dropped and added by now, and of the ways to read the message it picks the one whose names
and types agree most with the catalog's and the previous version's (then the one with the
fewest columns dropped and the earliest added: the message came before the later DDL). A
relation seen for the first time with a catalog already past it is matched by name (the only
guess there is; 0 where even that fails).

Each Relation message is resolved when it arrives (the spool asks), so that a message the
server sends again after DDL with the very same names and types (``DROP c; ADD c`` of the
same type) still tells the new column. What stays out of reach: such a message in a backlog
whose catalog has moved on (the pipeline stopped or behind while the table changed that way,
with later DDL): then the catalog cannot say whether a change came before or after the DDL.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pgcdc.protocol import Relation

__all__ = ["Attribute", "ColumnIdentities", "resolve_attnums"]

log = logging.getLogger(__name__)

#: The most alternatives `resolve_attnums` weighs (columns dropped and added since).
_MAX_CHOICES = 4096


@dataclass(frozen=True, slots=True)
class Attribute:
    """A ``pg_attribute`` row of the table (dropped ones included: they keep their attnum)."""

    attnum: int
    name: str
    type_oid: int
    type_modifier: int
    dropped: bool = False
    #: Whether a Relation message lists it now (not generated unless published, in the
    #: publications' column lists).
    sent: bool = True
    #: The partitioned table's attnum of the same column (its own for a table).
    root_attnum: int = 0


#: A message's column: (name, type OID, type modifier).
MessageColumn = tuple[str, int, int]


def resolve_attnums(
    message: Sequence[MessageColumn],
    catalog: Sequence[Attribute],
    previous: Sequence[tuple[int, MessageColumn]] | None = None,
) -> tuple[int, ...]:
    """The attnums of the message's columns (0 where none can be told); `previous`: the
    relation's previous version, (attnum, column) each."""
    live = [a for a in catalog if not a.dropped and a.sent]
    if [(a.name, a.type_oid, a.type_modifier) for a in live] == list(message):
        return tuple(a.attnum for a in live)
    if previous and all(n for n, _ in previous):
        found = _forward(message, catalog, previous)
        if found is not None:
            return found
    by_name = {a.name: a.attnum for a in catalog if not a.dropped}
    return tuple(by_name.get(name, 0) for name, _, _ in message)


def _forward(
    message: Sequence[MessageColumn],
    catalog: Sequence[Attribute],
    previous: Sequence[tuple[int, MessageColumn]],
) -> tuple[int, ...] | None:
    """The previous version's columns without some dropped since, then some added since:
    the reading that agrees most with the catalog's names and types (None: no reading fits)."""
    attribute = {a.attnum: a for a in catalog}
    was = dict(previous)
    before = [n for n, _ in previous]
    highest = max(before)
    gone = [n for n in before if not _sent(attribute.get(n))]
    newer = [a.attnum for a in catalog if a.attnum > highest and (a.dropped or a.sent)]
    best: tuple[int, int, int, tuple[int, ...]] | None = None
    tried = 0
    for dropped_count in range(len(gone) + 1):
        for dropped in itertools.combinations(gone, dropped_count):
            kept = [n for n in before if n not in dropped]
            wanted = len(message) - len(kept)
            if not 0 <= wanted <= len(newer):
                continue
            for added in itertools.combinations(newer, wanted):
                tried += 1
                if tried > _MAX_CHOICES:
                    return best[3] if best else None
                reading = (*kept, *added)
                score = sum(
                    _agreement(attribute.get(n), c) + _continuity(was.get(n), c)
                    for n, c in zip(reading, message, strict=True)
                )
                rank = (score, -dropped_count, -sum(added), reading)
                if best is None or rank[:3] > best[:3]:
                    best = rank
    return None if best is None else best[3]


def _continuity(before: MessageColumn | None, column: MessageColumn) -> int:
    """A column kept from the previous version: its name and type as they were count for
    it; both changed (a rename and a type change) counts against it (a drop and an add of
    another column is the likelier story)."""
    if before is None:
        return 0
    name, type_ = before[0] == column[0], before[1:] == column[1:]
    return 2 * name + type_ if name or type_ else -1


def _sent(attribute: Attribute | None) -> bool:
    return attribute is not None and not attribute.dropped and attribute.sent


def _agreement(attribute: Attribute | None, column: MessageColumn) -> int:
    """How well the catalog's attribute agrees with a message's column: its name (and then
    its type) the same. A dropped one says nothing (neither its name nor its type are kept),
    and a type alone says little (a renamed column, or another one of that type)."""
    if attribute is None or attribute.dropped or attribute.name != column[0]:
        return 0
    return 2 + int((attribute.type_oid, attribute.type_modifier) == column[1:])


#: A relation's attributes, and the partitioned table's attnum of each (by name now).
_ATTRIBUTES = """
SELECT a.attnum::int, a.attname::text, a.atttypid::int8, a.atttypmod, a.attisdropped,
       a.attgenerated <> '', r.attnum::int
FROM pg_catalog.pg_attribute a
LEFT JOIN pg_catalog.pg_attribute r
  ON r.attrelid = COALESCE(pg_catalog.pg_partition_root(a.attrelid), a.attrelid)
 AND r.attname = a.attname AND r.attnum > 0 AND NOT r.attisdropped AND NOT a.attisdropped
WHERE a.attrelid = %s AND a.attnum > 0
ORDER BY a.attnum
"""
#: The columns the publications publish of a relation (PostgreSQL 15+: column lists, and
#: generated columns on 18 when the publication says).
_PUBLISHED = """
SELECT DISTINCT unnest(pt.attnames)
FROM pg_catalog.pg_publication_tables pt
JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY(%s) AND c.oid = %s
"""


class ColumnIdentities:
    """Resolves the Relation messages a stream sends, in the order they come, against
    `catalog` (anything with ``query(sql, params)``, e.g. `pgcdc.decoding.catalog.Catalog`):
    called with one, gives the partitioned table's attnums (a table's own) of its columns."""

    def __init__(self, catalog: object, publications: Sequence[str] = ()) -> None:
        self.catalog = catalog
        self.publications = list(publications)
        #: Per relation OID: its last message resolved, (own attnum, column) each.
        self._last: dict[int, list[tuple[int, MessageColumn]]] = {}

    def seed(self, relid: int, columns: Sequence[tuple[int, MessageColumn]]) -> None:
        """What a relation's columns were as of the last change applied (a target's record):
        the previous version of the first message of a new session."""
        if columns and all(attnum for attnum, _ in columns):
            self._last.setdefault(relid, list(columns))

    def __call__(self, relation: Relation) -> tuple[int, ...]:
        query = self.catalog.query  # type: ignore[attr-defined]
        rows = query(_ATTRIBUTES, (relation.relid,))
        published: set[str] | None = None
        if self.publications and int(query("SHOW server_version_num")[0][0]) >= 150000:
            names = query(_PUBLISHED, (self.publications, relation.relid))
            published = {name for (name,) in names} or None
        catalog = [
            Attribute(
                attnum,
                name,
                int(type_oid),
                int(type_modifier),
                dropped,
                not dropped and (name in published if published is not None else not generated),
                root or 0,
            )
            for attnum, name, type_oid, type_modifier, dropped, generated, root in rows
        ]
        message = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        own = resolve_attnums(message, catalog, self._last.get(relation.relid))
        if 0 in own:
            log.warning(
                "%s.%s: the catalog no longer says what column(s) %s are (dropped or renamed "
                "since); they are matched by name",
                relation.namespace,
                relation.relname,
                ", ".join(c[0] for c, a in zip(message, own, strict=True) if not a),
            )
        self._last[relation.relid] = list(zip(own, message, strict=True))
        root = {a.attnum: a.root_attnum for a in catalog}
        return tuple(root.get(n, 0) or n for n in own)
