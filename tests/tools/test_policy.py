"""The outbound allowlist: how server URLs match it, which requests are malformed on their
face, and what happens to caller headers. (Addresses: test_egress.py.)"""

from __future__ import annotations

import pytest

from contracts.messages.tools import McpServer
from services.tools.egress import EgressRules, Listing
from services.tools.policy import PolicyError, ServerPolicy, origin


def policy(*allowed: str, loopback: bool = True, builtins: dict[str, str] | None = None) -> ServerPolicy:
    rules = EgressRules(allow_loopback=loopback)
    return ServerPolicy(list(allowed), builtins or {}, rules=rules, max_header_bytes=1024)


def server(url: str, **headers: str) -> McpServer:
    return McpServer(server_label="s", server_url=url, headers=headers)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/mcp",
        "http://localhost/mcp",
        "https://[::1]:9/x",
        "HTTP://LOCALHOST:1/sse",
        "http://example.com/mcp",
        "https://10.0.0.1/mcp",
    ],
)
def test_well_formed_urls_are_decided_when_connecting(url: str) -> None:
    """Whether a destination is allowed depends on where its name points: never a 400."""
    for p in (policy(), policy(loopback=False)):
        assert p.resolve(server(url)).server_url == url
        assert p.listing(url) is Listing.NONE


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.com/mcp", "http://example.com:80"),
        ("https://Example.COM/mcp", "https://example.com:443"),
        ("https://example.com:8443/x?y", "https://example.com:8443"),
        ("http://[::1]:9/x", "http://[::1]:9"),
        ("http://127.0.0.1/x", "http://127.0.0.1:80"),
    ],
)
def test_origin(url: str, expected: str) -> None:
    assert origin(url) == expected


@pytest.mark.parametrize(
    ("entry", "url", "allowed"),
    [
        ("mcp.example.com", "https://mcp.example.com/mcp", True),
        ("mcp.example.com", "http://MCP.example.com:8080/anything", True),
        ("mcp.example.com", "https://mcp.example.com.evil.com/mcp", False),
        ("mcp.example.com", "https://evil.com/mcp.example.com", False),
        ("mcp.example.com:8443", "https://mcp.example.com:8443/mcp", True),
        ("mcp.example.com:8443", "https://mcp.example.com/mcp", False),
        ("*.example.com", "https://a.b.example.com/mcp", True),
        ("*.example.com", "https://example.com/mcp", False),
        ("*.example.com", "https://badexample.com/mcp", False),
        ("https://tools.example.com/v1/", "https://tools.example.com/v1/mcp", True),
        ("https://tools.example.com/v1", "https://tools.example.com/v1", True),
        ("https://tools.example.com/v1", "https://tools.example.com/v10/mcp", False),
        ("https://tools.example.com/v1/", "https://tools.example.com/v1/../admin", False),
        ("https://tools.example.com/v1/", "https://tools.example.com/v1/%2e%2e/admin", False),
        ("https://tools.example.com/v1/", "http://tools.example.com/v1/mcp", False),
        ("https://tools.example.com/v1/", "https://tools.example.com:8443/v1/mcp", False),
        ("https://tools.example.com/", "https://tools.example.com:443/x", True),
        ("10.1.2.3:9000", "http://10.1.2.3:9000/mcp", True),
        ("[fd00::1]:9000", "http://[fd00::1]:9000/mcp", True),
    ],
)
def test_allowlist_entries(entry: str, url: str, allowed: bool) -> None:
    listing = policy(entry, loopback=False).listing(url)
    assert (listing is not Listing.NONE) is allowed


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1/mcp", "absolute http"),
        ("/relative/mcp", "absolute http"),
        ("http://user:secret@127.0.0.1/mcp", "credentials"),
        ("http://[::1/mcp", "not a valid URL"),
    ],
)
def test_malformed_urls(url: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policy().resolve(server(url))
    with pytest.raises(PolicyError, match=message):
        policy().listing(url)


def test_builtins_resolve_and_are_allowed() -> None:
    p = policy(loopback=False, builtins={"browser": "http://browser.internal:8080/mcp"})
    resolved = p.resolve(McpServer.builtin("browser"))
    assert resolved.server_url == "http://browser.internal:8080/mcp"
    assert resolved.server_label == "browser"
    assert p.builtin("browser") == McpServer(server_label="browser", server_url="http://browser.internal:8080/mcp")
    # the configured URL is an exact entry when named directly too
    assert p.listing("http://browser.internal:8080/mcp/") is Listing.EXACT
    assert p.listing("http://browser.internal:8081/mcp/") is Listing.NONE
    with pytest.raises(PolicyError, match="Unknown built-in tool server 'python'.*browser"):
        p.resolve(McpServer.builtin("python"))


def test_headers_are_checked_and_transport_headers_dropped() -> None:
    resolved = policy().resolve(
        server(
            "http://127.0.0.1/mcp",
            Authorization="Bearer t",
            **{"X-Api-Key": "k", "Host": "evil", "Mcp-Session-Id": "s"},
        )
    )
    assert resolved.headers == {"Authorization": "Bearer t", "X-Api-Key": "k"}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Bad Name": "v"}, "not a valid HTTP header name"),
        ({"X-A": "v\r\nInjected: 1"}, "line break"),
        ({"X-A": "v" * 2000}, "too large"),
    ],
)
def test_bad_headers(headers: dict[str, str], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policy().resolve(server("http://127.0.0.1/mcp", **headers))


@pytest.mark.parametrize("entry", ["ftp://x/", "bad host name!", "https:///nohost", "fd00::zz"])
def test_bad_allowlist_entries_fail_at_start_up(entry: str) -> None:
    with pytest.raises(ValueError):
        policy(entry)
