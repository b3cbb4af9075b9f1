"""Thin typed helpers over nats-py, for clients and for the token hot path.

Services receive requests through faststream handlers; callers (the gateway, the dispatcher
streaming tokens, the parser streaming events) use these helpers with the same pydantic
contracts, without a framework's per-message cost."""

from __future__ import annotations

from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from pydantic import BaseModel, TypeAdapter

from contracts.errors import BusError, ErrorCode
from contracts.subjects import REQUEST_ID_HEADER
from services.common.telemetry import inject

T = TypeVar("T")


class BusFailure(Exception):
    """A request over the bus failed; ``error`` says how, in the contract's terms."""

    def __init__(self, error: BusError) -> None:
        super().__init__(error.message)
        self.error = error


async def connect(url: str, name: str, **kwargs: Any) -> NatsClient:
    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        **kwargs,
    )


def dump(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()


def headers_for(request_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Headers for a bus message: the request id, and the current trace context."""
    headers = {REQUEST_ID_HEADER: request_id, "content-type": "application/json"}
    if extra:
        headers.update(extra)
    return inject(headers)


async def request(
    nc: NatsClient,
    subject: str,
    msg: BaseModel,
    reply_type: TypeAdapter[T],
    *,
    request_id: str,
    timeout: float,
    service: str,
    headers: dict[str, str] | None = None,
) -> T:
    """Request/reply with typed payloads. A ``BusError`` reply raises ``BusFailure``; so do a
    timeout (TIMEOUT) and nobody listening (SERVICE_UNAVAILABLE)."""
    try:
        reply = await nc.request(
            subject, dump(msg), timeout=timeout, headers=headers_for(request_id, headers)
        )
    except nats.errors.NoRespondersError as exc:
        raise BusFailure(
            BusError(code=ErrorCode.SERVICE_UNAVAILABLE, message=f"no {service} service is running")
        ) from exc
    except nats.errors.TimeoutError as exc:
        raise BusFailure(
            BusError(code=ErrorCode.TIMEOUT, message=f"the {service} service did not answer in {timeout:g}s")
        ) from exc
    value = reply_type.validate_json(reply.data)
    if isinstance(value, BusError):
        raise BusFailure(value)
    return value
