"""The gateway: OpenAI-compatible HTTP API in front of the Chorus bus. The only place that
wires NATS, Redis and the HTTP server together."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.errors import BusError, ErrorCode
from contracts.subjects import SERVICES
from services.common.errors import ChorusError
from services.common.logs import setup_logging
from services.common.runtime import Runtime
from services.gateway import stack_metrics
from services.gateway.chat.routes import chat_completions
from services.gateway.chat.routes import router as chat_router
from services.gateway.context import GatewayContext, get_ctx
from services.gateway.edge import ANTHROPIC_PATHS, Edge
from services.gateway.errors import STORAGE_DOWN, public
from services.gateway.generations import Generations
from services.gateway.messages import response as anthropic
from services.gateway.messages.routes import create_message
from services.gateway.messages.routes import router as messages_router
from services.gateway.responses import conversations
from services.gateway.responses import routes as responses
from services.gateway.sealing import Sealer
from services.gateway.settings import Settings
from services.gateway.store import RedisResponseStore

log = logging.getLogger("chorus.gateway")

# every service of the stack must have a ready instance for /health to be 200
REQUIRED_SERVICES = SERVICES
WATCHED = SERVICES  # the heartbeats the gateway listens to


def _error(request: Request, error: BusError, status: int | None = None) -> JSONResponse:
    """An error as the API asked shapes it (OpenAI's, or Anthropic's under /v1/messages); the
    reason also goes into the request's log line."""
    notes = getattr(request.state, "notes", None)
    if isinstance(notes, dict):
        notes["reason"] = error.message[:200]
    if request.url.path.startswith(ANTHROPIC_PATHS):
        return JSONResponse(
            anthropic.error_body(error.code, error.message), status_code=anthropic.status_of(error.code)
        )
    return JSONResponse(error.openai_body(), status_code=status or error.code.http_status)


def install_error_handlers(app: FastAPI) -> None:
    """Errors with a known cause become their status; anything else is answered by the edge
    (services/gateway/edge.py) without internals and without closing the connection."""

    @app.exception_handler(ChorusError)
    async def _chorus_error(request: Request, exc: ChorusError) -> JSONResponse:
        return _error(request, public(exc.error))

    @app.exception_handler(RedisError)
    async def _storage(request: Request, exc: RedisError) -> JSONResponse:
        log.warning("Redis failed: %s", exc)
        return _error(request, STORAGE_DOWN)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")) or None
        return _error(
            request,
            BusError(
                code=ErrorCode.INVALID_REQUEST,
                message=f"Invalid value for '{param}': {first.get('msg', 'invalid')}",
                param=param,
            ),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.INVALID_REQUEST}.get(
            exc.status_code, ErrorCode.INVALID_REQUEST
        )
        return _error(request, BusError(code=code, message=str(exc.detail)), exc.status_code)


def endpoint_app(app: FastAPI, endpoint: Callable[[Request], Awaitable[Response]]) -> ASGIApp:
    """``endpoint`` (a route of ``app`` that takes the request alone and returns a response) as an
    ASGI app, its errors answered by ``app``'s exception handlers (anything else is raised to the
    edge, as from the framework's routing): what the router would do for it, without its layers
    in between. The route stays declared in ``app`` (the API's schema lists it)."""
    handlers = app.exception_handlers

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app
        server_span = trace.get_current_span()  # an HTTP instrumentation's (FastAPI's own), if any
        if server_span.is_recording():  # named after the route, as the router would have it named
            server_span.set_attribute("http.route", scope["path"])
            server_span.update_name(f"{scope['method']} {scope['path']}")
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = next((handlers[kind] for kind in type(exc).__mro__ if kind in handlers), None)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    return serve


