"""A local Spark session shared by the Spark tests (two cores, UTC, pgoutput registered)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pgcdc.spark.session import local_session

    session = local_session("pgcdc-tests", cores="2")
    yield session
    session.stop()
