"""The ``pgcdc`` sink's options and input: one line for each mistake (test_sdp.py runs the
sink under ``spark-pipelines``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA
from pgcdc.errors import TargetError
from pgcdc.spark.sink import SinkOptions, envelope_rows


def test_options() -> None:
    options = SinkOptions.parse(
        {
            "path": "s3://bucket/lake",
            "conninfo": "dbname=x",
            "Modes": "mirror, history",
            "tables": "orders, sales.items",
            "storage.AWS_REGION": "eu-west-1",
        }
    )
    assert options.modes == ("mirror", "history")
    assert options.tables == frozenset({"public.orders", "sales.items"})
    assert options.app_id == "pgcdc:sdp"
    assert (
        options.target("public.orders", "history").path == "s3://bucket/lake/public.orders__history"
    )
    assert options.target("public.orders", "mirror").storage_options == {"AWS_REGION": "eu-west-1"}
    local = SinkOptions.parse({"path": "/lake", "conninfo": "dbname=x", "name": "shop"})
    assert (local.modes, local.tables, local.app_id) == (("mirror",), None, "pgcdc:shop")
    assert local.target("public.t", "changelog").path == "/lake/public.t__changelog"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "/lake"}, "the pgcdc sink needs the option(s) conninfo"),
        ({}, "the pgcdc sink needs the option(s) path, conninfo"),
        ({"path": "/l", "conninfo": "c", "modes": "mirror,scd2"}, "option modes='mirror,scd2'"),
    ],
)
def test_bad_options_are_one_line(options: dict[str, str], message: str) -> None:
    with pytest.raises(TargetError) as raised:
        SinkOptions.parse(options)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_rows_that_are_not_envelopes() -> None:
    rows = pa.table({"id": [1], "op": ["insert"]})
    with pytest.raises(TargetError, match=r"^the pgcdc sink takes the pgoutput source's rows; "):
        envelope_rows(rows)
    empty = ENVELOPE_ARROW_SCHEMA.empty_table()
    # Spark hands timestamps in the session's zone and may reorder nothing else: cast back
    shifted = empty.cast(
        empty.schema.set(4, pa.field("commit_ts", pa.timestamp("us", "Europe/Paris")))
    )
    assert (
        envelope_rows(shifted.select(list(reversed(shifted.column_names)))).schema == empty.schema
    )
