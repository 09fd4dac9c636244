"""When a target's maintenance passes are due: every N versions of its table, counted from
the last multiple of N this process saw (so that a pass that comes later still comes); a
vacuum also some seconds after the last one of this process."""

from __future__ import annotations

import time

__all__ = ["PassSchedule"]


class PassSchedule:
    """The passes of one target, by kind ("compact", "vacuum", ...)."""

    def __init__(self, vacuum_seconds: float) -> None:
        self.vacuum_seconds = vacuum_seconds
        self._next_vacuum = time.monotonic() + vacuum_seconds
        #: Per kind, the version of its last pass (or the one it counts from).
        self._passes: dict[str, int] = {}

    def passed(self, kind: str, version: int, every: int) -> bool:
        """Whether `every` versions have passed since the last pass of `kind`; counted, the
        first time asked, from the multiple of `every` before."""
        if not version:
            return False
        last = self._passes.setdefault(kind, (version - 1) // every * every)
        return version - last >= every

    def due(self, kind: str, version: int, every: int) -> bool:
        """`passed`, and then the pass counted as made now."""
        if not self.passed(kind, version, every):
            return False
        self._passes[kind] = version
        return True

    def vacuum_may_be_due(self, version: int, every: int) -> bool:
        """Whether a vacuum may be due (nothing counted)."""
        return time.monotonic() >= self._next_vacuum or self.passed("vacuum", version, every)

    def vacuum_due(self, version: int, every: int) -> bool:
        """Whether a vacuum is due, `every` versions or `vacuum_seconds` after the last
        (counted as made now)."""
        now = time.monotonic()
        if not (self.due("vacuum", version, every) or now >= self._next_vacuum):
            return False
        self._next_vacuum = now + self.vacuum_seconds
        return True
