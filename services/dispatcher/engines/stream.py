"""Opening an engine stream and reading its server-sent events, for any adapter.

``open_stream`` returns once the engine answered with a 2xx status, or raises ``EngineFailure``
(connection refused or unreachable: retryable on another worker; 4xx: the caller's request;
5xx: the engine's; no answer in time: TIMEOUT). ``EngineStream.chunks`` then yields the
adapter's ``EngineChunk``s; a broken connection, a read timeout or an ``{"error": ...}`` event
become a last chunk with ``error``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import GenerateRequest
from services.dispatcher.engines.base import (
    EngineAdapter,
    EngineChunk,
    EngineFailure,
    StreamDecoder,
    error_for_status,
    error_message,
)


class EngineStream:
    def __init__(self, response: httpx.Response, decoder: StreamDecoder, url: str) -> None:
        self.response, self.decoder, self.url = response, decoder, url

    async def chunks(self) -> AsyncGenerator[EngineChunk, None]:
        """Chunks until ``[DONE]`` or the end of the stream; errors end with an error chunk."""
        pending = b""
        try:
            async for data in self.response.aiter_bytes():
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        return
                    chunk = self._decode(payload)
                    if chunk is not None:
                        yield chunk
                        if chunk.error is not None:
                            return
        except httpx.ReadTimeout:
            yield EngineChunk(finish_reason="error", error=BusError(
                code=ErrorCode.TIMEOUT, message=f"the engine at {self.url} stopped sending tokens",
            ))
        except httpx.HTTPError as exc:
            yield EngineChunk(finish_reason="error", error=BusError(
                code=ErrorCode.ENGINE_ERROR,
                message=f"the connection to the engine at {self.url} broke: {type(exc).__name__}",
            ))

    def _decode(self, data: bytes) -> EngineChunk | None:
        try:
            event: Any = json.loads(data)
        except ValueError:
            return EngineChunk(finish_reason="error", error=BusError(
                code=ErrorCode.ENGINE_ERROR,
                message=f"the engine sent an unreadable event: {data[:200].decode(errors='replace')}",
            ))
        if not isinstance(event, dict):
            return None
        if "error" in event and not event.get("choices") and "output_ids" not in event:
            message = error_message(event, "the engine failed mid-stream")
            return EngineChunk(finish_reason="error",
                               error=BusError(code=ErrorCode.ENGINE_ERROR, message=message))
        try:
            chunk = self.decoder.feed(event)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            return EngineChunk(finish_reason="error", error=BusError(
                code=ErrorCode.ENGINE_ERROR, message=f"the engine sent an event Chorus cannot read: {exc}",
            ))
        if chunk is not None and chunk.error is not None and chunk.finish_reason != "error":
            return EngineChunk(chunk.token_ids, "error", None, chunk.usage, chunk.error)
        return chunk

    async def aclose(self) -> None:
        """Close the stream (for vLLM this is the abort)."""
        await self.response.aclose()


async def open_stream(
    client: httpx.AsyncClient,
    base_url: str,
    adapter: EngineAdapter,
    req: GenerateRequest,
    *,
    accept_timeout: float,
) -> EngineStream:
    path, body = adapter.request(req)
    url = f"{base_url}{path}"
    request = client.build_request("POST", url, json=body)
    try:
        async with asyncio.timeout(accept_timeout):
            response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise EngineFailure(BusError(
            code=ErrorCode.ENGINE_UNAVAILABLE,
            message=f"the engine at {base_url} is unreachable ({type(exc).__name__})",
        ), retryable=True) from exc
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise EngineFailure(BusError(
            code=ErrorCode.TIMEOUT,
            message=f"the engine at {base_url} did not answer within {accept_timeout:g}s",
        )) from exc
    except httpx.HTTPError as exc:
        raise EngineFailure(BusError(
            code=ErrorCode.ENGINE_ERROR,
            message=f"the engine at {base_url} failed: {type(exc).__name__}: {exc}",
        )) from exc
    if response.status_code >= 400:
        raise EngineFailure(await _http_error(response, base_url, accept_timeout))
    return EngineStream(response, adapter.decoder(req), base_url)


async def _http_error(response: httpx.Response, base_url: str, timeout: float) -> BusError:
    status = response.status_code
    default = f"the engine at {base_url} answered HTTP {status}"
    try:
        async with asyncio.timeout(timeout):
            raw = await response.aread()
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        message = error_message(payload, default)
    except (TimeoutError, httpx.HTTPError):
        message = default
    finally:
        await response.aclose()
    if status >= 500 and message != default:
        message = f"{default}: {message}"
    return error_for_status(status, message)
