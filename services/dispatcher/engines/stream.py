"""Opening an engine stream and reading its server-sent events, for any adapter: the per-read
cost of this path is on every token's way, so it runs synchronously inside the HTTP client's
``data_received`` (``engines/http.py``), without a task switch per event.

``open_stream`` returns once the engine answered with a 2xx status, or raises ``EngineFailure``
(connection refused or unreachable: retryable on another worker; 4xx: the caller's request;
5xx: the engine's; no answer in time: TIMEOUT). ``EngineStream.start`` then hands its sink one
list of the adapter's ``EngineChunk``s per socket read (everything that had arrived), until
``[DONE]``, an ``{"error": ...}`` event, the end of the body or the sink saying it has had
enough; ``ended`` resolves then. A broken connection or a read timeout is a last error chunk;
a connection that breaks mid-stream is ``retryable``: the engine died, another can continue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import GenerateRequest
from services.dispatcher.engines.base import (
    EngineAdapter,
    EngineChunk,
    EngineFailure,
    StreamDecoder,
    error_for_status,
    error_message,
    status_error,
)
from services.dispatcher.engines.http import (
    AcceptTimeout,
    BadResponse,
    ConnectFailed,
    EngineHttp,
    HttpError,
    HttpStream,
    ReadTimeout,
)

# one engine read's chunks; True: the sink has had enough (the stream ends there)
Sink = Callable[[list[EngineChunk]], bool]


def _error(code: ErrorCode, message: str, *, retryable: bool = False) -> EngineChunk:
    return EngineChunk(finish_reason="error", error=BusError(code=code, message=message, retryable=retryable))


class EngineStream:
    def __init__(self, http: HttpStream, decoder: StreamDecoder, url: str) -> None:
        self.http, self.decoder, self.url = http, decoder, url
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sink: Sink | None = None
        self._pending = b""  # the start of a line whose end has not arrived
        self._over = False

    def start(self, sink: Sink, pace: Callable[[], float] | None = None) -> None:
        """Decode the events into ``sink`` from now on (what arrived already, at once); after
        each read, leave the engine's socket unread for ``pace()`` seconds (see ``HttpStream``)."""
        self._sink = sink
        self.http.done.add_done_callback(self._http_ended)
        self.http.start(self._on_data, pace)

    async def drain(self, timeout: float) -> None:
        """Let the rest of the answer (``[DONE]``, the last chunk) arrive for a while, so that
        its connection can be reused."""
        if not self.http.done.done():
            await asyncio.wait([self.http.done], timeout=timeout)

    def close(self) -> None:
        """Done with the stream: a stream read to its end gives its connection back to the
        pool; one cut short closes it (for vLLM closing is the abort)."""
        self._end()
        self.http.close()

    def _on_data(self, data: bytes) -> None:
        """One socket read: whole lines -> events -> chunks -> the sink."""
        if self._over:
            return
        if self._pending:
            data = self._pending + data
        lines = data.split(b"\n")
        self._pending = lines.pop()
        out: list[EngineChunk] = []
        over = False
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                over = True
                break
            chunk = decode_event(self.decoder, payload)
            if chunk is not None:
                out.append(chunk)
                if chunk.error is not None:
                    over = True
                    break
        if out and self._sink is not None and self._sink(out):
            over = True
        if over:
            self._end()

    def _http_ended(self, done: asyncio.Future[None]) -> None:
        """The answer ended: a last line without its newline, or the failure as a chunk."""
        error = None if done.cancelled() else done.exception()
        if self._over:
            return
        try:
            if error is None:
                if self._pending.strip():
                    self._on_data(b"\n")
            elif isinstance(error, ReadTimeout):
                self._deliver(_error(ErrorCode.TIMEOUT, "the engine stopped sending tokens"))
            elif isinstance(error, HttpError):
                self._deliver(
                    _error(
                        ErrorCode.ENGINE_UNAVAILABLE if error.retryable else ErrorCode.ENGINE_ERROR,
                        f"the engine stream failed: {error}",
                        retryable=error.retryable,
                    )
                )
            else:  # the sink failed: whoever waits on the stream hears of it
                self._end(error)
                return
        except Exception as exc:  # noqa: BLE001 - as above
            self._end(exc)
            return
        self._end()

    def _deliver(self, chunk: EngineChunk) -> None:
        if self._sink is not None:
            self._sink([chunk])

    def _end(self, error: BaseException | None = None) -> None:
        self._over = True
        if self.ended.done():
            return
        if error is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(error)


