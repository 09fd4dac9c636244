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
and types agree most with the catalog's and the previous version's, and with the order of the
transactions (below; then the one with the fewest columns dropped and the earliest added:
the message came before the later DDL). A relation seen for the first time with a catalog
already past it is matched by name (the only guess there is; 0 where even that fails).

Names and types alone can mislead (``DROP c; ADD c`` of the same type, a message of the
backlog: before the DDL, or after it? ``DROP c; ADD c`` of another type: the new column has
the message's name, the old one, dropped, none), the transactions tell. A column's
``pg_attribute`` row carries the xid of the transaction that last wrote it (``xmin``: the one
that added the column, or dropped it), and a message comes in a transaction whose xid the
stream gives: a reading counts one point for each column it places on the side of the
message its transaction says (added before it, or dropped before it; a column dropped now is
in the message when its drop came after), one against each it places on the other side,
weighed with the names' agreement. DDL holds an ACCESS EXCLUSIVE lock on the table until it
commits, so a transaction that changed the table's rows either committed before the DDL took
the lock or wrote them after it committed: the message is read as after the DDL when its
transaction is the DDL's own or a later one (an xid that follows the DDL's was taken while
the DDL held the table), and as before it otherwise.
(A transaction that took its xid before the DDL, by writing another table, and wrote this one
only after the DDL committed, is read as before it: the rare case the rule gets wrong.)

Each Relation message is resolved when it arrives (the spool asks), so that a message the
server sends again after DDL with the very same names and types (``DROP c; ADD c`` of the
same type) still tells the new column.

