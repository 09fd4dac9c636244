"""Background server processes for the cluster tests: free ports, a log file per process,
waits with a deadline that quote the log when they give up, and a stop that ends the
process's whole group (a launcher script, the JVM it execs, the Python workers it forks)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerProcess", "StartError", "free_port", "tail"]


class StartError(RuntimeError):
    """A server did not come up; the message ends with the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, without the JVM's stack frames."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    kept = [line for line in text.splitlines() if not line.lstrip().startswith("at ")]
    return "\n".join(kept[-lines:])


@dataclass(slots=True)
class ServerProcess:
    """One server started in its own process group, its stdout and stderr in ``log``."""

    name: str
    argv: Sequence[str]
    log: Path
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def failure(self, what: str) -> StartError:
        return StartError(f"{self.name}: {what}; last lines of {self.log}:\n{tail(self.log)}")

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it holds; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if ready():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise self.failure(f"exited with status {self.proc.returncode} before {what}")
            if time.monotonic() > deadline:
                raise self.failure(f"no {what} within {timeout:.0f} s")
            time.sleep(0.2)

    def wait_for_log(self, pattern: str, timeout: float) -> re.Match[str]:
        """Wait until the log has a line matching ``pattern``; return the first match."""
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def matched() -> bool:
            try:
                text = self.log.read_text(errors="replace")
            except FileNotFoundError:
                return False
            match = regex.search(text)
            if match:
                found.append(match)
            return match is not None

        self.wait_for(matched, timeout, f"log line /{pattern}/")
        return found[0]

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout`` seconds."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        # Children left in the group (Python workers of a killed executor) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
