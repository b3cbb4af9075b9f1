"""How a server URL's host becomes addresses, and which of them a ``ServerPolicy`` lets the tools
service connect to: literals read without a lookup, every answer of a name checked (one bad
answer refuses the name), unlisted servers refused before any lookup, exact entries vouching
for their own addresses but never for metadata ones, built-in tool servers as exact entries.

Names go through a fake resolver (the real one only reads numeric hosts): no test sends
anything to a private, link-local or metadata address (nor anywhere else)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from services.tools.egress import EgressRules, Listing, Refused, resolve_host, system_resolver
from services.tools.policy import PolicyError, ServerPolicy
from tests.tools.fakes import FakeResolver


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
