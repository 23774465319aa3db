"""Which network addresses a webhook may reach: public unicast only, unless the deployment says
otherwise (COSYQ_WEBHOOK_ALLOW_PRIVATE).

`ipaddress` alone is not enough: it calls `64:ff9b::a9fe:a9fe` (NAT64 of 169.254.169.254, a
cloud metadata service) global, and an IPv6 address can carry an IPv4 one in several standard
ways. Each of these forms is judged by the IPv4 address it embeds as well as by itself:

- IPv4-mapped `::ffff:a.b.c.d` and IPv4-compatible `::a.b.c.d`;
- NAT64, the well-known prefix `64:ff9b::/96` and the local-use `64:ff9b:1::/48` (RFC 8215);
- 6to4 `2002:AABB:CCDD::/48` (the IPv4 in bits 16-47);
- Teredo `2001:0::/32` (server and client IPv4).

Used at submit time (`shared/webhooks.check_webhook_url`: literal addresses on both sides, host
names resolved by the producer) and by the dispatcher, which connects only to an address it
checked (`producer/webhooks/connect.py`).
"""

from __future__ import annotations

import ipaddress
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NAT64_PREFIXES = (
    ipaddress.IPv6Network("64:ff9b::/96"),  # RFC 6052 well-known prefix
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # RFC 8215 local-use prefix
)
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d (RFC 4291 2.5.5.1)
_PLAIN = (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1"))  # in ::/96, embed nothing


class AddressRefused(ValueError):
    """A webhook host that is, or resolves to, an address webhooks must never reach."""


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (none for a plain IPv6 address)."""
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in prefix for prefix in NAT64_PREFIXES) or address in IPV4_COMPATIBLE:
        found.append(low32)
    return found


def address_problem(address: IPAddress) -> str | None:
    """Why a webhook must not reach `address` ("loopback", "link-local", ...), or None.

    A translated form (IPv4-mapped, well-known NAT64, 6to4) reaches its IPv4 address and is
    judged by it; other forms must pass on their own as well."""
    if isinstance(address, ipaddress.IPv6Address) and address not in _PLAIN:
        for inner in embedded_ipv4(address):
            problem = _own_problem(inner)
            if problem is not None:
                return f"{problem} (it embeds {inner})"
        if address in NAT64_PREFIXES[1]:
            return "a local-use NAT64 address"
        if _translated(address):
            return None
    return _own_problem(address)


def _translated(address: ipaddress.IPv6Address) -> bool:
    return (
        address.ipv4_mapped is not None
        or address.sixtofour is not None
        or address in NAT64_PREFIXES[0]
    )


def _own_problem(address: IPAddress) -> str | None:
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not public"),
    )
    return next((label for failed, label in checks if failed), None)


def literal_address(host: str) -> IPAddress | None:
    """The address when `host` is an IP literal (brackets stripped), None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def check_address(host: str, address: IPAddress) -> None:
    """AddressRefused naming `host` and why, when webhooks must not reach `address`."""
    problem = address_problem(address)
    if problem is not None:
        shown = host if str(address) == host.strip("[]") else f"{host} resolves to {address}, which"
        raise AddressRefused(
            f"{shown} is {problem}: webhooks reach public addresses only "
            "(COSYQ_WEBHOOK_ALLOW_PRIVATE=1 allows others)"
        )


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (one DNS answer); OSError when it does not resolve."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def checked_addresses(host: str, port: int, *, allow_private: bool) -> list[IPAddress]:
    """`host` resolved once, every address checked (one refused address refuses the host):
    the addresses to connect to. AddressRefused, or OSError when it does not resolve."""
    found = resolve(host, port)
    if not allow_private:
        for address in found:
            check_address(host, address)
    return found
