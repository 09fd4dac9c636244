"""How a pipeline starts: one decision over what it finds, and the one table that says it.

At start the pipeline looks at four things: its replication slot, the state of its initial
copy, whether its targets hold data (watermarks), and its configuration (may it create a slot,
copy tables, recover a lost slot). `decide` maps them to one `Start` action; `_RULES` is the
table, read top to bottom, first match wins:

==========================  ============  ==========  ===========================  =============
slot                        copy          targets     configuration                action
==========================  ============  ==========  ===========================  =============
any                         cut off       any         any                          COPY_AGAIN
lost, gone or not its own   any           hold data   recover_lost_slot            RESYNC
lost, gone or not its own   any           hold data   otherwise                    REFUSE
its own, but behind the     any           hold data   recover_lost_slot            RESYNC
targets (a failover)
its own, but behind         any           hold data   otherwise                    REFUSE
gone                        any           empty       create_slot and snapshot     COPY
gone                        any           empty       create_slot                  CREATE_SLOT
gone                        any           empty       otherwise                    REFUSE
lost (invalidated)          any           empty       create_slot (or recover)     RECREATE
lost (invalidated)          any           empty       otherwise                    REFUSE
its own, or not its own     any           empty       any                          STREAM
its own                     any           hold data   any                          STREAM
==========================  ============  ==========  ===========================  =============

"Not its own" (`SlotCondition.FOREIGN`, `judge_slot`): a slot of the configured name that is
not the one the targets were fed from — created anew (by ``pgcdc slot create``, by hand, on
a promoted standby) or moved by someone else: its confirmed position is past what this
pipeline ever let it move to, or it is on another system, or on a new timeline without having
been synchronized from the old primary. Streaming from it would silently lose the changes in
between, so it is treated as a lost slot. "Behind the targets": the server's WAL ends before
the targets' watermark, so they hold transactions this server does not have (a failover to a
standby that had not received them). Once the action is known, `tables_to_copy` says which
tables the stream waits for.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pgcdc.protocol import Lsn

__all__ = [
    "CopyCondition",
    "Decision",
    "SlotCondition",
    "SlotRecord",
    "Start",
    "StartFacts",
    "decide",
    "judge_slot",
    "tables_to_copy",
]


class SlotCondition(enum.Enum):
    OK = "its own"
    MISSING = "gone"
    INVALIDATED = "lost"
    FOREIGN = "not its own"


class CopyCondition(enum.Enum):
    NONE = "never started"
    CUT_OFF = "cut off"  # creating the slot, or copying, when the last run ended
    DONE = "done"


class Start(enum.Enum):
    STREAM = "stream from the slot"
    COPY = "create the slot with a snapshot and copy every table"
    COPY_AGAIN = "drop the slot and copy every table again"
    CREATE_SLOT = "create the slot and stream from it (no copy)"
    RECREATE = "drop the invalidated slot and start as a new pipeline"
    RESYNC = "replace the slot, copy every table and reconcile the targets with it"
    REFUSE = "refuse to start"


@dataclass(frozen=True, slots=True)
class StartFacts:
    slot: SlotCondition
    copy: CopyCondition
    #: Whether any target holds a watermark (changes applied from the slot).
    targets_hold_data: bool
    #: The server's WAL ends before the targets' watermark.
    behind_targets: bool
    create_slot: bool
    snapshot: bool
    recover: bool


@dataclass(frozen=True, slots=True)
class Decision:
    action: Start
    #: For REFUSE: which rule refused (a key of `REFUSALS`).
    refusal: str | None = None


Rule = tuple[Callable[[StartFacts], bool], Decision]
_LOST = (SlotCondition.MISSING, SlotCondition.INVALIDATED, SlotCondition.FOREIGN)

_RULES: list[Rule] = [
    (lambda f: f.copy is CopyCondition.CUT_OFF, Decision(Start.COPY_AGAIN)),
    (lambda f: f.slot in _LOST and f.targets_hold_data and f.recover, Decision(Start.RESYNC)),
    (lambda f: f.slot in _LOST and f.targets_hold_data, Decision(Start.REFUSE, "lost")),
    (lambda f: f.behind_targets and f.targets_hold_data and f.recover, Decision(Start.RESYNC)),
    (lambda f: f.behind_targets and f.targets_hold_data, Decision(Start.REFUSE, "behind")),
    (
        lambda f: f.slot is SlotCondition.MISSING and f.create_slot and f.snapshot,
        Decision(Start.COPY),
    ),
    (lambda f: f.slot is SlotCondition.MISSING and f.create_slot, Decision(Start.CREATE_SLOT)),
    (lambda f: f.slot is SlotCondition.MISSING, Decision(Start.REFUSE, "missing")),
    (
        lambda f: f.slot is SlotCondition.INVALIDATED and (f.create_slot or f.recover),
        Decision(Start.RECREATE),
    ),
    (lambda f: f.slot is SlotCondition.INVALIDATED, Decision(Start.REFUSE, "invalidated")),
    (lambda f: True, Decision(Start.STREAM)),
]

#: Why a start was refused, and what to do: formatted with the slot's name (``slot``), what
#: happened to it (``what``), the targets' watermark (``applied``), the server's WAL position
#: (``server``) and the pipeline's state directory (``state``).
REFUSALS = {
    "lost": (
        'replication slot "{slot}" {what}, but the targets hold changes up to commit LSN '
        "{applied}: the changes since then cannot be streamed again; set "
        "recover_lost_slot = true in [source] to copy the tables under a new slot and "
        "reconcile the targets with them (or move the targets and the pipeline's state "
        "({state}) away to copy everything anew)"
    ),
    "behind": (
        "the server's WAL ends at {server}, before the targets' watermark {applied}: they "
        "hold transactions this server does not have (a failover to a standby that had not "
        "received them?); set recover_lost_slot = true in [source] to reconcile the targets "
        "with this server's tables"
    ),
    "missing": (
        "replication slot '{slot}' does not exist (create it with `pgcdc slot create`, or "
        "set create_slot = true in [source])"
    ),
    "invalidated": (
        'replication slot "{slot}" {what}; set create_slot = true in [source] to replace it '
        "(nothing has been applied from it yet)"
    ),
}


def decide(facts: StartFacts) -> Decision:
    """The action for `facts` (the first rule of `_RULES` that matches)."""
    return next(decision for matches, decision in _RULES if matches(facts))


def tables_to_copy(
    action: Start, copy: CopyCondition, marked: Mapping[str, bool], snapshot: bool
) -> set[str]:
    """The tables to copy while the stream goes on, once `action` is done: those whose
    targets hold no watermark (added since, or whose copy failed) — none when the pipeline
    copies nothing, or runs for the first time on a slot it did not create (the slot holds
    every change from its creation on)."""
    if not snapshot or action in (Start.REFUSE, Start.CREATE_SLOT):
        return set()
    if copy is CopyCondition.NONE and not any(marked.values()) and action is Start.STREAM:
        return set()
    return {table for table, ready in marked.items() if not ready}


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """What the pipeline knows of the slot its targets are fed from (``slot.json``): the
    system and timeline it streamed from, and the furthest position it ever let the slot
    move to (recorded before the slot is told)."""

    slot: str
    system: str | None
    timeline: int | None
    confirmed: Lsn


def judge_slot(
    record: SlotRecord | None,
    exists: bool,
    invalidated: bool,
    confirmed_flush: Lsn | None,
    synced: bool | None,
    system: str | None,
    timeline: int | None,
) -> tuple[SlotCondition, str]:
    """The slot's condition, and what happened to it (for a message)."""
    if not exists:
        return SlotCondition.MISSING, "is gone"
    if invalidated:
        return SlotCondition.INVALIDATED, "was invalidated"
    if record is None:
        return SlotCondition.OK, ""
    if record.system is not None and system is not None and system != record.system:
        return SlotCondition.FOREIGN, (
            f"is on another system ({system}, the targets were fed from {record.system})"
        )
    if confirmed_flush is not None and confirmed_flush > record.confirmed:
        return SlotCondition.FOREIGN, (
            f"is not the one the targets were fed from (it is confirmed up to "
            f"{confirmed_flush}, past {record.confirmed}, the furthest this pipeline let "
            "it go: created anew, or moved by someone else)"
        )
    new_timeline = record.timeline is not None and timeline not in (None, record.timeline)
    if new_timeline and synced is False:
        return SlotCondition.FOREIGN, (
            f"was created on timeline {timeline} after a failover (the targets were fed "
            f"on timeline {record.timeline}) and not synchronized from the old primary"
        )
    return SlotCondition.OK, ""
