"""The start-up decision, tested over every combination of what a pipeline can find (as h11
tests its state machine): the promises hold in each one."""

from __future__ import annotations

import itertools

import pytest

from pgcdc.pipeline._startup import (
    REFUSALS,
    CopyCondition,
    SlotCondition,
    SlotRecord,
    Start,
    StartFacts,
    decide,
    judge_slot,
    tables_to_copy,
)
from pgcdc.protocol import Lsn

EVERY = [
    StartFacts(*values)
    for values in itertools.product(SlotCondition, CopyCondition, *[[False, True]] * 5)
]


@pytest.mark.parametrize("facts", EVERY, ids=str)
def test_every_combination_keeps_the_promises(facts: StartFacts) -> None:
    decision = decide(facts)
    action = decision.action
    # a copy that was cut off is always made again, from a new slot
    if facts.copy is CopyCondition.CUT_OFF:
        assert action is Start.COPY_AGAIN
        return
    # targets that hold data are never fed from a slot that is not the one they came from
    if facts.targets_hold_data and facts.slot is not SlotCondition.OK:
        assert action in (Start.RESYNC, Start.REFUSE)
    if facts.targets_hold_data and facts.behind_targets:
        assert action in (Start.RESYNC, Start.REFUSE)
    # a new slot (and a copy) only when nothing depends on the old one
    if action in (Start.COPY, Start.CREATE_SLOT, Start.RECREATE):
        assert not facts.targets_hold_data
    if action is Start.COPY:
        assert facts.snapshot and facts.create_slot
    if action is Start.RESYNC:
        assert facts.recover and facts.targets_hold_data
    if action is Start.STREAM:
        assert facts.slot in (SlotCondition.OK, SlotCondition.FOREIGN)
        assert facts.slot is SlotCondition.OK or not facts.targets_hold_data
    if action is Start.REFUSE:
        assert decision.refusal in REFUSALS
        # the advice to create a slot by hand is given only when nothing depends on it
        if "pgcdc slot create" in REFUSALS[decision.refusal]:
            assert not facts.targets_hold_data
    else:
        assert decision.refusal is None


def test_tables_to_copy() -> None:
    marked = {"a": True, "b": False}
    assert tables_to_copy(Start.STREAM, CopyCondition.DONE, marked, True) == {"b"}
    assert tables_to_copy(Start.STREAM, CopyCondition.DONE, marked, False) == set()
    # the first run on a slot someone else made: the slot has every change since
    none = {"a": False, "b": False}
    assert tables_to_copy(Start.STREAM, CopyCondition.NONE, none, True) == set()
    # every copy of the first run failed (the server restarted under it): copied again
    assert tables_to_copy(Start.STREAM, CopyCondition.DONE, none, True) == {"a", "b"}


RECORD = SlotRecord("s", "7300", 1, Lsn(0x5000))


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (dict(exists=False), SlotCondition.MISSING),
        (dict(invalidated=True), SlotCondition.INVALIDATED),
        (dict(), SlotCondition.OK),
        (dict(confirmed_flush=Lsn(0x4000)), SlotCondition.OK),  # behind: the server resends
        (dict(confirmed_flush=Lsn(0x6000)), SlotCondition.FOREIGN),  # `pgcdc slot create`
        (dict(system="9999"), SlotCondition.FOREIGN),
        (dict(timeline=2, synced=False), SlotCondition.FOREIGN),  # made after a failover
        (dict(timeline=2, synced=True), SlotCondition.OK),  # a failover slot, synchronized
        (dict(timeline=2, synced=None), SlotCondition.OK),  # before 17: by its position
    ],
)
def test_judge_slot(case: dict[str, object], expected: SlotCondition) -> None:
    facts: dict[str, object] = dict(
        exists=True,
        invalidated=False,
        confirmed_flush=Lsn(0x5000),
        synced=None,
        system="7300",
        timeline=1,
    )
    facts.update(case)
    condition, _ = judge_slot(RECORD, **facts)  # type: ignore[arg-type]
    assert condition is expected
    assert judge_slot(None, **facts)[0] in (  # type: ignore[arg-type]
        SlotCondition.OK,
        SlotCondition.MISSING,
        SlotCondition.INVALIDATED,
    )
