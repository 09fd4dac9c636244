"""Tables set aside after a change their targets could not take (``on_error = "quarantine"``).

A quarantined table's changes keep going to a change log in the pipeline's state (the same
pending log a table waiting for its copy has), so the slot moves on and nothing is lost; its
targets stay as they were. ``pgcdc recopy`` asks for a new copy of the table: the targets are
removed, the next run copies the table while the others stream, then applies the logged
changes after the copy's point and lifts the quarantine.

A table whose rows changed without a change the stream carries (it left its publication and
came back, partitions were attached or detached) is resynchronized while the others stream:
its status is ``resync`` until its targets were reconciled with a new copy.

The records live in ``<state>/quarantine.json``: per table its status (``quarantined``,
``recopy`` or ``resync``), the reason and the commit LSN of the batch that failed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from pgcdc.errors import PgcdcError
from pgcdc.storage import FileIO

__all__ = ["Quarantine", "QuarantineRecord"]

Status = Literal["quarantined", "recopy", "resync"]


@dataclass(frozen=True, slots=True)
class QuarantineRecord:
    status: Status
    reason: str
    #: The first commit LSN of the batch the table could not take ("X/Y").
    since: str


class Quarantine:
    """The quarantine records of one pipeline (``quarantine.json`` in its `state`), read
    once and then kept: a pipeline's state has one writer (a running pipeline, or `pgcdc
    recopy` while it is stopped), and the running view asks for them twice a second."""

    NAME = "quarantine.json"

    def __init__(self, state: FileIO) -> None:
        self.state = state
        self._records: dict[str, QuarantineRecord] | None = None

    def records(self) -> dict[str, QuarantineRecord]:
        if self._records is None:
            self._records = self._load()
        return dict(self._records)

    def _load(self) -> dict[str, QuarantineRecord]:
        text = self.state.read(self.NAME)
        if text is None:
            return {}
        try:
            data = json.loads(text)
            return {table: QuarantineRecord(**record) for table, record in data.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            where = self.state.location(self.NAME)
            raise PgcdcError(f"{where}: unreadable quarantine records ({exc})") from None

    def _save(self, records: dict[str, QuarantineRecord]) -> None:
        data = json.dumps({t: asdict(r) for t, r in records.items()}, indent=1)
        self.state.write(self.NAME, data.encode())
        self._records = dict(records)

    def add(self, table: str, reason: str, since: str) -> None:
        records = self.records()
        records[table] = QuarantineRecord("quarantined", reason, since)
        self._save(records)

    def request_recopy(self, table: str) -> QuarantineRecord | None:
        """Mark `table` for a new copy; its previous record (None: it was not quarantined)."""
        records = self.records()
        previous = records.get(table)
        reason, since = (previous.reason, previous.since) if previous else ("recopy asked", "")
        records[table] = QuarantineRecord("recopy", reason, since)
        self._save(records)
        return previous

    def request_resync(self, table: str, reason: str) -> None:
        """Mark `table` for a resynchronization (unless it waits for a copy already)."""
        records = self.records()
        if table not in records:
            records[table] = QuarantineRecord("resync", reason, "")
            self._save(records)

    def lift(self, table: str) -> None:
        records = self.records()
        if records.pop(table, None) is not None:
            self._save(records)
