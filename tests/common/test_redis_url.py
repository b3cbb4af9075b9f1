"""Redis URLs: the plain forms as redis-py reads them, the Sentinel forms parsed to the
sentinels, the service, the database and the primary's credentials; a malformed one is a
one-line ``RedisConfigError``; passwords never shown; the defaults that depend on the form."""

from __future__ import annotations

import pytest

from services.common.redis_url import RedisConfigError, RedisOptions, parse_redis_url
from services.common.urls import redact


@pytest.mark.parametrize(
    ("url", "sentinels", "service", "db", "username", "password", "tls"),
    [
        ("redis+sentinel://127.0.0.1:26379/mymaster", (("127.0.0.1", 26379),), "mymaster", 0, None, None, False),
        ("redis+sentinel://a:1,b:2,c:3/svc/4", (("a", 1), ("b", 2), ("c", 3)), "svc", 4, None, None, False),
        ("redis+sentinel://:p%40ss@h1,h2:5/svc", (("h1", 26379), ("h2", 5)), "svc", 0, None, "p@ss", False),
        ("rediss+sentinel://app:pw@[::1]:7000/svc/2", (("::1", 7000),), "svc", 2, "app", "pw", True),
    ],
)
def test_sentinel_urls(
    url: str,
    sentinels: tuple[tuple[str, int], ...],
    service: str,
    db: int,
    username: str | None,
    password: str | None,
    tls: bool,
) -> None:
    target = parse_redis_url(url)
    assert target.sentinel
    assert (target.sentinels, target.service, target.db) == (sentinels, service, db)
    assert (target.username, target.password, target.tls) == (username, password, tls)
    assert "pw" not in target.where() and "p@ss" not in repr(target)


def test_tls_parameters_pass_through() -> None:
    target = parse_redis_url("rediss+sentinel://h:1/svc?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert dict(target.tls_params) == {"ssl_cert_reqs": "none", "ssl_ca_certs": "/ca.pem"}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///svc", "no sentinel address"),
        ("redis+sentinel://h:1", "/SERVICE_NAME"),
        ("redis+sentinel://h:1/svc/x", "not a number"),
        ("redis+sentinel://h:1/svc/0/extra", "/SERVICE_NAME"),
        ("redis+sentinel://h:port/svc", "not HOST:PORT"),
        ("redis+sentinel://h:1,,:2/svc", "empty sentinel address"),
        ("redis+sentinel://h:1/svc?timeout=3", "unknown parameter"),
        ("http://h:1/svc", "not a Redis URL"),
    ],
)
def test_malformed_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(RedisConfigError, match=says) as caught:
        parse_redis_url(url)
    assert "\n" not in str(caught.value)


def test_plain_urls_are_left_to_redis_py() -> None:
    target = parse_redis_url("rediss://:secret@cache:6380/3")
    assert not target.sentinel and target.tls and target.password == "secret"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis+sentinel://:secret@h:1,h:2/svc", "redis+sentinel://:***@h:1,h:2/svc"),
        ("redis://user:secret@h:1/0", "redis://user:***@h:1/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        ("nats://u:secret@a:4222,nats://u:secret@b:4222", "nats://u:***@a:4222,nats://u:***@b:4222"),
        ("nats://a:4222,nats://b:4222", "nats://a:4222,nats://b:4222"),
    ],
)
def test_passwords_are_never_shown(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_defaults_depend_on_the_form() -> None:
    sentinel, plain = parse_redis_url("redis+sentinel://h:1/svc"), parse_redis_url("redis://h:1/0")
    options = RedisOptions()
    assert (options.replicas_for(sentinel), options.failover_for(sentinel)) == (1, 15.0)
    assert (options.replicas_for(plain), options.failover_for(plain)) == (0, 0.0)
    given = RedisOptions(min_replicas=2, failover_s=3)
    assert (given.replicas_for(plain), given.failover_for(plain)) == (2, 3.0)
