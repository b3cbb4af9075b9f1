"""Which IP addresses the tools service may connect to, and how a host becomes addresses.

``server_url`` comes from API callers, so an address is a destination only when the operator
allowed it. Every address falls in one kind (``classify``), and ``permitted`` decides from the
kind, the settings and how the URL was allowed (``Listing``):

- ``public`` (global unicast): when the URL matches ``CHORUS_ALLOWED_SERVERS`` or a built-in
  tool server. Callers cannot name public servers the operator did not list.
- ``loopback`` (127.0.0.0/8, ::1): with ``CHORUS_ALLOW_LOOPBACK`` (``chorus up`` bound to a
  loopback address turns it on), or for an exact allowlist entry.
- ``private`` (10/8, 172.16/12, 192.168/16, 100.64/10 shared, 198.18/15, fc00::/7, fec0::/10)
  and ``link-local`` (169.254/16, fe80::/10): with ``CHORUS_ALLOW_PRIVATE_NETWORKS``, or for an
  exact allowlist entry.
- ``metadata`` (cloud instance metadata: 169.254.169.254, 169.254.170.2, 169.254.170.23,
  100.100.100.200, 168.63.129.16, fd00:ec2::254, fd00:ec2::23): never, not even for an exact
  entry, unless ``CHORUS_ALLOW_METADATA_ADDRESSES`` is on; then it counts as its range above.
- ``reserved`` (0.0.0.0/8 and ::, multicast, broadcast, documentation and other
  special-purpose ranges, IPv6 outside 2000::/3 unless named above): never.

An *exact* allowlist entry (a host, ``host:port``, an IP literal, a URL prefix, a built-in's
URL) is the operator's word for that one server, so its addresses may be loopback or private
(``mcp.internal`` -> 10.0.0.5 works without opening every private address). A wildcard entry
(``*.example.com``) is not: whoever can add a DNS record under the domain picks the address, so
names under it get only what the settings allow everyone. An URL that matches no entry passes
only when every address is of a kind the settings open to everyone (loopback, private).

IPv4 inside IPv6 (``::ffff:a.b.c.d``, ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``)
is judged as the IPv4 address it reaches. Numeric host spellings are read the way the C
library's ``inet_aton`` reads them (``127.1``, ``0x7f000001``, ``2130706433``, ``0177.0.0.1``),
and never sent to DNS. Names are resolved (every A/AAAA answer, with a timeout) and refused
when *any* answer is not permitted; the connection then goes to a checked address.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import socket
import string
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]


class AddressKind(enum.StrEnum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link-local"
    METADATA = "metadata"
    RESERVED = "reserved"


class Listing(enum.Enum):
    """How a URL matched the operator's allowlist."""

    NONE = "none"
    WILDCARD = "wildcard"  # *.domain
    EXACT = "exact"  # a host, host:port, IP literal, URL prefix or built-in tool server


@dataclass(frozen=True)
class EgressRules:
    allow_loopback: bool = False
    allow_private_networks: bool = False
    allow_metadata_addresses: bool = False

    def opens_unlisted(self) -> bool:
        """Could any address pass for a URL outside the allowlist?"""
        return self.allow_loopback or self.allow_private_networks


class Refused(Exception):
    """The destination is not permitted. The text is for the log, never for the caller."""


def _nets(*cidrs: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "100.100.100.200",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)
_RANGES: tuple[tuple[AddressKind, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]], ...] = (
    (AddressKind.LOOPBACK, _nets("127.0.0.0/8", "::1/128")),
    (AddressKind.LINK_LOCAL, _nets("169.254.0.0/16", "fe80::/10")),
    (
        AddressKind.PRIVATE,
        _nets(
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "198.18.0.0/15",
            "fc00::/7",
            "fec0::/10",
            "64:ff9b:1::/48",
        ),
    ),
    (
        AddressKind.RESERVED,
        _nets(
            "0.0.0.0/8",
            "192.0.0.0/24",
            "192.0.2.0/24",
            "192.88.99.0/24",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "224.0.0.0/4",
            "240.0.0.0/4",
            "::/128",
            "100::/64",
            "2001::/23",
            "2001:db8::/32",
            "3fff::/20",
            "ff00::/8",
        ),
    ),
)
_IPV6_GLOBAL = ipaddress.ip_network("2000::/3")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches: mapped, compatible, NAT64 or 6to4."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if (ip in _IPV4_COMPATIBLE and int(ip) > 1) or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _range_kind(ip: IPAddress) -> AddressKind:
    for kind, nets in _RANGES:
        if any(ip.version == net.version and ip in net for net in nets):
            return kind
    if ip.version == 6 and ip not in _IPV6_GLOBAL:
        return AddressKind.RESERVED
    return AddressKind.PUBLIC


