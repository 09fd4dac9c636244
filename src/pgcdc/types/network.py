"""Network address types: ``inet``, ``cidr``, ``macaddr`` and ``macaddr8``.

inet becomes an `ipaddress.IPv4Interface`/`IPv6Interface` (address *and* netmask, host bits
allowed), always, even when the server prints it without a mask (a full-length one): an
``ip_address`` there would make the type of a column's values depend on their masks. cidr
becomes an `IPv4Network`/`IPv6Network`, whose host bits PostgreSQL guarantees to be zero.
MAC addresses stay `str`, in the server's canonical form (lower-case hex, colon-separated).
"""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import (
    IPv4Interface,
    IPv4Network,
    IPv6Interface,
    IPv6Network,
)

from pgcdc.errors import ValueDecodeError
from pgcdc.types.registry import register

__all__: list[str] = []

# inet_send: family (PGSQL_AF_INET 2, PGSQL_AF_INET6 3), prefix bits, is_cidr, address byte
# count, address bytes.
_AF_INET, _AF_INET6 = 2, 3
_ADDRESS_SIZES = {_AF_INET: 4, _AF_INET6: 16}


def inet_text(data: bytes) -> IPv4Interface | IPv6Interface:
    """``inet_out``: an address, with ``/bits`` unless the mask is full-length."""
    try:
        text = data.decode("ascii")
        return IPv6Interface(text) if ":" in text else IPv4Interface(text)
    except (ValueError, UnicodeDecodeError):
        raise ValueDecodeError(f"invalid inet text {data[:60]!r}") from None


def cidr_text(data: bytes) -> IPv4Network | IPv6Network:
    """``cidr_out``: a network address, always with ``/bits``."""
    try:
        text = data.decode("ascii")
        return IPv6Network(text) if ":" in text else IPv4Network(text)
    except (ValueError, UnicodeDecodeError):
        raise ValueDecodeError(f"invalid cidr text {data[:60]!r}") from None


def _address(data: bytes, what: str) -> tuple[bool, bytes, int]:
    """(is IPv6, address bytes, prefix bits) of an ``inet_send`` value, checked."""
    if len(data) < 4:
        raise ValueDecodeError(f"{what} binary needs at least 4 bytes, got {len(data)}")
    family, bits, nbytes = data[0], data[1], data[3]  # data[2] is the is_cidr flag
    size = _ADDRESS_SIZES.get(family)
    if size is None:
        raise ValueDecodeError(f"{what} binary has unknown address family {family}")
    if nbytes != size or len(data) != 4 + size:
        raise ValueDecodeError(
            f"{what} binary: family {family} needs {size} address bytes, "
            f"got {nbytes} declared and {len(data) - 4} present"
        )
    if bits > size * 8:
        raise ValueDecodeError(f"{what} binary has {bits} mask bits for a {size * 8}-bit address")
    return family == _AF_INET6, data[4:], bits


def inet_binary(data: bytes) -> IPv4Interface | IPv6Interface:
    """``inet_send`` for an inet value."""
    ipv6, address, bits = _address(data, "inet")
    return IPv6Interface((address, bits)) if ipv6 else IPv4Interface((address, bits))


def cidr_binary(data: bytes) -> IPv4Network | IPv6Network:
    """``inet_send`` for a cidr value (host bits are zero)."""
    ipv6, address, bits = _address(data, "cidr")
    try:
        return IPv6Network((address, bits)) if ipv6 else IPv4Network((address, bits))
    except ValueError:
        raise ValueDecodeError(f"cidr binary has host bits set: {data.hex()}") from None


def _mac_text(length: int, what: str) -> Callable[[bytes], str]:
    def parse(data: bytes) -> str:
        # The canonical form is fixed: hex pairs and colons at every third position.
        if len(data) != length * 3 - 1 or data.count(b":") != length - 1:
            raise ValueDecodeError(f"invalid {what} text {data[:40]!r}")
        return data.decode("ascii")

    parse.__doc__ = f"``{what}_out``: {length} lower-case hex pairs joined by colons."
    return parse


def _mac_binary(length: int, what: str) -> Callable[[bytes], str]:
    def parse(data: bytes) -> str:
        if len(data) != length:
            raise ValueDecodeError(f"{what} binary needs {length} bytes, got {len(data)}")
        return data.hex(":")

    parse.__doc__ = f"``{what}_send``: the {length} bytes, printed as ``{what}_out`` does."
    return parse


register(869, "inet", inet_text, inet_binary, array_oid=1041)
register(650, "cidr", cidr_text, cidr_binary, array_oid=651)
register(829, "macaddr", _mac_text(6, "macaddr"), _mac_binary(6, "macaddr"), array_oid=1040)
register(774, "macaddr8", _mac_text(8, "macaddr8"), _mac_binary(8, "macaddr8"), array_oid=775)
