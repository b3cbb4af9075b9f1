"""The servers a ``Wire`` may connect to: the ones its URL lists (``nats://a:4222,nats://b:4222``)
and the rest of the cluster, learnt from the servers' INFO (``connect_urls``).

Each attempt goes to the next server in turn (the one just lost last), and a server is not tried
again within ``reconnect_time_wait`` of its previous attempt: a round of dead servers costs one
wait, a single server is retried at that pace. The order is shuffled at start (as nats-py does,
so a fleet spreads over the cluster) unless ``dont_randomize``."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

DEFAULT_PORT = 4222
SCHEMES = ("nats", "tls")


@dataclass(eq=False)
class Server:
    """One server: where it is and the credentials its URL carries, if any."""

    scheme: str  # "nats" or "tls" (TLS required)
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None  # nats://TOKEN@host
    tls_name: str | None = None  # the name to verify for a server learnt by IP from a named one
    discovered: bool = False  # learnt from INFO, not given
    last_attempt: float = field(default=float("-inf"))

    @property
    def label(self) -> str:
        """Its URL without credentials (for errors and logs)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


def parse_server(url: str) -> Server:
    """``nats://[user:password@|token@]host[:port]``, ``tls://…``, or a bare ``host:port``."""
    url = url.strip()
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in SCHEMES:
        raise ValueError(f"a NATS server URL is nats:// or tls://, not {parts.scheme}:// ({parts.hostname})")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"a bad port in the NATS server URL for {parts.hostname}") from exc
    server = Server(parts.scheme, parts.hostname or "127.0.0.1", port)
    if parts.username is not None and parts.password is not None:
        server.user, server.password = unquote(parts.username), unquote(parts.password)
    elif parts.username:
        server.token = unquote(parts.username)
    return server


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ServerPool:
    """The servers in the order they are tried; ``current`` is the one connected (or last tried)."""

    def __init__(self, urls: list[str], *, randomize: bool = True) -> None:
        self.servers = [parse_server(url) for url in urls]
        if not self.servers:
            raise ValueError("no NATS server given")
        self.randomize = randomize
        if randomize:
            random.shuffle(self.servers)
        self.current: Server | None = None

    def round(self) -> list[Server]:
        """Every server once, starting after the current one (which comes last)."""
        servers = self.servers
        if self.current not in servers:
            return list(servers)
        at = servers.index(self.current) + 1
        return servers[at:] + servers[:at]

    def has_others(self) -> bool:
        return any(server is not self.current for server in self.servers)

    def learn(self, connect_urls: list[str], tls_required: bool) -> list[Server]:
        """Add the servers in an INFO's ``connect_urls`` (``host:port`` each) not known yet, and
        drop learnt ones the cluster no longer lists (the current one stays): the ones added."""
        via = self.current
        scheme = via.scheme if via is not None else "nats"
        listed = set()
        added: list[Server] = []
        for address in connect_urls:
            try:
                server = parse_server(f"{scheme}://{address}")
            except ValueError:
                continue
            listed.add(server.address)
            if any(known.address == server.address for known in self.servers):
                continue
            server.discovered = True
            if tls_required and via is not None and is_ip(server.host) and not is_ip(via.host):
                server.tls_name = via.tls_name or via.host  # a certificate names hosts, not addresses
            added.append(server)
        if self.randomize:
            random.shuffle(added)
        self.servers = [s for s in self.servers if not s.discovered or s.address in listed or s is self.current] + added
        return added
