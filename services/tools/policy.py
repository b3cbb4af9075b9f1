"""Which MCP servers the tools service may connect to, and which caller headers it sends.

``server_url`` comes from API callers and Chorus connects out to it. Two checks guard it:

- here, before anything else: the URL is well formed (absolute http(s), no credentials), the
  headers are sane, built-ins exist. A failure is the caller's mistake (``PolicyError``, a 400)
  and depends on the request's text alone, never on the network.
- ``ServerPolicy.addresses``, when a session is opened: how the URL matches the allowlist
  (``CHORUS_ALLOWED_SERVERS`` entries and the built-in tool servers: exact or wildcard), then
  every address its host resolves to is checked (see ``egress`` for the rules). A refusal
  (``egress.Refused``) is reported to the caller exactly like an unreachable server.

URLs are parsed with httpx2, the parser the MCP transports use, so the check and the
connection see the same host; the connection goes to a checked address (``mcp_client``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import httpx2

from contracts.messages.tools import BUILTIN_URL_SCHEME, McpServer
from services.tools.egress import EgressRules, IPAddress, Listing, Refused, Resolver, check_addresses, resolve_host

_SCHEMES = ("http", "https")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# headers the MCP transport owns, or that would change how the request travels
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    }
)
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_ENCODED_SEPARATORS = re.compile(rb"%(2e|2f|5c)", re.IGNORECASE)


class PolicyError(ValueError):
    """The caller asked for a server (or headers) this deployment does not allow."""


@dataclass(frozen=True)
class _Prefix:
    scheme: str
    host: str
    port: int
    path: bytes  # without a trailing slash

    def matches(self, scheme: str, host: str, port: int, path: bytes) -> bool:
        if (scheme, host, port) != (self.scheme, self.host, self.port):
            return False
        if not self.path:
            return True
        # a segment boundary, and no encoded dot / slash that a server might decode past it
        inside = path == self.path or path.startswith(self.path + b"/")
        return inside and not _ENCODED_SEPARATORS.search(path)


@dataclass(frozen=True)
class _Host:
    host: str  # exact name, or ".example.com" for "*.example.com"
    port: int | None

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.wildcard:
            return host.endswith(self.host)
        return host == self.host

    @property
    def wildcard(self) -> bool:
        return self.host.startswith(".")


def _port(url: httpx2.URL) -> int:
    return url.port if url.port is not None else _DEFAULT_PORTS[url.scheme]


def _path(url: httpx2.URL) -> bytes:
    return url.raw_path.split(b"?", 1)[0]


def origin(url: str) -> str:
    """``scheme://host:port`` of a URL that ``ServerPolicy.resolve`` accepted: one server."""
    parsed = httpx2.URL(url)
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{parsed.scheme}://{host}:{_port(parsed)}"


def _parse_url(url: str) -> httpx2.URL:
    try:
        parsed = httpx2.URL(url)
    except Exception as exc:  # httpx2 raises InvalidURL, and TypeError for some inputs
        raise PolicyError(f"MCP server_url {url!r} is not a valid URL") from exc
    if parsed.scheme not in _SCHEMES or not parsed.host:
        raise PolicyError(f"MCP server_url {url!r} must be an absolute http(s) URL")
    if parsed.userinfo:
        raise PolicyError("MCP server_url must not carry credentials; send them as headers")
    return parsed


_HOST_ENTRY = re.compile(r"^(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::(?P<port>\d+))?$")


def _parse_entry(entry: str) -> _Prefix | _Host:
    """``https://host[:port]/path`` (a URL prefix), ``host``, ``host:port``, ``*.domain``,
    ``[v6]:port``; host names are compared lower-case."""
    entry = entry.strip()
    if "://" in entry:
        url = httpx2.URL(entry)
        if url.scheme not in _SCHEMES or not url.host:
            raise ValueError(f"allowed_servers entry {entry!r} must be an http(s) URL or a host")
        return _Prefix(url.scheme, url.host, _port(url), _path(url).rstrip(b"/"))
    entry = entry.lower()
    wildcard = entry.startswith("*.")
    match = _HOST_ENTRY.match(entry.removeprefix("*.") if wildcard else entry)
    if match is None:
        try:  # a bare IPv6 address
            return _Host(str(ipaddress.IPv6Address(entry)), None)
        except ValueError:
            raise ValueError(f"allowed_servers entry {entry!r} is neither a URL nor a host") from None
    host = match["v6"] or match["name"]
    port = int(match["port"]) if match["port"] else None
    return _Host(f".{host}" if wildcard else host, port)


