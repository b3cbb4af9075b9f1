"""Which addresses the tools service may connect to: every kind of address (public, loopback,
private, link-local, metadata, reserved, in each of their IPv4 and IPv6 spellings) classified,
judged against the egress rules and how the server is listed, and numeric hosts read however
they are written. How names become addresses, and a server policy's verdict on a URL, are in
test_egress_hosts.py.

Everything here is pure: no test sends anything to a private, link-local or metadata address
(nor anywhere else)."""

from __future__ import annotations

import ipaddress

import pytest

from services.tools.egress import AddressKind, EgressRules, Listing, classify, parse_ip, permitted

K = AddressKind
CLASSIFIED = {
    K.PUBLIC: [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "11.0.0.1",
        "126.255.255.255",
        "128.0.0.1",
        "223.255.255.255",
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.167.255.255",
        "192.169.0.0",
        "169.253.255.255",
        "169.255.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "2a00:1450::1",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
    K.LOOPBACK: [
        "127.0.0.1",
        "127.0.0.0",
        "127.8.9.10",
        "127.255.255.255",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:7f00:1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::1",
    ],
    K.PRIVATE: [
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.0.1",
        "192.168.255.255",
        "100.64.0.1",
        "100.127.255.255",
        "198.18.0.1",
        "198.19.255.255",
        "fc00::1",
        "fd12:3456:789a::1",
        "fec0::1",
        "64:ff9b:1::a00:1",
        "::ffff:10.0.0.1",
        "::ffff:192.168.1.1",
        "::ffff:100.64.0.1",
        "2002:a00:1::1",
    ],
    K.LINK_LOCAL: [
        "169.254.0.1",
        "169.254.255.255",
        "169.254.169.253",
        "fe80::1",
        "fe80::1%eth0",
        "febf::1",
        "::ffff:169.254.1.1",
    ],
    K.METADATA: [
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "100.100.100.200",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "::ffff:169.254.169.254",
        "::ffff:a9fe:a9fe",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "::169.254.169.254",
    ],
    K.RESERVED: [
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "192.0.0.1",
        "192.0.2.1",
        "198.51.100.1",
        "203.0.113.1",
        "192.88.99.1",
        "::",
        "::2",
        "ff02::1",
        "ff05::1:3",
        "2001:db8::1",
        "2001::1",
        "100::1",
        "3fff::1",
        "4000::1",
        "::ffff:0.0.0.0",
        "::ffff:224.0.0.1",
    ],
}
CASES = [(address, kind) for kind, addresses in CLASSIFIED.items() for address in addresses]


@pytest.mark.parametrize(("address", "kind"), CASES)
def test_classify(address: str, kind: AddressKind) -> None:
    assert classify(ipaddress.ip_address(address)) is kind


OFF = EgressRules()
LOOPBACK = EgressRules(allow_loopback=True)
PRIVATE = EgressRules(allow_private_networks=True)
ALL_NETS = EgressRules(allow_loopback=True, allow_private_networks=True)
METADATA = EgressRules(allow_metadata_addresses=True)
EVERYTHING = EgressRules(True, True, True)

# kind -> what passes: (rules, listing) pairs not listed here are refused
PASSES: dict[AddressKind, set[tuple[EgressRules, Listing]]] = {
    K.PUBLIC: {
        (r, li)
        for r in (OFF, LOOPBACK, PRIVATE, ALL_NETS, METADATA, EVERYTHING)
        for li in (Listing.WILDCARD, Listing.EXACT)
    },
    K.LOOPBACK: {(r, li) for r in (LOOPBACK, ALL_NETS, EVERYTHING) for li in Listing}
    | {(r, Listing.EXACT) for r in (OFF, PRIVATE, METADATA)},
    K.PRIVATE: {(r, li) for r in (PRIVATE, ALL_NETS, EVERYTHING) for li in Listing}
    | {(r, Listing.EXACT) for r in (OFF, LOOPBACK, METADATA)},
    K.LINK_LOCAL: {(r, li) for r in (PRIVATE, ALL_NETS, EVERYTHING) for li in Listing}
    | {(r, Listing.EXACT) for r in (OFF, LOOPBACK, METADATA)},
    K.METADATA: set(),  # depends on the address's own range: see test_metadata_needs_its_own_opt_in
    K.RESERVED: set(),
}


@pytest.mark.parametrize(("address", "kind"), [c for c in CASES if c[1] is not K.METADATA])
def test_permitted(address: str, kind: AddressKind) -> None:
    ip = ipaddress.ip_address(address)
    for rules in (OFF, LOOPBACK, PRIVATE, ALL_NETS, METADATA, EVERYTHING):
        for listing in Listing:
            assert permitted(ip, rules, listing) is ((rules, listing) in PASSES[kind]), (rules, listing)


def test_defaults_refuse_everything_but_listed_public_servers() -> None:
    for address, kind in CASES:
        ip = ipaddress.ip_address(address)
        assert not permitted(ip, EgressRules(), Listing.NONE), address
        assert permitted(ip, EgressRules(), Listing.WILDCARD) is (kind is K.PUBLIC), address


@pytest.mark.parametrize("address", CLASSIFIED[K.METADATA])
def test_metadata_needs_its_own_opt_in(address: str) -> None:
    ip = ipaddress.ip_address(address)
    for rules in (OFF, LOOPBACK, PRIVATE, ALL_NETS):
        for listing in Listing:
            assert not permitted(ip, rules, listing), (rules, listing)
    # with the opt-in it is judged as the range it sits in: an exact entry, or that range opened
    assert permitted(ip, METADATA, Listing.EXACT)
    assert permitted(ip, EVERYTHING, Listing.EXACT)
    public = address == "168.63.129.16"
    assert permitted(ip, METADATA, Listing.WILDCARD) is public
    assert permitted(ip, EVERYTHING, Listing.WILDCARD)
    assert permitted(ip, EVERYTHING, Listing.NONE) is not public


@pytest.mark.parametrize("address", CLASSIFIED[K.RESERVED])
def test_reserved_never_passes(address: str) -> None:
    assert not permitted(ipaddress.ip_address(address), EVERYTHING, Listing.EXACT)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0177.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("::ffff:7f00:1", "::ffff:127.0.0.1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("fe80::1%25eth0", "fe80::1"),
        ("0", "0.0.0.0"),
        ("0x0", "0.0.0.0"),
        ("10.1", "10.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("4294967295", "255.255.255.255"),
        # names: left to the resolver, whose answers are checked in turn
        ("localhost", None),
        ("mcp.example.com", None),
        ("1.2.3.4.5", None),
        ("256.0.0.1", None),
        ("1.16777216", None),
        ("4294967296", None),
        ("08.0.0.1", None),
        ("0x", None),
        ("0x7f_000001", None),
        ("1e3", None),
        ("", None),
        ("[::1", None),
        ("::g", None),
    ],
)
def test_parse_ip(host: str, expected: str | None) -> None:
    ip = parse_ip(host)
    assert (None if ip is None else ipaddress.ip_address(expected or "0.0.0.0")) == ip
    if expected is not None:
        assert ip is not None and classify(ip) is classify(ipaddress.ip_address(expected))


@pytest.mark.parametrize(
    "host", ["127.1", "0x7f000001", "2130706433", "0177.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "0", "0x7f.1"]
)
def test_loopback_spellings_are_refused_by_default(host: str) -> None:
    ip = parse_ip(host)
    assert ip is not None
    assert not permitted(ip, EgressRules(), Listing.NONE)
    assert not permitted(ip, EgressRules(allow_private_networks=True), Listing.WILDCARD)