def build_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Runtime.start(settings, "gateway", watch=WATCHED) as rt, rt.beating():
            generations = Generations(
                rt.bus,
                rt.peers,
                settings.instance_id,
                accept_timeout=settings.bus_timeout_s,
                first_timeout=settings.first_token_timeout_s,
                idle_timeout=settings.idle_timeout_s,
            )
            rt.reconnect_callbacks.append(generations.on_reconnect)
            await generations.start()
            await rt.peers.wait_for(WATCHED, timeout=4 * settings.heartbeat_interval_s)
            store = RedisResponseStore.from_settings(settings)
            sealer = await Sealer.from_settings(settings.sealing_keys, store.shared_secret)
            ctx = GatewayContext(
                settings=settings, bus=rt.bus, peers=rt.peers, generations=generations, store=store, sealer=sealer
            )
            app.state.ctx = ctx
            app.state.background = background = await responses.startup(ctx)
            try:
                yield
            finally:
                await background.stop()
                await generations.stop()
                await store.close()

    app = FastAPI(title="Chorus", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    install_error_handlers(app)
    direct = {
        "/v1/chat/completions": endpoint_app(app, chat_completions),
        "/v1/responses": endpoint_app(app, responses.create_response),
        "/v1/messages": endpoint_app(app, create_message),
    }

    def simulated() -> bool:
        ctx: GatewayContext | None = getattr(app.state, "ctx", None)
        return ctx is not None and ctx.simulated()

    app.add_middleware(
        Edge, api_keys=settings.api_keys, max_body_bytes=settings.max_body_bytes, direct=direct, simulated=simulated
    )
    app.include_router(chat_router)
    app.include_router(responses.router)
    app.include_router(messages_router)
    app.include_router(conversations.router)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        ctx = get_ctx(request)
        status: dict[str, Any] = {}
        ok = True
        for service in REQUIRED_SERVICES:
            peers = ctx.peers.alive(service)
            ready = [p for p in peers if p.beat.ready and not p.beat.draining]
            ok = ok and bool(ready)
            # the instances of a role often say the same (every worker's dispatcher sees the
            # same engines): each thing once
            detail = "; ".join(dict.fromkeys(p.beat.detail for p in peers if p.beat.detail)) or (
                f"{len(ready)}/{len(peers)} instances ready" if peers else "no instance is running"
            )
            status[service] = {"ready": bool(ready), "instances": len(peers), "detail": detail}
        try:
            await ctx.store.ping()
            status["redis"] = {"ready": True}
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            ok = False
            status["redis"] = {"ready": False, "detail": str(exc)}
        # the namespace tells `chorus up` that this gateway is its own (not another stack's)
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "namespace": settings.namespace, "services": status},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        ctx = get_ctx(request)
        snapshots = await stack_metrics.gather(ctx.bus, ctx.peers, SERVICES, settings.metrics_timeout_s)
        text = stack_metrics.merge(stack_metrics.own_exposition(), settings.instance_id, snapshots)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        owner = _owner(get_ctx(request))
        return {"object": "list", "data": [_model(m, owner) for m in settings.models]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        ctx = get_ctx(request)
        ctx.check_model(model_id)
        return _model(model_id, _owner(ctx))

    return app


def _owner(ctx: GatewayContext) -> str:
    return "chorus-simulator" if ctx.simulated() else "chorus"


def _model(model_id: str, owner: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": owner}


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    setup_logging(settings.log_level)
    config = uvicorn.Config(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # longer than clients keep idle connections (httpx: 5 s), so a client never sends on a
        # connection the server is closing at that moment (a connection error, not retried)
        timeout_keep_alive=75,
        ws_per_message_deflate=settings.websocket_compression,
        log_config=None,  # uvicorn's lines go through this process's logging (text or JSON)
    )
    server = uvicorn.Server(config)
    if stop is None:
        await server.serve()
        return

    async def until_stopped() -> None:
        await stop.wait()
        server.should_exit = True

    async with asyncio.TaskGroup() as tg:  # serve until told to stop (or the server ends itself)
        serving = tg.create_task(server.serve())
        stopper = tg.create_task(until_stopped())
        serving.add_done_callback(lambda _: stopper.cancel())
