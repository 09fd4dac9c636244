"""Files a slot's consumer writes (`pgcdc tail -f`, `pgcdc record`), made durable before the
slot is confirmed past what they hold.

A regular file (or a block device) is flushed and fsynced. A character device (``/dev/null``),
a FIFO or a socket cannot be made durable: fsync fails there (EINVAL). Such an output is still
a valid one: it is written, pgcdc says once that it cannot be made durable, and nothing waits
on it (the slot is confirmed as output is written). A write that fails (a full disk, ENOSPC;
``/dev/full``) is one `OutputFileError` line; the slot is confirmed only past what `sync`
made durable, so nothing past that is confirmed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from pgcdc.errors import OutputFileError

__all__ = ["OutputFile"]

log = logging.getLogger("pgcdc.output")

#: File types fsync cannot make durable, by what `stat` says.
_NOT_SYNCABLE = {
    stat.S_IFCHR: "a character device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


class OutputFile:
    """`path` opened for appending (an `OutputFileError` if it cannot be). Write to `file`
    inside `reporting()`; `sync()` before the slot may move past what was written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            # Appending: a file that exists is left as it was until the caller empties it.
            self.file: BinaryIO = open(path, "ab")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            raise OutputFileError(f"cannot write {self.name}: {exc.strerror or exc}") from None
        kind = _NOT_SYNCABLE.get(stat.S_IFMT(os.fstat(self.file.fileno()).st_mode))
        #: Why `sync` cannot make the output durable (said at the first sync), or None.
        self.not_durable = None if kind is None else f"is {kind}"
        self._said = False
        #: A write failed: what is still buffered is lost, and nothing more is confirmed.
        self.failed = False

    @contextlib.contextmanager
    def reporting(self) -> Iterator[None]:
        """A write that fails as one `OutputFileError` line (and `failed` set); a closed pipe
        as it is (the reader went away)."""
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = True
            raise OutputFileError(f"cannot write {self.name}: {exc.strerror or exc}") from None

    def sync(self) -> None:
        """Make everything written so far durable, where it can be (`not_durable` says why
        not, once, at the first sync: a write that fails says only that)."""
        with self.reporting():
            self.file.flush()
            if self.not_durable is None:
                try:
                    os.fsync(self.file.fileno())
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                        raise
                    self.not_durable = "does not support fsync"
        if self.not_durable is not None and not self._said:
            self._said = True
            log.warning(
                "warning: %s %s: what is written to it cannot be made durable, so nothing "
                "waits for it (the slot is confirmed as output is written)",
                self.name,
                self.not_durable,
            )

    def empty(self) -> None:
        """Drop what the file held (a device or a pipe holds nothing to drop)."""
        with self.reporting():
            if stat.S_ISREG(os.fstat(self.file.fileno()).st_mode):
                self.file.truncate(0)

    def close(self) -> None:
        """Close the file; after a failed write, what was still buffered is dropped quietly
        (the failure was reported once)."""
        try:
            self.file.close()
        except OSError as exc:
            if not self.failed:
                self.failed = True
                raise OutputFileError(f"cannot write {self.name}: {exc.strerror or exc}") from None

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
