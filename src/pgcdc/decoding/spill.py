"""Bounded buffering of transactions that cannot be delivered yet, spilling to disk.

A streamed transaction (for a plugin without streaming callbacks) or a prepared one held
until COMMIT PREPARED is kept until its outcome is known. `SpillPool` accounts for the memory
of all such buffers together; past its budget it writes the largest buffer's entries to that
buffer's file, as the server's reorder buffer does. Reading back goes file first, then memory,
one batch at a time, so delivering a huge transaction needs about one batch of memory.

Spill files are private temporary files (``pgcdc-spill-<pid>-*`` directories); a directory
left behind by a process that died is removed by the next pool created in the same place.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pgcdc.errors import RecordError, SpillError
from pgcdc.records import read_records, write_record

__all__ = ["DEFAULT_MEMORY_LIMIT", "SpillBuffer", "SpillPool"]

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
#: Entries per pickled batch in a spill file: what reading back holds in memory at once.
BATCH_ENTRIES = 2000
_DIR_PREFIX = "pgcdc-spill-"


class SpillBuffer:
    """The entries of one pending transaction, in order: on disk first, then in memory.

    An entry is ``(size, tag, payload)``; `tag` is what `discard_tag` filters on (the
    subtransaction xid of a streamed change).
    """

    def __init__(self, pool: SpillPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self.memory: list[tuple[int, Any, Any]] = []
        self.memory_bytes = 0
        self.path: Path | None = None
        self.spilled_entries = 0
        self.discarded_tags: set[Any] = set()

    def __len__(self) -> int:
        return self.spilled_entries + len(self.memory)

    def append(self, size: int, tag: Any, payload: Any) -> None:
        self.memory.append((size, tag, payload))
        self.memory_bytes += size
        self.pool._grew(size)

    def discard_tag(self, tag: Any) -> None:
        """Forget every entry with `tag` (a subtransaction abort)."""
        kept = [entry for entry in self.memory if entry[1] != tag]
        kept_bytes = sum(entry[0] for entry in kept)
        self.pool._shrank(self.memory_bytes - kept_bytes)
        self.memory, self.memory_bytes = kept, kept_bytes
        if self.spilled_entries:
            self.discarded_tags.add(tag)

    def spill(self) -> None:
        """Move the in-memory entries to this buffer's file."""
        if not self.memory:
            return
        if self.path is None:
            self.path = self.pool._new_file(self.name)
        try:
            with open(self.path, "ab") as file:
                for start in range(0, len(self.memory), BATCH_ENTRIES):
                    chunk = self.memory[start : start + BATCH_ENTRIES]
                    batch = [(tag, payload) for _, tag, payload in chunk]
                    write_record(file, pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            raise SpillError(
                f"cannot spill transaction {self.name} to {self.path}: {exc}"
            ) from None
        self.pool.spilled_bytes += self.memory_bytes
        self.pool.spill_count += 1
        self.spilled_entries += len(self.memory)
        self.pool._shrank(self.memory_bytes)
        self.memory = []
        self.memory_bytes = 0

    def __iter__(self) -> Iterator[Any]:
        """Every payload in order (spilled ones read back batch by batch), minus discarded."""
        discarded = self.discarded_tags
        if self.path is not None:
            for batch in self._read_file():
                for tag, payload in batch:
                    if tag not in discarded:
                        yield payload
        for _, _tag, payload in self.memory:
            yield payload

    def _read_file(self) -> Iterator[list[tuple[Any, Any]]]:
        assert self.path is not None
        try:
            file = open(self.path, "rb")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:
            raise SpillError(f"cannot read spill file {self.path}: {exc}") from None
        with file:
            try:
                for record in read_records(file):
                    yield pickle.loads(record.payload)
            except RecordError as exc:
                raise SpillError(f"spill file {self.path} is damaged: {exc}") from None

    def close(self) -> None:
        """Forget the entries and remove the file."""
        self.pool._shrank(self.memory_bytes)
        self.memory = []
        self.memory_bytes = 0
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None
        self.pool._buffers.discard(self)


class SpillPool:
    """The memory budget shared by all pending transactions, and their spill directory."""

    def __init__(self, memory_limit: int = DEFAULT_MEMORY_LIMIT, directory: str | None = None):
        if memory_limit < 0:
            raise ValueError("memory_limit must be >= 0")
        self.memory_limit = memory_limit
        self.parent = Path(directory or tempfile.gettempdir())
        self.directory: Path | None = None
        self.memory_bytes = 0
        #: The most memory the buffers held at once (estimated), for tests and benchmarks.
        self.peak_memory_bytes = 0
        self.spilled_bytes = 0
        self.spill_count = 0
        self._buffers: set[SpillBuffer] = set()
        self._files = 0

    def buffer(self, name: str) -> SpillBuffer:
        buffer = SpillBuffer(self, name)
        self._buffers.add(buffer)
        return buffer

    def _grew(self, size: int) -> None:
        self.memory_bytes += size
        self.peak_memory_bytes = max(self.peak_memory_bytes, self.memory_bytes)
        while self.memory_bytes > self.memory_limit:
            largest = max(self._buffers, key=lambda b: b.memory_bytes)
            if not largest.memory:
                break
            largest.spill()

    def _shrank(self, size: int) -> None:
        self.memory_bytes -= size

    def _new_file(self, name: str) -> Path:
        if self.directory is None:
            self.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_directories(self.parent)
            self.directory = Path(
                tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=self.parent)
            )
        self._files += 1
        return self.directory / f"{self._files:06d}-{name}.spill"

    def close(self) -> None:
        """Remove every buffer's file and the spill directory."""
        for buffer in list(self._buffers):
            buffer.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def _remove_stale_directories(parent: Path) -> None:
    """Remove spill directories whose process is gone (it crashed before cleaning up)."""
    for path in parent.glob(f"{_DIR_PREFIX}*"):
        pid_text = path.name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's
