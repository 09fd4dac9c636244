"""START_REPLICATION options negotiated against the server version, locally."""

from __future__ import annotations

import pytest

from pgcdc.errors import UnsupportedOption
from pgcdc.protocol import StreamingMode
from pgcdc.replication import OriginFilter, ReplicationClient, StreamOptions, max_proto_version


@pytest.mark.parametrize(
    ("server", "proto"),
    [(100023, 1), (130016, 1), (140012, 2), (150018, 3), (160014, 4), (180004, 4)],
)
def test_default_proto_version_is_the_servers_highest(server: int, proto: int) -> None:
    assert max_proto_version(server) == proto
    assert StreamOptions(("p",)).negotiate(server).proto_version == proto


@pytest.mark.parametrize(
    ("server", "options", "message"),
    [
        (
            150018,
            StreamOptions(("p",), proto_version=4),
            "supports pgoutput proto_version 3 at most",
        ),
        (130016, StreamOptions(("p",), binary=True), "binary needs PostgreSQL 14"),
        (130016, StreamOptions(("p",), messages=True), "messages needs PostgreSQL 14"),
        (
            160014,
            StreamOptions(("p",), proto_version=1, streaming=StreamingMode.ON),
            "proto_version 2",
        ),
        (150018, StreamOptions(("p",), streaming=StreamingMode.PARALLEL), "PostgreSQL 16"),
        (
            160014,
            StreamOptions(("p",), proto_version=3, streaming=StreamingMode.PARALLEL),
            "proto_version 4",
        ),
        (140012, StreamOptions(("p",), two_phase=True), "two_phase needs PostgreSQL 15"),
        (160014, StreamOptions(("p",), proto_version=2, two_phase=True), "proto_version 3"),
        (150018, StreamOptions(("p",), origin=OriginFilter.NONE), "origin needs PostgreSQL 16"),
        (160014, StreamOptions(()), "publication name is required"),
        (160014, StreamOptions(("p",), proto_version=5), "proto_version must be 1 to 4"),
    ],
)
def test_unsupported_combinations_fail_locally(
    server: int, options: StreamOptions, message: str
) -> None:
    with pytest.raises(UnsupportedOption, match=message):
        options.negotiate(server)


def test_command_options_send_only_non_defaults_and_quote_names() -> None:
    plain = StreamOptions(("pub",)).negotiate(150018)
    assert plain.command_options() == "proto_version '3', publication_names 'pub'"
    rich = StreamOptions(
        ("pub", "Odd Name", "it's"),
        binary=True,
        messages=True,
        streaming=StreamingMode.PARALLEL,
        two_phase=True,
        origin=OriginFilter.NONE,
    ).negotiate(180004)
    assert rich.command_options() == (
        "proto_version '4', publication_names 'pub,\"Odd Name\",\"it''s\"', binary 'true', "
        "messages 'true', streaming 'parallel', two_phase 'true', origin 'none'"
    )


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("status_interval", -1.0),
        ("status_interval", float("nan")),
        ("status_interval", 0.0),
        ("reconnect_timeout", float("inf")),
        ("reconnect_timeout", -5.0),
        ("max_backoff", float("nan")),
    ],
)
def test_client_refuses_waits_that_are_not_finite_seconds(argument: str, value: float) -> None:
    """Before, `-s -1` or `-s nan` reached select() on every wait: "timeout must be
    non-negative", a lost connection, a reconnect, forever."""
    with pytest.raises(ValueError, match=f"{argument} must be a finite number of seconds"):
        ReplicationClient("", "slot", StreamOptions(("pub",)), **{argument: value})
