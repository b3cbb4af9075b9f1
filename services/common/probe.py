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

from contracts.messages.control import Heartbeat
from contracts.subjects import Subjects
from services.common.settings import BusSettings
from services.common.urls import redact
from services.common.wire import Wire


class Unreachable(Exception):
    """NATS did not answer in time (or refused us)."""


AUTH_HINT = (
    "the server refused this client's credentials (Authorization Violation): give its user and password "
    "(CHORUS_NATS_USER / CHORUS_NATS_PASSWORD)"
)


async def connect(url: str, timeout: float, name: str = "chorus-probe", creds: dict[str, Any] | None = None) -> Wire:
    """A connection to the NATS at ``url`` (one server or a cluster's), trying again until
    ``timeout`` seconds have passed (a server may be starting); refused credentials end it at
    once, said as such. ``creds``: the connection's login and TLS options (default: the
    ``CHORUS_NATS_*`` settings of the environment). The caller closes it."""
    deadline = time.monotonic() + timeout
    options = creds if creds is not None else BusSettings().nats_options()
    reason = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unreachable(f"cannot reach NATS at {redact(url)} within {timeout:g}s: {reason}")
        try:
            return await asyncio.wait_for(
                Wire.connect(url, name=name, connect_timeout=max(0.1, min(2.0, left)), **options), max(0.1, left)
            )
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
            if _refused_credentials(exc):
                raise Unreachable(f"cannot use NATS at {redact(url)}: {AUTH_HINT}") from None
            reason = _reason(exc)
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _refused_credentials(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization violation" in text or "login refused" in text


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).strip() or type(exc).__name__


async def first_beat(nc: Wire, subject: str, timeout: float) -> Heartbeat | None:
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


async def worker_beat(nc: Wire, namespace: str, roles: tuple[str, ...], timeout: float) -> Heartbeat | None:
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