A new process starts from what its targets recorded: the relation's columns as of the last
change they applied, at the lowest of their watermarks (`ColumnIdentities.seed`). The slot
sends again what came after its confirmed position, which may lie far before that point (a
standby's copy of a failover slot, a crash before the slot was confirmed): the messages of
those transactions are older than the seed, so they are not read forward from it (that would
take DDL since for DDL before), nor do they become the previous version of the next message;
every target skips their changes, and they are read against the catalog alone. The first
message of a transaction after the seed's point is read forward from the seed. The Spark
source, which knows no columns, knows the point (its checkpoint's offset: `hold`): the same
rule holds, and the first message after it is read against the catalog.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pgcdc.decoding.catalog import wait_until_visible
from pgcdc.protocol import Relation

__all__ = ["Attribute", "ColumnIdentities", "resolve_attnums", "seed_point"]

T = TypeVar("T")

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
    #: The xid of the transaction that last wrote its ``pg_attribute`` row (0: not known).
    xmin: int = 0


#: A message's column: (name, type OID, type modifier).
MessageColumn = tuple[str, int, int]


def resolve_attnums(
    message: Sequence[MessageColumn],
    catalog: Sequence[Attribute],
    previous: Sequence[tuple[int, MessageColumn]] | None = None,
    xid: int | None = None,
) -> tuple[int, ...]:
    """The attnums of the message's columns (0 where none can be told); `previous`: the
    relation's previous version, (attnum, column) each; `xid`: the transaction the message
    came in."""
    if previous and all(n for n, _ in previous):
        found = _forward(message, catalog, previous, xid)
        if found is not None:
            return found
    live = [a for a in catalog if not a.dropped and a.sent]
    if [(a.name, a.type_oid, a.type_modifier) for a in live] == list(message):
        return tuple(a.attnum for a in live)
    by_name = {a.name: a.attnum for a in catalog if not a.dropped}
    return tuple(by_name.get(name, 0) for name, _, _ in message)


def _forward(
    message: Sequence[MessageColumn],
    catalog: Sequence[Attribute],
    previous: Sequence[tuple[int, MessageColumn]],
    xid: int | None = None,
) -> tuple[int, ...] | None:
    """The previous version's columns without some dropped since, then some added since:
    the reading that agrees most with the catalog's names and types and with the order of
    the transactions (see the module docstring; None: no reading fits)."""
    attribute = {a.attnum: a for a in catalog}
    was = dict(previous)
    before = [n for n, _ in previous]
    highest = max(before)
    gone = [n for n in before if not _sent(attribute.get(n))]
    newer = [a.attnum for a in catalog if a.attnum > highest and (a.dropped or a.sent)]
    best: tuple[int, int, int, int, tuple[int, ...]] | None = None
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
                    return best[4] if best else None
                reading = (*kept, *added)
                score = sum(
                    _agreement(attribute.get(n), c) + _continuity(was.get(n), c)
                    for n, c in zip(reading, message, strict=True)
                )
                # a newer column's xmin is its ADD (its last change), or its DROP when it
                # is dropped now: a dropped one is in the message when its drop came after
                order = sum(_in_order(_xmin(attribute, n), xid, n in dropped) for n in gone) + sum(
                    _in_order(_xmin(attribute, n), xid, (n in added) != _dropped(attribute, n))
                    for n in newer
                )
                rank = (score + order, order, -dropped_count, -sum(added), reading)
                if best is None or rank[:4] > best[:4]:
                    best = rank
    return None if best is None else best[4]


def _dropped(attributes: dict[int, Attribute], attnum: int) -> bool:
    found = attributes.get(attnum)
    return found is not None and found.dropped


def _xmin(attributes: dict[int, Attribute], attnum: int) -> int:
    found = attributes.get(attnum)
    return 0 if found is None else found.xmin


def _in_order(writer: int, xid: int | None, happened: bool) -> int:
    """+1 when a reading has the DDL of transaction `writer` (a column added or dropped)
    `happened` before the message of transaction `xid` exactly when the transactions' order
    says so, -1 when it has it the other way; 0 when either xid is not known."""
    if not writer or xid is None:
        return 0
    return 1 if happened == _precedes_or_is(writer, xid) else -1


def _precedes_or_is(a: int, b: int) -> bool:
    """Whether xid `a` was assigned before xid `b` or is it: 32-bit xids compared as the
    server does (modulo 2**32; the special ones, below 3, precede every normal one)."""
    if a < 3 or b < 3:
        return a <= b
    return ((a - b) & 0xFFFFFFFF) == 0 or ((a - b) & 0xFFFFFFFF) >= 0x80000000


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
       a.attgenerated <> '', r.attnum::int, a.xmin::text::int8
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


def seed_point(held: Sequence[tuple[int | None, T | None]]) -> tuple[T | None, int | None]:
    """From what each consumer of a relation's changes holds (its watermark, the columns it
    recorded as of it; None: not known), the `ColumnIdentities.seed`: the point every one
    holds (None when one holds nothing known) and the columns recorded as of that very
    point (None when the consumer that holds the least recorded none: columns recorded
    later would read older messages forward from DDL that came after them)."""
    marks = [w for w, _ in held if w is not None]
    at = min(marks) if held and len(marks) == len(held) else None
    known = sorted(((w or 0, r) for w, r in held if r is not None), key=lambda k: k[0])
    if known and (at is None or known[0][0] == at):
        return known[0][1], at
    return None, at


class ColumnIdentities:
    """Resolves the Relation messages a stream sends, in the order they come, against
    `catalog` (anything with ``query(sql, params)``, e.g. `pgcdc.decoding.catalog.Catalog`):
    called with one, gives the partitioned table's attnums (a table's own) of its columns."""

    def __init__(self, catalog: object, publications: Sequence[str] = ()) -> None:
        self.catalog = catalog
        self.publications = list(publications)
        #: Per relation OID: its last message resolved, (own attnum, column) each.
        self._last: dict[int, list[tuple[int, MessageColumn]]] = {}
        #: Per relation OID: the commit position its seed holds, while no message of a
        #: later transaction has come.
        self._seeded_at: dict[int, int] = {}
        #: The commit position the consumer holds for every relation (`hold`), and the
        #: relations a message of a later transaction has come for since.
        self._held_at: int | None = None
        self._past_hold: set[int] = set()

    def seed(
        self, relid: int, columns: Sequence[tuple[int, MessageColumn]], at: int | None = None
    ) -> None:
        """What a relation's columns were as of the last change applied (a target's record;
        empty: not recorded) and, when known, the commit position `at` that every consumer
        of its changes holds: the previous version of the first message of a transaction
        after `at` (of the first message of a new session when `at` is not known)."""
        if columns and all(attnum for attnum, _ in columns):
            self._last.setdefault(relid, list(columns))
        if at is not None:
            self._seeded_at.setdefault(relid, at)

    def hold(self, at: int) -> None:
        """The consumer holds every transaction up to commit position `at` (a Spark
        checkpoint's offset) and knows nothing of the columns: the slot may send older
        transactions again, whose messages may come before DDL the consumer has seen. Their
        messages are read against the catalog alone and are not the previous version of a
        later one; a relation's first message after `at` is read from the catalog (by name
        where the catalog is past it), unless a seed says more."""
        self._held_at = at

    def _point(self, relid: int) -> int | None:
        """The commit position a relation's messages are older than while they come in
        transactions at or before it (a seed's, else the consumer's `hold`)."""
        seeded_at = self._seeded_at.get(relid)
        if seeded_at is None and relid not in self._past_hold:
            return self._held_at
        return seeded_at

    def rereads(self, relid: int, commit_lsn: int | None) -> bool:
        """Whether the relation's last message, in force for a transaction at `commit_lsn`,
        must be resolved again: it was read against the catalog alone (older than the seed
        or the hold) and this transaction is the first after that point."""
        point = self._point(relid)
        return point is not None and (commit_lsn is None or commit_lsn > point)

    def __call__(
        self, relation: Relation, xid: int | None = None, commit_lsn: int | None = None
    ) -> tuple[int, ...]:
        """The attnums of the message's columns (the partitioned table's, a table's own);
        `xid` and `commit_lsn`: the transaction it came in, when known."""
        query = self.catalog.query  # type: ignore[attr-defined]
        if xid:  # (its commit came; the catalog may not show it yet)
            wait_until_visible(query, xid)
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
                int(xmin),
            )
            for attnum, name, type_oid, type_modifier, dropped, generated, root, xmin in rows
        ]
        message = [(c.name, c.type_oid, c.type_modifier) for c in relation.columns]
        root = {a.attnum: a.root_attnum for a in catalog}
        point = self._point(relation.relid)
        if point is not None and commit_lsn is not None and commit_lsn <= point:
            # a transaction every target holds (its changes are skipped): older than the
            # seed, it is read against the catalog alone and leaves the seed in place
            own = resolve_attnums(message, catalog, xid=xid)
            return tuple(root.get(n, 0) or n for n in own)
        self._seeded_at.pop(relation.relid, None)
        self._past_hold.add(relation.relid)
        own = resolve_attnums(message, catalog, self._last.get(relation.relid), xid)
        if 0 in own:
            log.warning(
                "%s.%s: the catalog no longer says what column(s) %s are (dropped or renamed "
                "since); they are matched by name",
                relation.namespace,
                relation.relname,
                ", ".join(c[0] for c, a in zip(message, own, strict=True) if not a),
            )
        self._last[relation.relid] = list(zip(own, message, strict=True))
        return tuple(root.get(n, 0) or n for n in own)
