"""Fixtures of the target tests."""

from __future__ import annotations

import pytest

from pgcdc.targets import _table


@pytest.fixture(params=["merge-on-read", "copy-on-write"])
def write_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a local target writes a batch that changes rows: with deletion vectors
    (pgcdc's default for local tables) and copy-on-write MERGE (object stores, or a table
    without them)."""
    if request.param == "copy-on-write":
        monkeypatch.setattr(_table, "LOCAL_PROPERTIES", {})
    return str(request.param)
