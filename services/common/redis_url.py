"""One way to reach Redis: the client built from a URL, plain or through Sentinel.

    redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]                 one server (rediss:// over TLS)
    redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]
    rediss+sentinel://...                                      the same over TLS (sentinels too)

A Sentinel URL names the sentinels (port 26379 unless given) and the service they monitor; its
password is the primary's (and its replicas'); the sentinels' own, if they require one, comes
from ``RedisOptions.sentinel_password``. The client is redis-py's
``redis.asyncio.sentinel.Sentinel(...).master_for(SERVICE)``: each new connection asks the
sentinels where the primary is, so after a failover a reconnect reaches the new one.

``check_redis`` is the start-up check (blocking, every step bounded by a timeout): it raises
``RedisConfigError``, one line saying which part is wrong, for what cannot work (no sentinel
answers, no sentinel knows the service, a refused password) and returns warnings for what may
mend itself (the primary not answering yet, fewer replicas than writes wait for)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.retry import Retry

from services.common.urls import redact

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
SENTINEL_PORT = 26379
SENTINEL_TIMEOUT_S = 1.0  # a sentinel answers at once or is counted as not answering
TLS_PARAMS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile")
SENTINEL_DEFAULTS = (1, 15.0)  # min replicas, failover window (s) when the URL names sentinels


class RedisConfigError(RuntimeError):
    """The Redis configuration cannot work (its message is one line saying which part)."""


@dataclass(frozen=True)
class RedisOptions:
    """What the URL does not say. ``None``: the default for the URL's kind (``SENTINEL_DEFAULTS``
    with Sentinel; no replica waited for and no retry window of ours for a plain URL)."""

    password: str | None = None  # the primary's, when the URL carries none
    sentinel_password: str | None = None
    min_replicas: int | None = None  # a write is acknowledged once this many replicas have it
    wait_ms: int = 500  # how long a write waits for them
    failover_s: float | None = None  # how long an operation is retried through a failover
    connect_timeout_s: float = 2.0
    socket_timeout_s: float = 5.0

    def replicas_for(self, target: RedisTarget) -> int:
        if self.min_replicas is not None:
            return max(0, self.min_replicas)
        return SENTINEL_DEFAULTS[0] if target.sentinel else 0

    def failover_for(self, target: RedisTarget) -> float:
        if self.failover_s is not None:
            return max(0.0, self.failover_s)
        return SENTINEL_DEFAULTS[1] if target.sentinel else 0.0


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()  # empty: a plain URL
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_params: tuple[tuple[str, str], ...] = ()

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    def where(self) -> str:
        """The target as a person reads it (no password)."""
        if not self.sentinel:
            return redact(self.url)
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"primary {self.service!r} of the sentinels {hosts}"


def _host_port(spec: str, url: str) -> tuple[str, int]:
    if spec.startswith("["):  # [IPv6]:port
        host, _, rest = spec[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = spec.partition(":")
    if not host:
        raise RedisConfigError(f"Redis URL {redact(url)}: an empty sentinel address in the list")
    if not port:
        return host, SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisConfigError(f"Redis URL {redact(url)}: {spec!r} is not HOST:PORT")
    return host, int(port)


def parse_redis_url(url: str) -> RedisTarget:
    """The target of ``url`` (``RedisConfigError`` when it is not one of the forms above)."""
    scheme = url.partition("://")[0].lower()
    if scheme not in SENTINEL_SCHEMES:
        if scheme not in ("redis", "rediss", "unix"):
            raise RedisConfigError(
                f"Redis URL {redact(url)}: not a Redis URL (redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://)"
            )
        return RedisTarget(url=url, password=unquote(urlsplit(url).password or "") or None, tls=scheme == "rediss")
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_port(spec.strip(), url) for spec in hosts.split(",") if spec.strip())
    if not sentinels:
        raise RedisConfigError(f"Redis URL {redact(url)}: no sentinel address (redis+sentinel://HOST:PORT,.../SERVICE)")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise RedisConfigError(f"Redis URL {redact(url)}: the path must be /SERVICE_NAME or /SERVICE_NAME/DB")
    if len(parts) == 2 and not parts[1].isdigit():
        raise RedisConfigError(f"Redis URL {redact(url)}: the database {parts[1]!r} is not a number")
    params = tuple(parse_qsl(query))
    unknown = [k for k, _ in params if k not in TLS_PARAMS]
    if unknown:
        raise RedisConfigError(
            f"Redis URL {redact(url)}: unknown parameter(s) {', '.join(unknown)} (known: {TLS_PARAMS})"
        )
    return RedisTarget(
        url=url,
        sentinels=sentinels,
        service=unquote(parts[0]),
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=username,
        password=password,
        tls=SENTINEL_SCHEMES[scheme],
        tls_params=params,
    )


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _tls_kwargs(target: RedisTarget) -> dict[str, Any]:
    return {"ssl": True, **dict(target.tls_params)} if target.tls else {}


def _sentinel_kwargs(target: RedisTarget, options: RedisOptions) -> dict[str, Any]:
    return {
        "password": options.sentinel_password,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "retry": _no_retry(),
        **_tls_kwargs(target),
    }


def redis_client(url: str, options: RedisOptions | None = None) -> aioredis.Redis:
    """The asyncio client for ``url`` (bytes in, bytes out). With a retry window of ours
    (``RedisOptions.failover_for``) redis-py retries nothing itself: whoever holds the window
    decides what is retried (a write that may have been applied is not simply sent again)."""
    options = options or RedisOptions()
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "decode_responses": False,
        "health_check_interval": 5,
        "socket_connect_timeout": options.connect_timeout_s,
        "socket_timeout": options.socket_timeout_s,
    }
    if options.failover_for(target) > 0:
        common["retry"] = _no_retry()
    if not target.sentinel:
        if target.password is None and options.password:
            common["password"] = options.password
        return aioredis.from_url(url, **common)
    sentinel_of: Callable[..., Any] = Sentinel  # untyped in redis-py
    sentinel = sentinel_of(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target, options))
    client: aioredis.Redis = sentinel.master_for(
        target.service,
        redis_class=aioredis.Redis,
        db=target.db,
        username=target.username,
        password=target.password or options.password,
        **common,
        **_tls_kwargs(target),
    )
    return client


async def close_redis(client: aioredis.Redis) -> None:
    """Close ``client`` and, for a Sentinel client, its connections to the sentinels."""
    await client.aclose()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


# -- the start-up check ---------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _sync(target: RedisTarget, host: str, port: int, timeout: float, password: str | None, **kw: Any) -> redis.Redis:
    return redis.Redis(
        host=host,
        port=port,
        password=password,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=_no_retry(),
        **_tls_kwargs(target),
        **kw,
    )


def _ask_sentinel(target: RedisTarget, host: str, port: int, options: RedisOptions) -> tuple[str, int] | str | None:
    """The primary this sentinel names for the service; None: it knows no such service; a
    string: why it did not answer."""
    client = _sync(target, host, port, SENTINEL_TIMEOUT_S, options.sentinel_password)
    try:
        got: Any = client.sentinel_get_master_addr_by_name(target.service)
    except AuthenticationError as exc:
        hint = "wrong" if options.sentinel_password else "missing (set CHORUS_REDIS_SENTINEL_PASSWORD)"
        return f"refused the sentinel password, {hint}: {_one_line(exc)}"
    except ResponseError as exc:
        return f"is not a sentinel ({_one_line(exc)})"
    except RedisError as exc:
        return f"does not answer ({_one_line(exc)})"
    finally:
        client.close()
    if not got:
        return None
    addr_host, addr_port = got
    return (addr_host.decode() if isinstance(addr_host, bytes) else str(addr_host)), int(addr_port)


def _known_services(target: RedisTarget, host: str, port: int, options: RedisOptions) -> list[str]:
    client = _sync(target, host, port, SENTINEL_TIMEOUT_S, options.sentinel_password)
    try:
        return sorted(str(name) for name in client.sentinel_masters())
    except RedisError:
        return []
    finally:
        client.close()


def _find_primary(target: RedisTarget, options: RedisOptions) -> tuple[str, int]:
    failures: list[str] = []
    unaware: list[str] = []
    for host, port in target.sentinels:
        got = _ask_sentinel(target, host, port, options)
        if isinstance(got, tuple):
            return got
        if got is None:
            unaware.append(f"{host}:{port}")
        else:
            failures.append(f"{host}:{port} {got}")
    if unaware:
        first, number = unaware[0].rsplit(":", 1)
        known = _known_services(target, first, int(number), options)
        monitored = f"they monitor: {', '.join(known)}" if known else "they monitor no primary"
        raise RedisConfigError(
            f"Redis Sentinel: no sentinel names a primary for the service {target.service!r} "
            f"(asked {', '.join(unaware)}; {monitored}): check the service name in CHORUS_REDIS_URL"
        )
    if all("refused the sentinel password" in f for f in failures):
        raise RedisConfigError(f"Redis Sentinel: the sentinels refused this client: {'; '.join(failures)}")
    raise RedisConfigError(f"Redis Sentinel: none of the sentinels answers: {'; '.join(failures)}")


def _check_primary(client: redis.Redis, what: str, target: RedisTarget, options: RedisOptions) -> list[str]:
    """Warnings about the primary ``client`` reaches (``RedisConfigError`` when it refuses us)."""
    password = target.password or options.password
    try:
        client.ping()
        info: Any = client.info("replication")
    except AuthenticationError as exc:
        hint = "refused the password (the URL's or CHORUS_REDIS_PASSWORD)" if password else "needs a password"
        raise RedisConfigError(f"Redis: {what} {hint}: {_one_line(exc)}") from None
    except RedisError as exc:
        return [f"{what} does not answer yet ({_one_line(exc)}); storage is unavailable until it does"]
    finally:
        client.close()
    needed = options.replicas_for(target)
    have = int(info.get("connected_slaves", 0))
    if have < needed:
        return [
            f"{what} has {have} replica(s) connected; writes wait for {needed} (CHORUS_REDIS_MIN_REPLICAS) "
            "and are refused as storage unavailable until enough replicas follow it"
        ]
    return []


def check_redis(url: str, options: RedisOptions | None = None) -> list[str]:
    """Can a client of ``url`` work? Raises ``RedisConfigError`` (one line) when it cannot:
    a malformed URL, no sentinel answering, no sentinel knowing the service, a refused password.
    Returns warnings for what may mend itself. Blocking, each step bounded by a timeout."""
    options = options or RedisOptions()
    target = parse_redis_url(url)
    if target.sentinel:
        host, port = _find_primary(target, options)
        password = target.password or options.password
        client = _sync(target, host, port, options.connect_timeout_s, password, username=target.username, db=target.db)
        return _check_primary(client, f"the primary {target.service!r} at {host}:{port}", target, options)
    try:
        client = redis.Redis.from_url(
            url,
            password=None if target.password else options.password,
            socket_connect_timeout=options.connect_timeout_s,
            socket_timeout=options.connect_timeout_s,
            retry=_no_retry(),
        )
    except ValueError as exc:
        raise RedisConfigError(f"Redis URL {redact(url)}: {_one_line(exc)}") from None
    return _check_primary(client, f"Redis at {redact(url)}", target, options)