def decode_event(decoder: StreamDecoder, data: bytes) -> EngineChunk | None:
    """One ``data:`` payload as a chunk (``None``: nothing in it); what the engine sends
    cannot make it raise."""
    try:
        event: Any = orjson.loads(data)
    except ValueError:
        return _error(
            ErrorCode.ENGINE_ERROR, f"the engine sent an unreadable event: {data[:200].decode(errors='replace')}"
        )
    if not isinstance(event, dict):
        return None
    if "error" in event and not event.get("choices") and "output_ids" not in event:
        return EngineChunk(finish_reason="error", error=stream_error(decoder, event))
    try:
        chunk = decoder.feed(event)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        return _error(ErrorCode.ENGINE_ERROR, f"the engine sent an event Chorus cannot read: {exc}")
    if chunk is not None and chunk.error is not None and chunk.finish_reason != "error":
        return EngineChunk(chunk.token_ids, "error", None, chunk.usage, chunk.error)
    return chunk


def stream_error(decoder: StreamDecoder, event: dict[str, Any]) -> BusError:
    """An ``{"error": ...}`` event: its ``code`` says whose fault it is (vLLM sends one);
    without one, what the protocol's error events mean (``stream_error_status``), else the
    engine's failure."""
    message = error_message(event, "the engine failed mid-stream")
    inner = event.get("error")
    code = inner.get("code") if isinstance(inner, dict) else None
    status = code if type(code) is int else getattr(decoder, "stream_error_status", 500)
    return status_error(status, message)


async def open_stream(
    http: EngineHttp,
    base_url: str,
    adapter: EngineAdapter,
    req: GenerateRequest,
    *,
    accept_timeout: float,
    read_timeout: float,
) -> EngineStream:
    path, body = adapter.request(req)
    try:
        response = await http.stream(
            f"{base_url}{path}", orjson.dumps(body), accept_timeout=accept_timeout, read_timeout=read_timeout
        )
    except ConnectFailed as exc:
        raise EngineFailure(
            BusError(code=ErrorCode.ENGINE_UNAVAILABLE, message=f"the engine is unreachable ({exc})"), retryable=True
        ) from exc
    except AcceptTimeout as exc:
        raise EngineFailure(
            BusError(code=ErrorCode.TIMEOUT, message=f"the engine did not answer within {accept_timeout:g}s")
        ) from exc
    except BadResponse as exc:
        raise EngineFailure(BusError(code=ErrorCode.ENGINE_ERROR, message=f"the engine request failed: {exc}")) from exc
    except HttpError as exc:  # broke in the middle of the status line and headers
        raise EngineFailure(
            BusError(
                code=ErrorCode.ENGINE_UNAVAILABLE, message=f"the engine closed the connection before answering ({exc})"
            ),
            retryable=exc.retryable,
        ) from exc
    if response.status >= 400:
        raise EngineFailure(await _http_error(response, accept_timeout))
    return EngineStream(response, adapter.decoder(req), base_url)


async def _http_error(response: HttpStream, timeout: float) -> BusError:
    status = response.status
    default = f"the engine answered HTTP {status}"
    try:
        async with asyncio.timeout(timeout):
            raw = await response.read_all()
        try:
            payload: Any = orjson.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        message = error_message(payload, default)
    except (TimeoutError, HttpError):
        message = default
    finally:
        response.close()
    if status >= 500 and message != default:
        message = f"{default}: {message}"
    return error_for_status(status, message)
