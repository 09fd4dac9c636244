"""Where pgcdc keeps files of its own (a pipeline's state: JSON documents, a log of
segments) on the local disk or on an object store, behind one small interface in the style of
pyiceberg's ``FileIO``:

* `FileIO`: the interface. Names are relative to its root (``slot.json``,
  ``batches/0000000001.jsonl``); `location` gives a name's full path or URI (for Delta tables
  kept under the root, with `storage_options`);
* `LocalFileIO`: a directory (a path, or a ``file://`` URI);
* `ObjectStoreFileIO`: a prefix of an object store (``s3://``, ``az://``, ``abfs[s]://``,
  ``gs://``), through delta-rs' own object store (the ``deltalake`` package), with the
  targets' storage options, so one set of options serves the tables and the state;
* `open_file_io`: the one for a URI or path.

What every implementation promises: `write` replaces a whole file atomically (a reader sees
the old content or the new, never a part: locally written beside it, flushed to disk and
renamed over it; on an object store one PUT); `read` tells an absent file (None) from one
that cannot be read (`StorageError`); a store that refuses (wrong credentials, a missing
bucket or container, an unreachable endpoint) is a `StorageError` of one line naming the URI
and the store's reason. There is no append (object stores have none) and no compare-and-swap:
a location has one writer (two pipelines must not share a state location).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgcdc.errors import StorageError
from pgcdc.extras import MissingExtra

__all__ = [
    "FileIO",
    "LocalFileIO",
    "ObjectStoreFileIO",
    "StorageError",
    "is_object_store",
    "join_location",
    "open_file_io",
]


def is_object_store(location: str) -> bool:
    """A URI of an object store (``s3://``, ``az://``, ``abfss://``, ``gs://``…), not a local
    path (``file://`` is one)."""
    return "://" in location and not location.startswith("file://")


def join_location(base: str, name: str) -> str:
    """`base` / `name` for a local path or a URI alike."""
    if not name:
        return base
    if "://" in base:
        return base.rstrip("/") + "/" + name.strip("/")
    return str(Path(base) / name)


class FileIO(ABC):
    """Files under one root (see the module docstring)."""

    #: The root: a local path or an object store's URI.
    root: str

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The options a Delta table under this root is opened with (delta-rs')."""
        return None

    def location(self, name: str = "") -> str:
        """The path or URI of `name`."""
        return join_location(self.root, name)

    @abstractmethod
    def check(self) -> None:
        """Raise `StorageError` when the root cannot be used (a missing bucket, wrong
        credentials, a local path that is a file or not writable)."""

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The whole file; None when there is none (`StorageError` when it cannot be read)."""

    @abstractmethod
    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        """Replace `name` with `data`, atomically. `durable` (local files): on disk before
        this returns (an object store's PUT always is)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove the file `name` (nothing when there is none)."""

    @abstractmethod
    def delete_tree(self, name: str = "") -> None:
        """Remove everything under `name` (a Delta table, say); "" is the whole root."""

    @abstractmethod
    def list(self, name: str = "") -> list[str]:
        """The names of the files directly under `name`, sorted (relative to `name`)."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether `name` is a file or has files under it."""

    def child(self, name: str) -> FileIO:
        """The files under `name`, as a `FileIO` of their own."""
        return open_file_io(self.location(name), self.storage_options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"


class LocalFileIO(FileIO):
    """A local directory (created on the first write)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(str(root).removeprefix("file://"))
        self.root = str(self.path)

    def _path(self, name: str) -> Path:
        return self.path / name if name else self.path

    def check(self) -> None:
        """The root is a writable directory, or one that can be made (nothing is made)."""
        path = self.path
        if path.exists():
            if not path.is_dir():
                raise StorageError(f"{path}: not a directory")
            if not os.access(path, os.W_OK | os.X_OK):
                raise StorageError(f"{path}: the directory is not writable")
            return
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise StorageError(
                f"{path}: cannot create the directory ({ancestor} is not a writable directory)"
            )

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"{path}: cannot read it: {exc.strerror or exc}") from None

    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        path = self._path(name)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(data)
                if durable:
                    out.flush()
                    os.fsync(out.fileno())
            tmp.replace(path)
            if durable:
                directory = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except OSError as exc:
            raise StorageError(f"{path}: cannot write it: {exc.strerror or exc}") from None

    def delete(self, name: str) -> None:
        path = self._path(name)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"{path}: cannot remove it: {exc.strerror or exc}") from None

    def delete_tree(self, name: str = "") -> None:
        path = self._path(name)
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"{path}: cannot remove it: {exc.strerror or exc}") from None

    def list(self, name: str = "") -> list[str]:
        path = self._path(name)
        try:
            return sorted(p.name for p in path.iterdir() if p.is_file())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"{path}: cannot list it: {exc.strerror or exc}") from None

    def exists(self, name: str) -> bool:
        path = self._path(name)
        if path.is_dir():  # as on an object store: a directory is its files
            return any(p.is_file() for p in path.rglob("*"))
        return path.is_file()


#: Seconds of reads that each overlap a rewrite of the object before one gives up
#: (`ObjectStoreFileIO.read`): a writer pauses between rewrites (the pipeline rewrites a state
#: file once per batch at most), so only one that never pauses outlasts this.
_READ_PATIENCE = 30.0
#: ANSI colours in delta-rs' error chains.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: What an object store's XML error says: its code and message; else its HTTP status.
_XML_CODE = re.compile(r"<Code>([^<]+)</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<\n]+)")
_HTTP_STATUS = re.compile(r"\b([45]\d\d [A-Z][A-Za-z ]+?)\s*(?:$|\n|:)", re.MULTILINE)


def store_reason(exc: BaseException) -> str:
    """One line from an object store's error (delta-rs chains several, with the server's
    XML answer): the store's error code and message when it sent one, else the HTTP status,
    else the first line."""
    text = _ANSI.sub("", str(exc))
    code = _XML_CODE.search(text)
    if code is not None:
        message = _XML_MESSAGE.search(text)
        return code.group(1) + (f": {message.group(1).strip()}" if message else "")
    status = _HTTP_STATUS.search(text)
    first = text.strip().splitlines()[0].strip() if text.strip() else type(exc).__name__
    if status is not None:
        return f"{first.rstrip(':')} ({status.group(1).strip()})"
    chain = [line.strip(" ↳") for line in text.splitlines() if line.strip(" ↳")]
    return "; ".join(chain[:3]) if chain else first


class ObjectStoreFileIO(FileIO):
    """A prefix of an object store, through delta-rs (``deltalake``) with `storage_options`
    (the targets' own: credentials, endpoint, region...).

    Before its first read the root is listed once (`check`): an object store answers "not
    found" for a file of a bucket that does not exist, which must not pass for an absent
    file."""

    def __init__(self, root: str, storage_options: Mapping[str, str] | None = None) -> None:
        # deltalake.fs.DeltaStorageHandler wraps this handler for pyarrow, but writes through
        # it fail in deltalake 1.6 (it hands delta-rs a pyarrow Buffer, which takes bytes
        # only); the handler itself reads, writes, lists and deletes.
        try:
            from deltalake._internal import DeltaFileSystemHandler
        except ModuleNotFoundError:
            raise MissingExtra(
                f"{root}: an object store needs deltalake, which comes with pgcdc's 'spark' "
                "extra: pip install 'pgcdc[spark]'"
            ) from None

        self.root = root.rstrip("/")
        self._options = dict(storage_options or {})
        try:
            self._handler = DeltaFileSystemHandler(self.root, self._options or None)
        except Exception as exc:  # a URI delta-rs does not know, an option it refuses
            raise StorageError(f"{self.root}: {store_reason(exc)}") from None
        self._checked = False
        self._lock = threading.Lock()

    @property
    def storage_options(self) -> dict[str, str] | None:
        return dict(self._options) or None

    def _fail(self, name: str, doing: str, exc: BaseException) -> StorageError:
        return StorageError(f"{self.location(name)}: {doing}: {store_reason(exc)}")

    def check(self) -> None:
        with self._lock:
            if self._checked:
                return
            try:
                self._handler.get_file_info_selector("", True, False)
            except Exception as exc:
                raise self._fail("", "the store refuses", exc) from None
            self._checked = True

    def read(self, name: str) -> bytes | None:
        """The object as one version. delta-rs asks for its size, then for that many bytes,
        so a rewrite in between gives the start of the new version, and a size asked again
        afterwards can be the old one again (a rewrite back to a version of that size: seen
        on Azure). So it is read twice: the same bytes twice, of the size asked each time,
        are one version; a false match needs the same longer version under both reads and
        another in between. Otherwise the read starts over."""
        self.check()
        deadline = time.monotonic() + _READ_PATIENCE
        try:
            last = self._read_once(name)
            while True:
                now = self._read_once(name)
                if now is not None and now == last:
                    return now
                if time.monotonic() > deadline:
                    break
                last = now
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail(name, "cannot read it", exc) from None
        raise StorageError(
            f"{self.location(name)}: cannot read it: it was rewritten during every read for "
            f"{_READ_PATIENCE:.0f} s (is another process writing here?)"
        )

    def _read_once(self, name: str) -> bytes | None:
        """The object's bytes, or None when fewer came than its size said (a rewrite)."""
        file = self._handler.open_input_file(name)
        size = file.size()
        data = file.read(size)
        return data if len(data) == size else None

    def write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        try:
            stream = self._handler.open_output_stream(name, None)
            stream.write(bytes(data))
            # The object appears whole, or not at all (the stub lacks close()).
            stream.close()  # type: ignore[attr-defined]
        except Exception as exc:
            raise self._fail(name, "cannot write it", exc) from None

    def delete(self, name: str) -> None:
        try:
            self._handler.delete_file(name)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail(name, "cannot remove it", exc) from None

    def delete_tree(self, name: str = "") -> None:
        try:
            self._handler.delete_dir(name)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail(name, "cannot remove it", exc) from None

    def _infos(self, name: str, recursive: bool) -> list[Any]:
        try:
            return list(self._handler.get_file_info_selector(name, True, recursive))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail(name, "cannot list it", exc) from None

    def list(self, name: str = "") -> list[str]:
        prefix = name.strip("/") + "/" if name.strip("/") else ""
        files = [i.path for i in self._infos(name, False) if i.is_file]
        return sorted(p.removeprefix(prefix) for p in files)

    def exists(self, name: str) -> bool:
        self.check()
        try:
            (info,) = self._handler.get_file_info([name])
        except Exception as exc:
            raise self._fail(name, "cannot look at it", exc) from None
        if info.is_file:
            return True
        return any(i.is_file for i in self._infos(name, True))


def open_file_io(location: str, storage_options: Mapping[str, str] | None = None) -> FileIO:
    """The `FileIO` rooted at `location`: a local path or ``file://`` URI, or an object
    store's URI with `storage_options` (delta-rs' option names, as for the targets)."""
    if is_object_store(location):
        return ObjectStoreFileIO(location, storage_options)
    return LocalFileIO(location)
