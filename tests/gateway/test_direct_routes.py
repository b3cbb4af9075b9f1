"""The generation routes served straight from the edge (``Edge(direct=...)`` with
``endpoint_app``): past the framework's routing layers, yet answering exactly as through them
(errors by the app's handlers, the edge's own checks and log notes kept)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.errors import ErrorCode
from services.gateway.app import endpoint_app, install_error_handlers
from services.gateway.edge import Edge
from services.gateway.errors import invalid


class Layers:
    """A middleware inside the framework (below the edge): counts the requests that went
    through the framework's own stack."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


async def answer(request: Request) -> Response:
    body = await request.json()
    if body.get("fail") == "api":
        raise invalid("'x' is not valid here", "x")
    if body.get("fail") == "bug":
        raise RuntimeError("internal detail that must not leak")
    request.state.notes["model"] = "m"  # the edge's log notes are reachable
    return JSONResponse({"app": request.app.title, "body": body})


def build(*, direct: bool, keys: list[str] | None = None) -> tuple[FastAPI, list[str]]:
    app = FastAPI(title="direct-test")
    install_error_handlers(app)
    seen: list[str] = []
    app.add_middleware(Layers, seen=seen)
    routes = {"/v1/answer": endpoint_app(app, answer)} if direct else {}
    app.add_middleware(Edge, api_keys=keys or [], max_body_bytes=1024, direct=routes)
    app.post("/v1/answer")(answer)
    return app, seen


async def post(app: ASGIApp, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.post("/v1/answer", json=body, headers=headers or {})


async def test_a_direct_route_skips_the_frameworks_layers() -> None:
    app, seen = build(direct=True)
    r = await post(app, {"q": 1})
    assert r.status_code == 200
    assert r.json() == {"app": "direct-test", "body": {"q": 1}}
    assert r.headers["x-request-id"]  # the edge still wraps it
    assert seen == []  # the framework's stack was not entered
    framework, seen_there = build(direct=False)
    assert (await post(framework, {"q": 1})).json() == r.json()
    assert seen_there == ["/v1/answer"]


@pytest.mark.parametrize("direct", [True, False])
async def test_errors_answer_as_through_the_framework(direct: bool) -> None:
    app, _ = build(direct=direct)
    r = await post(app, {"fail": "api"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "x"
    assert r.json()["error"]["message"] == "'x' is not valid here"
    bug = await post(app, {"fail": "bug"})
    assert bug.status_code == 500
    assert bug.json()["error"]["code"] == ErrorCode.INTERNAL.value
    assert "internal detail" not in bug.text


async def test_the_edges_checks_come_first() -> None:
    app, _ = build(direct=True, keys=["k1"])
    assert (await post(app, {"q": 1})).status_code == 401
    assert (await post(app, {"q": 1}, {"Authorization": "Bearer k1"})).status_code == 200
    big = await post(app, {"q": "x" * 2000}, {"Authorization": "Bearer k1"})
    assert big.status_code == 413
