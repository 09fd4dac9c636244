"""Hypothesis: generated values of the simpler types, through the server and back.

For each type, a generated Python value is written as a literal, and the server returns its
output text and its send bytes; both must decode to the value (in its canonical form). The
numeric, money, date/time, interval, text search and array types have their own properties
in their modules.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.embedded import Database
from pgcdc.types import DEFAULT_REGISTRY, BitString, Point

pytestmark = pytest.mark.server

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def both_forms(pg: Database, oid: int, literal: str, sql_type: str, send: str) -> tuple:
    """The output function's text (what pgoutput sends; `::text` differs for bool) and the
    send function's bytes for `literal`, decoded by pgcdc."""
    with pg.connect() as conn:
        conn.execute("SET extra_float_digits = 3; SET bytea_output = hex")
        text, binary = conn.execute(
            f"SELECT format('%%s', x), {send}(x) FROM (SELECT %s::{sql_type} AS x) s", [literal]
        ).fetchone()
    codec = DEFAULT_REGISTRY.get(oid)
    return codec.decode(0x74, text.encode()), codec.decode(0x62, bytes(binary))


CASES: dict[str, tuple[int, str, str, st.SearchStrategy, Callable[[Any], str]]] = {
    "int8": (20, "int8", "int8send", st.integers(-(2**63), 2**63 - 1), str),
    "float8": (
        701,
        "float8",
        "float8send",
        st.floats(allow_nan=False),
        repr,
    ),
    "bool": (16, "bool", "boolsend", st.booleans(), str),
    "text": (
        25,
        "text",
        "textsend",
        st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
        str,
    ),
    "bytea": (17, "bytea", "byteasend", st.binary(max_size=64), lambda b: "\\x" + b.hex()),
    "uuid": (2950, "uuid", "uuid_send", st.uuids(), str),
    "inet4": (
        869,
        "inet",
        "inet_send",
        st.builds(
            lambda a, m: ipaddress.IPv4Interface((a, m)), st.ip_addresses(v=4), st.integers(0, 32)
        ),
        str,
    ),
    "inet6": (
        869,
        "inet",
        "inet_send",
        st.builds(
            lambda a, m: ipaddress.IPv6Interface((a, m)), st.ip_addresses(v=6), st.integers(0, 128)
        ),
        str,
    ),
    "varbit": (
        1562,
        "varbit",
        "varbit_send",
        st.text("01", max_size=70).map(BitString),
        lambda b: b.bits,
    ),
    "point": (
        600,
        "point",
        "point_send",
        st.builds(Point, st.floats(allow_nan=False), st.floats(allow_nan=False)),
        lambda p: f"({p.x!r},{p.y!r})",
    ),
}


def canonical(value: Any) -> Any:
    if isinstance(value, float) and value == 0:
        return ("zero", math.copysign(1, value))
    return value


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_values_round_trip(pg: Database, case: str) -> None:
    oid, sql_type, send, strategy, literal = CASES[case]

    @SETTINGS
    @given(value=strategy)
    def check(value: Any) -> None:
        text_value, binary_value = both_forms(pg, oid, literal(value), sql_type, send)
        assert canonical(text_value) == canonical(value)
        assert canonical(binary_value) == canonical(value)

    check()
