"""The logs of the servers a failed test of this directory used, in its report (the
fixtures themselves come from ``clusters.fixtures``, a plugin of ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from .processes import ServerProcess, tail

_SERVERS = ("standalone_cluster", "connect_server", "moto_s3", "azurite")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in _SERVERS:
            server = funcargs.get(name)
            if server is None:
                continue
            procs = [
                getattr(server, "master", None),
                *getattr(server, "worker_procs", ()),
                getattr(server, "proc", None),
            ]
            parts = [
                f"--- {proc.log}\n{tail(proc.log, 30)}"
                for proc in procs
                if isinstance(proc, ServerProcess)
            ]
            if name == "standalone_cluster":
                parts.append(server.executor_logs())
            report.sections.append((f"{name} logs", "\n".join(parts)))
    return report
