"""The pipeline's record of its slot (`SlotLineage`) against the slot it finds at start
(`judge_slot`): a slot the pipeline adopted, created anew or moved by someone else."""

from __future__ import annotations

from pathlib import Path

from pgcdc.pipeline._lineage import SlotLineage
from pgcdc.pipeline._startup import SlotCondition, judge_slot
from pgcdc.protocol import Lsn
from pgcdc.storage import LocalFileIO

SYSTEM = "7300000000000000001"


def judged(lineage: SlotLineage, confirmed: int) -> SlotCondition:
    condition, _ = judge_slot(
        lineage.load(),
        exists=True,
        invalidated=False,
        confirmed_flush=Lsn(confirmed),
        synced=None,
        system=SYSTEM,
        timeline=1,
    )
    return condition


def test_an_adopted_slot_is_recorded_as_found(tmp_path: Path) -> None:
    """A slot the pipeline did not create (the user's, confirmed at 0x5000) streams; the
    process dies before its first status update: the next start takes the same slot as the
    one the targets were fed from (the record holds the position it was found at)."""
    lineage = SlotLineage(LocalFileIO(str(tmp_path)))
    lineage.streaming("s", SYSTEM, 1, Lsn(0x5000))
    again = SlotLineage(LocalFileIO(str(tmp_path)))  # the next process
    assert judged(again, 0x5000) is SlotCondition.OK
    # moved past the record by someone else (or created anew): refused
    assert judged(again, 0x6000) is SlotCondition.FOREIGN
    # the pipeline's own advance is recorded first; a record of the slot is kept as it is
    again.advance("s", Lsn(0x6000))
    again.streaming("s", SYSTEM, 1, Lsn(0x9000))
    assert judged(SlotLineage(LocalFileIO(str(tmp_path))), 0x6000) is SlotCondition.OK
    assert judged(SlotLineage(LocalFileIO(str(tmp_path))), 0x9000) is SlotCondition.FOREIGN
