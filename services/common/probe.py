"""Looking at the bus from outside a service: is NATS there, and who beats on a namespace.

``chorus serve`` checks that NATS answers before a service starts (a service would otherwise
wait for it forever), ``chorus ping`` waits for a service's heartbeat, and ``chorus up`` makes
sure no other stack already runs in its namespace. Every wait here is bounded and fails with
an ``Unreachable`` that says why in one line."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import AuthorizationError

from contracts.messages.control import Heartbeat
from contracts.subjects import Subjects
from services.common.bus import credentials
from services.common.infra import redact


class Unreachable(Exception):
    """NATS did not answer in time (or refused us)."""


AUTH_HINT = (
    "the server refused this client's credentials (Authorization Violation): give its user and password "
    "(CHORUS_NATS_USER / CHORUS_NATS_PASSWORD)"
)


async def connect(
    url: str, timeout: float, name: str = "chorus-probe", creds: dict[str, str] | None = None
) -> NatsClient:
    """A plain connection (no reconnecting) to the NATS at ``url``, trying again until
    ``timeout`` seconds have passed (a server may be starting); refused credentials end it at
    once, said as such. ``creds``: user and password (default: from the environment)."""
    deadline = time.monotonic() + timeout
    errors: list[Exception] = []  # what the client met (its own exception says less)

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    reason = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unreachable(f"cannot reach NATS at {redact(url)} within {timeout:g}s: {reason}")
        errors.clear()
        try:
            return await asyncio.wait_for(
                nats.connect(
                    url,
                    name=name,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    connect_timeout=max(0.1, min(2.0, left)),
                    error_cb=on_error,
                    **(creds if creds else credentials()),
                ),
                max(0.1, left),
            )
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
            met = errors[-1] if errors else exc
            if _refused_credentials(met):
                raise Unreachable(f"cannot use NATS at {redact(url)}: {AUTH_HINT}") from None
            reason = _reason(met)
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _refused_credentials(exc: BaseException) -> bool:
    return isinstance(exc, AuthorizationError) or "authorization violation" in str(exc).lower()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).strip() or type(exc).__name__


async def first_beat(nc: NatsClient, subject: str, timeout: float) -> Heartbeat | None:
    """The first heartbeat on ``subject`` from an instance that is not leaving (None when
    none comes within ``timeout`` seconds)."""
    beats: asyncio.Queue[Heartbeat] = asyncio.Queue()

    async def on_beat(msg: Any) -> None:
        with contextlib.suppress(ValueError):
            beat = Heartbeat.model_validate_json(msg.data)
            if not beat.stopping and not beat.draining:
                beats.put_nowait(beat)

    sub = await nc.subscribe(subject, cb=on_beat)
    try:
        return await asyncio.wait_for(beats.get(), timeout)
    except TimeoutError:
        return None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def namespace_in_use(url: str, namespace: str, listen_s: float, connect_timeout: float = 5.0) -> Heartbeat | None:
    """A heartbeat of a service already running in ``namespace`` on the NATS at ``url``, if
    one beats within ``listen_s`` seconds (every instance beats a few times a second)."""
    nc = await connect(url, connect_timeout, "chorus-up")
    try:
        return await first_beat(nc, Subjects(namespace).heartbeats, listen_s)
    finally:
        await nc.close()


async def worker_beat(nc: NatsClient, namespace: str, roles: tuple[str, ...], timeout: float) -> Heartbeat | None:
    """A heartbeat of a worker process: one instance beating as every one of ``roles`` (its
    roles beat under one instance id), not leaving; None when none does within ``timeout``."""
    subjects = Subjects(namespace)
    seen: dict[str, dict[str, Heartbeat]] = {}
    found: asyncio.Future[Heartbeat] = asyncio.get_running_loop().create_future()

    async def on_beat(msg: Any) -> None:
        with contextlib.suppress(ValueError):
            beat = Heartbeat.model_validate_json(msg.data)
            if beat.stopping or beat.draining or beat.service not in roles:
                return
            mine = seen.setdefault(beat.instance, {})
            mine[beat.service] = beat
            if len(mine) == len(roles) and not found.done():
                ready = all(b.ready for b in mine.values())
                detail = "; ".join(dict.fromkeys(b.detail for b in mine.values() if b.detail))
                found.set_result(beat.model_copy(update={"service": "worker", "ready": ready, "detail": detail}))

    sub = await nc.subscribe(subjects.heartbeats, cb=on_beat)
    try:
        return await asyncio.wait_for(found, timeout)
    except TimeoutError:
        return None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
