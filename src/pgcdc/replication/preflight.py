"""Is the source ready for logical replication? Asked before anything starts (Spark, a slot).

A server that is not set up for logical decoding otherwise fails late, in the server's words,
after the pipeline has started Spark: `check_source` reads what decides it in one query and
says what is wrong, each problem in one line with its fix:

* ``wal_level`` is not ``logical`` (``ALTER SYSTEM SET wal_level = logical``, then a restart);
* the role has neither the REPLICATION attribute nor superuser;
* no replication slot is free for a slot that must be created (``max_replication_slots``,
  counting the slots that exist), or no WAL sender (``max_wal_senders``, counting the WAL
  senders running; a role that may not see other sessions counts only its own);
* a publication does not exist.

`resume_line` is what a pipeline says at its start: the slot, its confirmed position, and
each table's watermark (or that its copy is pending).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgcdc.errors import (
    PermissionDenied,
    PublicationNotFound,
    ReplicationError,
    ServerConfigurationError,
)
from pgcdc.protocol import Lsn
from pgcdc.replication.slots import connect_sql

__all__ = ["SourceState", "check_source", "read_source", "resume_line", "source_problems"]

_STATE = """
SELECT current_setting('wal_level'),
       current_user, current_database(),
       r.rolsuper, r.rolreplication,
       -- managed services grant logical replication through a role of their own
       COALESCE((SELECT pg_has_role(current_user, oid, 'member') FROM pg_roles
                 WHERE rolname = 'rds_replication'), false),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots),
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'),
       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %(slot)s),
       ARRAY(SELECT name FROM unnest(%(publications)s::text[]) AS name
             WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = name))
FROM pg_roles r WHERE r.rolname = current_user
"""


@dataclass(frozen=True, slots=True)
class SourceState:
    """What decides whether a pipeline can stream from a server."""

    wal_level: str
    role: str
    database: str
    superuser: bool
    replication: bool
    #: Member of a managed service's replication role (``rds_replication``).
    replication_role: bool
    max_replication_slots: int
    slots: int
    max_wal_senders: int
    #: WAL senders running that this role can see.
    wal_senders: int
    slot_exists: bool
    missing_publications: tuple[str, ...]


def read_source(conninfo: str, slot: str, publications: Sequence[str]) -> SourceState:
    with connect_sql(conninfo) as conn:
        row = conn.execute(_STATE, {"slot": slot, "publications": list(publications)}).fetchone()
    assert row is not None, "the current role is always in pg_roles"
    (wal_level, role, database, superuser, replication, replication_role) = row[:6]
    (max_slots, slots, max_senders, senders, slot_exists, missing) = row[6:]
    return SourceState(
        wal_level,
        role,
        database,
        superuser,
        replication,
        replication_role,
        max_slots,
        slots,
        max_senders,
        senders,
        slot_exists,
        tuple(missing),
    )


#: The error class of each kind of problem (the first problem's decides the error's).
_PROBLEM_CLASSES: dict[str, type[ReplicationError]] = {
    "wal_level": ServerConfigurationError,
    "privilege": PermissionDenied,
    "slots": ServerConfigurationError,
    "senders": ServerConfigurationError,
    "publication": PublicationNotFound,
}


def source_problems(state: SourceState, slot: str, *, create_slot: bool) -> list[tuple[str, str]]:
    """(kind, line) per problem: what is wrong and how to fix it."""
    problems: list[tuple[str, str]] = []
    if state.wal_level != "logical":
        problems.append(
            (
                "wal_level",
                f"the server has wal_level = {state.wal_level}; logical decoding needs logical: "
                "run ALTER SYSTEM SET wal_level = logical (as a superuser) and restart the server",
            )
        )
    if not (state.superuser or state.replication or state.replication_role):
        problems.append(
            (
                "privilege",
                f"role {state.role} may not use replication: ALTER ROLE {state.role} REPLICATION "
                "(as a superuser), or connect as a role that has it",
            )
        )
    if not state.slot_exists and create_slot and state.slots >= state.max_replication_slots:
        problems.append(
            (
                "slots",
                f"no replication slot is free for slot {slot}: {state.slots} of "
                f"max_replication_slots = {state.max_replication_slots} exist; drop one that is "
                "not needed (pgcdc slot list, pgcdc slot drop NAME) or raise "
                "max_replication_slots (ALTER SYSTEM SET, then restart the server)",
            )
        )
    if state.wal_senders >= state.max_wal_senders:
        problems.append(
            (
                "senders",
                f"no WAL sender is free: {state.wal_senders} of max_wal_senders = "
                f"{state.max_wal_senders} are running; stop a replication client that is not "
                "needed, or raise max_wal_senders (ALTER SYSTEM SET, then restart the server)",
            )
        )
    for name in state.missing_publications:
        problems.append(
            (
                "publication",
                f'publication "{name}" does not exist in database {state.database}: create it, '
                f"e.g. pgcdc publication create {name} -d ... -t SCHEMA.TABLE",
            )
        )
    return problems


def check_source(
    conninfo: str, slot: str, publications: Sequence[str], *, create_slot: bool
) -> SourceState:
    """The source's state; raises one error naming every problem (with its fix) if it is not
    ready for a consumer of `slot` (created if `create_slot`) on `publications`."""
    state = read_source(conninfo, slot, publications)
    problems = source_problems(state, slot, create_slot=create_slot)
    if problems:
        error = _PROBLEM_CLASSES[problems[0][0]]
        raise error("; ".join(line for _, line in problems))
    return state


def resume_line(
    slot: str,
    confirmed: Lsn | None,
    watermarks: Mapping[str, Lsn | None],
    *,
    unapplied: str = "copy pending",
) -> str:
    """Where a pipeline starts: ``resuming slot S at X/Y (confirmed); public.a at X/Y, ...``;
    `confirmed` None: the slot is to be created; a table without a watermark: `unapplied`."""
    if confirmed is None:
        head = f"starting: creating slot {slot}"
    else:
        head = f"resuming slot {slot} at {confirmed} (confirmed)"
    tables = ", ".join(
        f"{table} {unapplied if mark is None else f'at {mark}'}"
        for table, mark in sorted(watermarks.items())
    )
    return f"{head}; {tables}" if tables else head
