"""The gateway: OpenAI-compatible HTTP API in front of the Chorus bus. The only place that
wires NATS, Redis and the HTTP server together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.errors import BusError, ErrorCode
from contracts.subjects import SERVICES
from services.common import bus
from services.common.bus import BusFailure
from services.common.runtime import setup_logging
from services.common.telemetry import setup_tracing
from services.gateway.chat.routes import router as chat_router
from services.gateway.context import GatewayContext, get_ctx
from services.gateway.errors import ApiError
from services.gateway.pipeline import EventRouter, Pipeline
from services.gateway.settings import Settings

log = logging.getLogger("chorus.gateway")

# every service of the stack must answer ready for /health to be 200
REQUIRED_SERVICES = SERVICES


def _error(error: BusError) -> JSONResponse:
    return JSONResponse(error.openai_body(), status_code=error.code.http_status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.error)

    @app.exception_handler(BusFailure)
    async def _bus_failure(_: Request, exc: BusFailure) -> JSONResponse:
        return _error(exc.error)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        return _error(BusError(code=ErrorCode.INVALID_REQUEST,
                               message=f"Invalid request: {first.get('msg', 'invalid')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        body = BusError(code=code, message=str(exc.detail)).openai_body()
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return _error(BusError(code=ErrorCode.INTERNAL, message=f"Internal error: {type(exc).__name__}"))


def build_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nc = await bus.connect(settings.nats_url, f"chorus-gateway-{settings.instance_id}")
        router = EventRouter(nc, settings.subjects.gateway_events(settings.instance_id))
        await router.start()
        pipeline = Pipeline(
            nc, settings.subjects, router,
            bus_timeout=settings.bus_timeout_s,
            first_token_timeout=settings.first_token_timeout_s,
            idle_timeout=settings.idle_timeout_s,
        )
        ctx = GatewayContext(settings=settings, pipeline=pipeline)
        app.state.ctx = ctx
        await _responses_startup(ctx)
        try:
            yield
        finally:
            await _responses_shutdown(ctx)
            await router.stop()
            await nc.drain()

    app = FastAPI(title="Chorus", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    install_error_handlers(app)
    app.include_router(chat_router)
    _include_responses(app)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        ctx = get_ctx(request)
        checks = await asyncio.gather(*(ctx.pipeline.ping(s) for s in REQUIRED_SERVICES),
                                      return_exceptions=True)
        status: dict[str, Any] = {}
        ok = True
        for service, result in zip(REQUIRED_SERVICES, checks, strict=True):
            if isinstance(result, BaseException):
                ok = False
                status[service] = {"ready": False, "detail": str(result)}
            else:
                ok = ok and result.ready
                status[service] = {"ready": result.ready, "detail": result.detail}
        if ctx.store is not None:
            try:
                await ctx.store.ping()
                status["redis"] = {"ready": True}
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                ok = False
                status["redis"] = {"ready": False, "detail": str(exc)}
        return JSONResponse({"status": "ok" if ok else "unavailable", "services": status},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model(m) for m in settings.models]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        get_ctx(request).check_model(model_id)
        return _model(model_id)

    return app


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "chorus"}


def _include_responses(app: FastAPI) -> None:
    try:
        from services.gateway.responses.routes import router as responses_router
    except ImportError:
        log.warning("Responses API not available in this build")
        return
    app.include_router(responses_router)


async def _responses_startup(ctx: GatewayContext) -> None:
    try:
        from services.gateway.store import RedisResponseStore
    except ImportError:
        return
    s = ctx.settings
    ctx.store = RedisResponseStore.from_url(s.redis_url, namespace=s.namespace, ttl_s=s.response_ttl_s)
    with contextlib.suppress(ImportError, AttributeError):
        from services.gateway.responses import routes

        await routes.startup(ctx)


async def _responses_shutdown(ctx: GatewayContext) -> None:
    with contextlib.suppress(ImportError, AttributeError):
        from services.gateway.responses import routes

        await routes.shutdown(ctx)
    if ctx.store is not None:
        await ctx.store.close()


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    setup_logging(settings.log_level)
    setup_tracing("gateway", settings.otlp_endpoint)
    config = uvicorn.Config(
        build_app(settings), host=settings.host, port=settings.port,
        log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    if stop is None:
        await server.serve()
        return
    serving = asyncio.ensure_future(server.serve())
    await asyncio.wait({serving, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