def classify(ip: IPAddress) -> AddressKind:
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None:
            return classify(inner)
        if ip.scope_id:
            ip = ipaddress.IPv6Address(int(ip))
    if ip in _METADATA:
        return AddressKind.METADATA
    return _range_kind(ip)


def permitted(ip: IPAddress, rules: EgressRules, listing: Listing = Listing.NONE) -> bool:
    """May the tools service connect to ``ip`` for a URL allowed as ``listing``?"""
    kind = classify(ip)
    if kind is AddressKind.METADATA:
        if not rules.allow_metadata_addresses:
            return False
        inner = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        kind = _range_kind(inner or ip)
    if kind is AddressKind.PUBLIC:
        return listing is not Listing.NONE
    if kind is AddressKind.LOOPBACK:
        return rules.allow_loopback or listing is Listing.EXACT
    if kind in (AddressKind.PRIVATE, AddressKind.LINK_LOCAL):
        return rules.allow_private_networks or listing is Listing.EXACT
    return False


def _inet_aton_part(text: str) -> int | None:
    if text[:2].lower() == "0x":
        digits, base, allowed = text[2:], 16, string.hexdigits
    elif len(text) > 1 and text.startswith("0"):
        digits, base, allowed = text[1:], 8, string.octdigits
    else:
        digits, base, allowed = text, 10, string.digits
    if not digits or any(c not in allowed for c in digits):
        return None
    return int(digits, base)


def _parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """``inet_aton``'s forms: a.b.c.d, a.b.c (c: 16 bits), a.b (b: 24 bits), a (32 bits); each
    part decimal, octal (leading 0) or hex (0x)."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = [_inet_aton_part(p) for p in parts]
    if None in values:
        return None
    *head, last = [v for v in values if v is not None]
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def parse_ip(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is one in any spelling a resolver would accept
    (``[::1]``, ``::ffff:127.0.0.1``, ``fe80::1%eth0``, ``127.1``, ``0x7f000001``, ...);
    ``None`` for a name."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    return _parse_ipv4(host.removesuffix(".")) if host not in ("", ".") else None


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for ``host`` (the event loop's getaddrinfo)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


async def resolve_host(host: str, port: int, resolve: Resolver, timeout_s: float) -> list[IPAddress]:
    """The addresses behind ``host``, without duplicates, in the resolver's order. An IP
    literal (any spelling) is its own answer and no lookup is made."""
    literal = parse_ip(host)
    if literal is not None:
        return [literal]
    try:
        async with asyncio.timeout(timeout_s):
            answers = await resolve(host, port)
    except TimeoutError:
        raise OSError(f"resolving {host!r} took longer than {timeout_s:g}s") from None
    addresses = list(dict.fromkeys(answers))
    if not addresses:
        raise OSError(f"{host!r} resolved to no address")
    return addresses


def check_addresses(host: str, addresses: Sequence[IPAddress], rules: EgressRules, listing: Listing) -> None:
    """Raises ``Refused`` (saying which address and why, for the log) unless every address is
    permitted."""
    refused = [ip for ip in addresses if not permitted(ip, rules, listing)]
    if refused:
        shown = ", ".join(f"{ip} ({classify(ip)})" for ip in refused)
        raise Refused(f"{host!r} ({listing.value} in allowed_servers) resolves to {shown}")
