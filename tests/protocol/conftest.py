"""Every codec test runs twice: with the C fast path (when built) and in pure Python."""

from __future__ import annotations

import pytest

from pgcdc.protocol import decoder, speedups


@pytest.fixture(autouse=True, params=["c", "python"])
def codec_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c":
        if speedups.SPEEDUPS is None:
            pytest.skip("the C fast path is not built (or PGCDC_PURE_PYTHON is set)")
    else:
        monkeypatch.setattr(decoder, "SPEEDUPS", None)
        monkeypatch.setattr(speedups, "_parse_xlogdata", lambda data: None, raising=False)
    return request.param
