"""Which addresses the tools service may connect to, and how hosts become addresses.

Everything here is pure or uses a fake resolver: no test sends anything to a private,
link-local or metadata address (nor anywhere else)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from services.tools.egress import (
    AddressKind,
    EgressRules,
    Listing,
    Refused,
    classify,
    parse_ip,
    permitted,
    resolve_host,
    system_resolver,
)
from services.tools.policy import PolicyError, ServerPolicy
from tests.tools.fakes import FakeResolver

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


async def test_literals_are_not_looked_up() -> None:
    resolver = FakeResolver()
    for host, expected in [("127.1", "127.0.0.1"), ("::1", "::1"), ("0x0a000001", "10.0.0.1")]:
        assert await resolve_host(host, 80, resolver, 1) == [ipaddress.ip_address(expected)]
    assert resolver.lookups == []


async def test_resolution_keeps_every_answer_once() -> None:
    resolver = FakeResolver({"mcp.test": ["127.0.0.1", "::1", "127.0.0.1", "127.0.0.2"]})
    found = await resolve_host("mcp.test", 8080, resolver, 1)
    assert [str(a) for a in found] == ["127.0.0.1", "::1", "127.0.0.2"]
    assert resolver.lookups == [("mcp.test", 8080)]


async def test_resolution_failures_are_os_errors() -> None:
    resolver = FakeResolver({"empty.test": []})
    with pytest.raises(OSError, match="no address"):
        await resolve_host("empty.test", 80, resolver, 1)
    with pytest.raises(OSError, match="not known"):
        await resolve_host("unknown.test", 80, resolver, 1)
    resolver.hold = asyncio.Event()  # never set: the lookup hangs
    with pytest.raises(OSError, match="longer than 0.05s"):
        await resolve_host("empty.test", 80, resolver, 0.05)


def policy(*allowed: str, builtins: dict[str, str] | None = None, **rules: bool) -> ServerPolicy:
    return ServerPolicy(list(allowed), builtins or {}, rules=EgressRules(**rules), max_header_bytes=1024)


async def test_unlisted_servers_are_refused_without_a_lookup() -> None:
    resolver = FakeResolver({"mcp.test": ["8.8.8.8"]})
    for url in ["http://mcp.test/mcp", "http://127.0.0.1:9/mcp", "http://localhost/mcp"]:
        with pytest.raises(Refused, match="matches no allowed_servers entry"):
            await policy().addresses(url, resolver, 1)
    assert resolver.lookups == []


async def test_a_name_resolving_to_loopback_is_refused_unless_loopback_is_allowed() -> None:
    resolver = FakeResolver({"evil.example.com": ["127.0.0.1"], "localhost": ["127.0.0.1", "::1"]})
    for p in (policy("*.example.com"), policy("*.example.com", allow_private_networks=True)):
        with pytest.raises(Refused, match=r"127\.0\.0\.1 \(loopback\)"):
            await p.addresses("http://evil.example.com:6379/", resolver, 1)
    allowed = policy("*.example.com", allow_loopback=True)
    assert [str(a) for a in await allowed.addresses("http://evil.example.com/", resolver, 1)] == ["127.0.0.1"]
    # the way `chorus up` on 127.0.0.1 runs: any loopback server, nothing else
    dev = policy(allow_loopback=True)
    assert [str(a) for a in await dev.addresses("http://localhost:1234/mcp", resolver, 1)] == ["127.0.0.1", "::1"]
    with pytest.raises(Refused):
        await dev.addresses("http://evil.example.com/", FakeResolver({"evil.example.com": ["8.8.8.8"]}), 1)


async def test_one_bad_answer_refuses_the_name() -> None:
    resolver = FakeResolver(
        {
            "mixed.example.com": ["93.184.216.34", "10.0.0.5"],
            "public.example.com": ["93.184.216.34", "2606:4700::1"],
            "sneaky.example.com": ["93.184.216.34", "::ffff:127.0.0.1"],
        }
    )
    wildcard = policy("*.example.com")
    with pytest.raises(Refused, match=r"10\.0\.0\.5 \(private\)") as refused:
        await wildcard.addresses("https://mixed.example.com/mcp", resolver, 1)
    assert "93.184.216.34" not in str(refused.value)  # the log names the offending address
    with pytest.raises(Refused, match="loopback"):
        await wildcard.addresses("https://sneaky.example.com/mcp", resolver, 1)
    assert len(await wildcard.addresses("https://public.example.com/mcp", resolver, 1)) == 2
    # unlisted, with private networks open: the public answer is what refuses it
    with pytest.raises(Refused, match=r"93\.184\.216\.34 \(public\)"):
        await policy(allow_private_networks=True).addresses("https://mixed.example.com/mcp", resolver, 1)
    assert (
        len(
            await policy("*.example.com", allow_private_networks=True).addresses(
                "https://mixed.example.com/mcp", resolver, 1
            )
        )
        == 2
    )


async def test_exact_entries_vouch_for_their_addresses_but_not_for_metadata() -> None:
    resolver = FakeResolver(
        {"mcp.internal": ["10.0.0.5"], "meta.internal": ["169.254.169.254"], "meta6.internal": ["fd00:ec2::254"]}
    )
    entries = (
        "mcp.internal",
        "meta.internal:80",
        "https://meta6.internal/",
        "10.1.2.3:9000",
        "169.254.169.254",
        "[fd00::1]:9000",
    )
    p = policy(*entries)
    assert [str(a) for a in await p.addresses("http://mcp.internal/mcp", resolver, 1)] == ["10.0.0.5"]
    assert [str(a) for a in await p.addresses("http://10.1.2.3:9000/mcp", resolver, 1)] == ["10.1.2.3"]
    assert [str(a) for a in await p.addresses("http://[fd00::1]:9000/mcp", resolver, 1)] == ["fd00::1"]
    for url in ["http://meta.internal/latest", "https://meta6.internal/x", "http://169.254.169.254/latest"]:
        with pytest.raises(Refused, match="metadata"):
            await p.addresses(url, resolver, 1)
    for url in ["http://[::ffff:169.254.169.254]/", "http://2852039166/"]:  # other spellings: unlisted
        with pytest.raises(Refused, match="matches no"):
            await p.addresses(url, resolver, 1)
        with pytest.raises(Refused, match="metadata"):
            await policy(*entries, allow_private_networks=True).addresses(url, resolver, 1)
    # a port or scheme the entry does not name is unlisted
    with pytest.raises(Refused, match="matches no"):
        await p.addresses("http://10.1.2.3:9001/mcp", resolver, 1)
    opted_in = policy(*entries, allow_metadata_addresses=True)
    assert [str(a) for a in await opted_in.addresses("http://meta.internal/x", resolver, 1)] == ["169.254.169.254"]
    assert await opted_in.addresses("http://169.254.169.254/latest", resolver, 1)


async def test_builtin_tool_servers_are_exact_entries() -> None:
    resolver = FakeResolver({"browser": ["172.18.0.4"]})
    p = policy(builtins={"browser": "http://browser:8080/mcp"})
    assert p.listing("http://browser:8080/mcp") is Listing.EXACT
    assert [str(a) for a in await p.addresses("http://browser:8080/mcp", resolver, 1)] == ["172.18.0.4"]
    with pytest.raises(Refused):  # the same host on another port is not the built-in
        await p.addresses("http://browser:6379/", resolver, 1)


@pytest.mark.parametrize(
    ("entries", "url", "listing"),
    [
        (("mcp.example.com",), "https://mcp.example.com/mcp", Listing.EXACT),
        (("*.example.com",), "https://a.example.com/mcp", Listing.WILDCARD),
        (("*.example.com", "a.example.com"), "https://a.example.com/mcp", Listing.EXACT),
        (("a.example.com", "*.example.com"), "https://a.example.com/mcp", Listing.EXACT),
        (("https://tools.example.com/v1/",), "https://tools.example.com/v1/mcp", Listing.EXACT),
        (("https://tools.example.com/v1/",), "https://tools.example.com/v2/mcp", Listing.NONE),
        (("*.example.com",), "https://example.com/mcp", Listing.NONE),
    ],
)
def test_listing(entries: tuple[str, ...], url: str, listing: Listing) -> None:
    assert policy(*entries).listing(url) is listing


async def test_malformed_numeric_hosts_are_caller_mistakes() -> None:
    with pytest.raises(PolicyError, match="not a valid URL"):
        await policy(allow_loopback=True).addresses("http://127.000.000.001/", FakeResolver(), 1)


async def test_the_system_resolver_reads_numeric_hosts() -> None:
    """The real getaddrinfo path, with hosts that need no lookup."""
    assert await system_resolver("127.0.0.1", 80) == [ipaddress.ip_address("127.0.0.1")]
    assert set(await system_resolver("::1", 80)) == {ipaddress.ip_address("::1")}
