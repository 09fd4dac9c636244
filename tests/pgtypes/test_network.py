"""inet, cidr, macaddr and macaddr8: streamed text and binary values equal the server's own, and
each other."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address, ip_interface, ip_network
from typing import Any

import pytest

from pgcdc.embedded import Database
from pgcdc.errors import ValueDecodeError
from pgcdc.types import DEFAULT_REGISTRY
from pgcdc.types.network import cidr_binary, cidr_text, inet_binary, inet_text

from .helpers import stream_both

ROWS = [
    # inet, cidr, macaddr, macaddr8
    "'192.168.1.5', '192.168.1.0/24', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05'",
    "'192.168.1.5/24', '10/8', '08-00-2B-01-02-03', '08-00-2B-01-02-03-04-05'",
    "'0.0.0.0/0', '0.0.0.0/0', '0800.2b01.0203', '08002b01:02030405'",
    "'255.255.255.255/32', '1.2.3.4/32', 'FFFFFFFFFFFF', '08:00:2b:01:02:03'",  # 6 -> 8 bytes
    "'::1', '::/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00'",
    "'2001:db8::1/64', '2001:db8::/32', 'ab:cd:ef:01:23:45', 'ff:ff:ff:ff:ff:ff:ff:ff'",
    "'::ffff:1.2.3.4', '::ffff:1.2.3.0/120', '01:02:03:04:05:06', '0102.0304.0506.0708'",
    "'fe80::1:2:3:4/10', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128', null, null",
    "'10.1.2.3/8', '192.168/16', null, null",
    "null, null, null, null",
]


def test_values_equal_the_servers(pg: Database) -> None:
    text, binary = stream_both(pg, "i inet, c cidr, m macaddr, m8 macaddr8", ROWS)
    with pg.connect() as conn:
        server = conn.execute(
            "SELECT i, c, m::text, m8::text, host(i), masklen(i) FROM src ORDER BY id"
        ).fetchall()
    assert text == binary
    for row, (i, c, m, m8, host, bits) in zip(text, server, strict=True):
        # psycopg loads an inet printed without a mask as an address; pgcdc always gives an
        # interface, whose address and mask must be the server's
        if isinstance(i, IPv4Address | IPv6Address):
            i = ip_interface(i)
        assert row == (i, c, m, m8)
        if i is not None:
            assert (row[0].ip, row[0].network.prefixlen) == (ip_address(host), bits)
    assert repr(text[0][0]) == "IPv4Interface('192.168.1.5/32')"
    assert text[1][1] == ip_network("10.0.0.0/8") and text[8][0] == ip_interface("10.1.2.3/8")
    assert text[3][3] == "08:00:2b:ff:fe:01:02:03" and text[1][2] == "08:00:2b:01:02:03"


@pytest.mark.parametrize(
    ("parser", "data", "message"),
    [
        (inet_text, b"1.2.3", "invalid inet text"),
        (inet_text, b"1.2.3.4/33", "invalid inet text"),
        (cidr_text, b"1.2.3.4/24", "invalid cidr text"),  # host bits set
        (inet_binary, b"\x02\x20\x00", "inet binary needs at least 4 bytes"),
        (inet_binary, b"\x04\x20\x00\x04\x01\x02\x03\x04", "unknown address family 4"),
        (inet_binary, b"\x02\x20\x00\x10\x01\x02\x03\x04", "needs 4 address bytes"),
        (inet_binary, b"\x02\x20\x00\x04\x01\x02\x03", "got 4 declared and 3 present"),
        (inet_binary, b"\x02\x21\x00\x04\x01\x02\x03\x04", "33 mask bits"),
        (cidr_binary, b"\x02\x08\x01\x04\x01\x02\x03\x04", "cidr binary has host bits set"),
        (DEFAULT_REGISTRY.get(829).from_text, b"08:00:2b:01:02", "invalid macaddr text"),
        (DEFAULT_REGISTRY.get(774).from_text, b"08-00-2b-01-02-03-04-05", "invalid macaddr8"),
        (DEFAULT_REGISTRY.get(829).from_binary, b"\x00" * 8, "macaddr binary needs 6 bytes"),
        (DEFAULT_REGISTRY.get(774).from_binary, b"\x00" * 6, "macaddr8 binary needs 8 bytes"),
    ],
)
def test_bad_bytes_raise(parser: Any, data: bytes, message: str) -> None:
    with pytest.raises(ValueDecodeError, match=message):
        parser(data)


def test_binary_layouts() -> None:
    assert inet_binary(b"\x03\x80\x00\x10" + bytes(15) + b"\x01") == ip_interface("::1")
    assert cidr_binary(b"\x02\x00\x01\x04\x00\x00\x00\x00") == ip_network("0.0.0.0/0")
    assert DEFAULT_REGISTRY.get(829).from_binary(bytes.fromhex("08002b010203")) == (
        "08:00:2b:01:02:03"
    )
