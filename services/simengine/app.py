"""The SIMULATED engine's HTTP app: vLLM and/or SGLang routes, health, models, and what it saw.

Every response carries ``X-Chorus-Simulator: true``; ``/v1/models`` says owned_by
"chorus-simulator". ``run`` serves it with uvicorn until ``stop``; ``serving`` runs it inside a
test's event loop on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from openai_harmony import HarmonyEncoding
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.harmony import harmony_encoding
from services.simengine import sglang, vllm
from services.simengine.kv_publisher import KvPublisher, start_kv_events
from services.simengine.settings import Settings
from services.simengine.state import PrefixCache, Recorder, SimState

log = logging.getLogger("chorus.simengine")

SIMULATOR_HEADER = (b"x-chorus-simulator", b"true")


class SimulatorHeader:
    """Pure ASGI middleware (no buffering of streams) adding the simulator header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), SIMULATOR_HEADER]}
            await send(message)

        await self.app(scope, receive, send_with_header)


async def health(_: Request) -> Response:
    return Response(status_code=200)


async def models(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": sim.settings.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "chorus-simulator",
                    "max_model_len": sim.settings.max_model_len,
                }
            ],
        }
    )


def prompt_text(encoding: HarmonyEncoding, ids: list[int]) -> str:
    """The prompt as text, for the tests (a prompt the engine refused may hold ids no
    tokenizer knows: then none)."""
    try:
        return str(encoding.decode(ids))
    except Exception:  # noqa: BLE001 - openai_harmony raises its own error for unknown ids
        return ""


async def sim_requests(request: Request) -> Response:
    """What the engine saw, oldest first; ``?request_id=X`` keeps that request's records."""
    sim: SimState = request.app.state.sim
    records = sim.recorder.list(functools.partial(prompt_text, sim.encoding))
    wanted = request.query_params.get("request_id")
    if wanted is not None:
        records = [r for r in records if r["request_id"] == wanted]
    return JSONResponse(records)


async def metrics(request: Request) -> Response:
    sim: SimState = request.app.state.sim
    running = sim.recorder.running
    return PlainTextResponse(
        "# chorus simulator\n"
        f'vllm:num_requests_running{{model_name="{sim.settings.served_model_name}"}} {running}\n'
        f'vllm:num_requests_waiting{{model_name="{sim.settings.served_model_name}"}} 0\n'
    )


def build_app(settings: Settings, recorder: Recorder | None = None) -> ASGIApp:
    """The ASGI app; ``recorder`` lets an in-process test read what the engine saw."""
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/sim/requests", sim_requests, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    if settings.protocol in ("vllm", "both"):
        routes += [
            Route("/v1/completions", vllm.completions, methods=["POST"]),
            Route("/load", vllm.load, methods=["GET"]),
        ]
    if settings.protocol in ("sglang", "both"):
        routes += [
            Route("/generate", sglang.generate, methods=["POST"]),
            Route("/abort_request", sglang.abort_request, methods=["POST"]),
            Route("/get_load", sglang.get_load, methods=["GET"]),
        ]
    app = Starlette(routes=routes)
    app.state.sim = SimState(settings, recorder or recorder_for(settings), harmony_encoding())
    return SimulatorHeader(app)


def recorder_for(settings: Settings) -> Recorder:
    """A recorder whose prefix cache is the size the settings give."""
    return Recorder(prefix_cache=PrefixCache(settings.kv_cache_tokens, settings.kv_block_size))


def _server(settings: Settings, app: ASGIApp) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="off",
        access_log=False,
        log_level="warning",
        log_config=None,
        timeout_graceful_shutdown=2,
    )
    return uvicorn.Server(config)


async def _serve_until(
    server: uvicorn.Server, sock: socket.socket | None, stop: asyncio.Event, events: KvPublisher | None = None
) -> None:
    """Serve (and publish KV cache events, with ``events``) until ``stop``."""
    try:
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(server.serve(sockets=[sock] if sock else None))
            stopping = tg.create_task(stop.wait())
            if events is not None:
                tg.create_task(events.serve())
            await asyncio.wait((serving, stopping), return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            stopping.cancel()
            if events is not None:
                events.close()  # its serve() returns
    finally:
        if events is not None:
            events.close()  # (again, harmless) when serving failed


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM)."""
    log.warning(
        "SIMULATED gpt-oss engine (not a model: scripted Harmony output) on http://%s:%d, protocol=%s%s",
        settings.host,
        settings.port,
        settings.protocol,
        " (SGLang incremental streaming)" if settings.sglang_incremental else "",
    )
    recorder = recorder_for(settings)
    events = start_kv_events(settings, recorder.prefix_cache)
    server = _server(settings, build_app(settings, recorder))
    await _serve_until(server, None, stop or asyncio.Event(), events)


@dataclass
class RunningSim:
    url: str
    recorder: Recorder
    settings: Settings
    kv_events: str | None = None  # the bound endpoints of its KV event publisher, if any
    kv_replay: str | None = None


@contextlib.asynccontextmanager
async def serving(settings: Settings | None = None) -> AsyncIterator[RunningSim]:
    """Run the simulator in this event loop on a free port (listening before this yields)."""
    settings = settings or Settings()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    settings = settings.model_copy(update={"port": port})
    recorder = recorder_for(settings)
    events = start_kv_events(settings, recorder.prefix_cache)
    server = _server(settings, build_app(settings, recorder))
    stop = asyncio.Event()
    # a task awaited on exit rather than a TaskGroup: test fixtures may enter and leave this
    # context from different tasks, which a TaskGroup forbids
    task = asyncio.create_task(_serve_until(server, sock, stop, events))
    try:
        yield RunningSim(
            f"http://{settings.host}:{port}",
            recorder,
            settings,
            events.endpoint if events is not None else None,
            events.replay_endpoint if events is not None else None,
        )
    finally:
        stop.set()
        await task
        sock.close()