class ServerPolicy:
    """The allowlist, the address rules and the built-in servers, built once from settings."""

    def __init__(
        self, allowed_servers: list[str], builtin_tools: dict[str, str], *, rules: EgressRules, max_header_bytes: int
    ) -> None:
        self._builtins = dict(builtin_tools)
        entries = [*allowed_servers, *builtin_tools.values()]
        self._entries = [_parse_entry(e) for e in entries if e.strip()]
        self.rules = rules
        self._max_header_bytes = max_header_bytes

    def builtin(self, name: str) -> McpServer:
        """The configured server behind built-in tool ``name``, with its real URL."""
        url = self._builtins.get(name)
        if url is None:
            known = ", ".join(sorted(self._builtins)) or "none"
            raise PolicyError(f"Unknown built-in tool server {name!r} (configured: {known})")
        return McpServer(server_label=name, server_url=url)

    def resolve(self, server: McpServer) -> McpServer:
        """The server to connect to: built-ins resolved, URL well formed, headers checked and
        stripped of those the transport owns. Raises ``PolicyError`` otherwise. Whether the
        destination is allowed is decided when connecting (``addresses``)."""
        if server.server_url.startswith(BUILTIN_URL_SCHEME):
            url = self.builtin(server.server_url.removeprefix(BUILTIN_URL_SCHEME)).server_url
        else:
            url = server.server_url
            _parse_url(url)
        headers = self.check_headers(server.headers)
        return server.model_copy(update={"server_url": url, "headers": headers})

    def listing(self, url: str) -> Listing:
        """How ``url`` matches the allowlist: an exact entry wins over a wildcard."""
        parsed = _parse_url(url)
        scheme, host, port, path = parsed.scheme, parsed.host, _port(parsed), _path(parsed)
        found = Listing.NONE
        for entry in self._entries:
            if isinstance(entry, _Prefix):
                if entry.matches(scheme, host, port, path):
                    return Listing.EXACT
            elif entry.matches(host, port):
                if not entry.wildcard:
                    return Listing.EXACT
                found = Listing.WILDCARD
        return found

    async def addresses(self, url: str, resolve: Resolver, timeout_s: float) -> list[IPAddress]:
        """The checked addresses to connect to for ``url``, in the resolver's order. Raises
        ``Refused`` when any is not permitted, ``OSError`` when the host does not resolve.
        A URL outside the allowlist is refused without a lookup when no address could pass."""
        parsed = _parse_url(url)
        listing = self.listing(url)
        if listing is Listing.NONE and not self.rules.opens_unlisted():
            raise Refused(f"{parsed.host!r} matches no allowed_servers entry")
        found = await resolve_host(parsed.host, _port(parsed), resolve, timeout_s)
        check_addresses(parsed.host, found, self.rules, listing)
        return found

    def check_headers(self, headers: dict[str, str]) -> dict[str, str]:
        size = 0
        kept: dict[str, str] = {}
        for name, value in headers.items():
            if not _TOKEN.match(name):
                raise PolicyError(f"MCP header name {name!r} is not a valid HTTP header name")
            if any(c in value for c in "\r\n\0"):
                raise PolicyError(f"MCP header {name!r} has a line break or NUL in its value")
            size += len(name) + len(value.encode())
            if name.lower() not in _RESERVED_HEADERS:
                kept[name] = value
        if size > self._max_header_bytes:
            raise PolicyError(f"MCP headers are too large ({size} bytes, at most {self._max_header_bytes})")
        return kept
