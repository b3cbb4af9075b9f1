"""Server addresses as messages and logs show them: without their passwords."""

from __future__ import annotations


def redact(url: str) -> str:
    """``url`` without its password, whatever its form: one server's URL, a cluster's
    comma-separated URLs (``nats://u:p@a:4222,nats://u:p@b:4222``) or a Sentinel URL's list of
    hosts (``redis+sentinel://:p@a:26379,b:26379/service``), each kept as written."""
    return ",".join(_redact_one(part) if "://" in part else part for part in url.split(","))


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{hosts}{slash}{path}"
