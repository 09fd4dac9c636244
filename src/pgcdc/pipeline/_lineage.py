"""The pipeline's record of its slot (``<state>/slot.json``): which system and timeline it
streams from and the furthest position it ever let the slot move to, written (durably) before
the slot is told. `pgcdc.pipeline._startup.judge_slot` compares a slot with it: a slot of the
same name confirmed past the record was created anew or moved by someone else."""

from __future__ import annotations

import json
import threading

from pgcdc.errors import PgcdcError
from pgcdc.pipeline._startup import SlotRecord
from pgcdc.protocol import Lsn
from pgcdc.storage import FileIO

__all__ = ["SlotLineage"]


class SlotLineage:
    """Reads and writes ``slot.json`` in the pipeline's state (thread-safe: the replication
    thread advances it)."""

    NAME = "slot.json"

    def __init__(self, state: FileIO) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._record: SlotRecord | None = None
        self._loaded = False

    def load(self) -> SlotRecord | None:
        with self._lock:
            return self._load()

    def _load(self) -> SlotRecord | None:
        if not self._loaded:
            self._loaded = True
            text = self.state.read(self.NAME)
            if text is not None:
                try:
                    data = json.loads(text)
                    self._record = SlotRecord(
                        str(data["slot"]),
                        data.get("system"),
                        data.get("timeline"),
                        Lsn.parse(data["confirmed"]),
                    )
                except (ValueError, KeyError, TypeError) as exc:
                    where = self.state.location(self.NAME)
                    raise PgcdcError(f"{where}: unreadable slot record ({exc})") from None
        return self._record

    def created(self, slot: str, system: str | None, timeline: int | None, point: Lsn) -> None:
        """The pipeline created `slot`, consistent at `point`."""
        with self._lock:
            self._load()
            self._save(SlotRecord(slot, system, timeline, Lsn(point)))

    def streaming(
        self, slot: str, system: str | None, timeline: int | None, found: Lsn | None = None
    ) -> None:
        """A session streams from `slot` on `system`, `timeline` (after a failover to a
        standby whose copy of the slot was synchronized: another timeline); `found`: where
        the slot is confirmed now, the record's position when there is none for `slot` yet
        (a slot the pipeline did not create is taken as it is: a crash before the first
        status update must not make it look moved by someone else)."""
        with self._lock:
            record = self._load()
            if record is None or record.slot != slot:
                confirmed = found or Lsn(0)
            else:
                confirmed = record.confirmed
            new = SlotRecord(slot, system, timeline, confirmed)
            if new != record:
                self._save(new)

    def advance(self, slot: str, lsn: Lsn) -> None:
        """The slot is about to be confirmed up to `lsn`: recorded first (durably)."""
        with self._lock:
            record = self._load()
            if record is not None and record.slot == slot and lsn <= record.confirmed:
                return
            system, timeline = (None, None) if record is None else (record.system, record.timeline)
            self._save(SlotRecord(slot, system, timeline, Lsn(lsn)))

    def _save(self, record: SlotRecord) -> None:
        data = {
            "slot": record.slot,
            "system": record.system,
            "timeline": record.timeline,
            "confirmed": str(record.confirmed),
        }
        self.state.write(self.NAME, json.dumps(data).encode())  # durable before the slot moves
        self._record = record
