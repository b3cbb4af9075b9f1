"""What the tracing tests read traces with: an OTLP/HTTP trace receiver in the test process
(POST /v1/traces, protobuf bodies, decoded as a collector such as Jaeger or the OpenTelemetry
Collector would), the spans it got, and the checks made of one request's trace: one tree under
the gateway's span, the GenAI semantic-convention attributes, the engine call's span, and
nothing of the request outside its trace."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tests.e2e.conftest import MODEL, RunningStack

SPANS_WITHIN_S = 20.0
# `chorus up` runs the encoder, the dispatcher and the parser in worker processes, which trace
# as one service
GATEWAY, ENCODER, DISPATCHER, PARSER, TOOLS = (
    f"chorus-{s}" for s in ("gateway", "worker", "worker", "worker", "tools")
)
GENAI = f"chat {MODEL}"  # the gateway's span of an API request, both APIs
ENGINE = f"text_completion {MODEL}"
TURN = "responses.turn"


@dataclass(frozen=True)
class SeenSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any]
    events: tuple[str, ...]


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _decode(body: bytes) -> list[SeenSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    SeenSpan(
                        service=resource.get("service.name", ""),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events=tuple(e.name for e in span.events),
                    )
                )
    return out


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port: POST /v1/traces, protobuf bodies."""

    def __init__(self) -> None:
        self.spans: list[SeenSpan] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(_decode(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seen(self) -> list[SeenSpan]:
        with self._changed:
            return list(self.spans)

    def add(self, spans: list[SeenSpan]) -> None:
        with self._changed:
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait(self, done: Callable[[list[SeenSpan]], bool], timeout: float = SPANS_WITHIN_S) -> list[SeenSpan]:
        """The spans received once ``done`` says they are all there (woken by each export), or
        at ``timeout`` (the assertions then say what is missing)."""
        with self._changed:
            self._changed.wait_for(lambda: done(list(self.spans)), timeout)
            return list(self.spans)

    async def trace_of(
        self, response_id: str, expected: dict[tuple[str, str], int], caller_span: str = ""
    ) -> list[SeenSpan]:
        """The spans of the trace of the request ``response_id``, once it holds at least
        ``expected[(service, name)]`` spans of each kind and its tree is closed: every span's
        parent is in it, but for the root's, which is the caller's span (none: the trace's
        first). (The HTTP framework's server span, the root, ends after the response went out:
        it may come in a later export than the spans under it.)"""

        def complete(spans: list[SeenSpan]) -> bool:
            trace = in_trace(spans, response_id)
            roots = tops(trace)
            return (
                len(roots) == 1
                and roots[0].parent_id == caller_span
                and all(count(trace, *key) >= n for key, n in expected.items())
            )

        return in_trace(await asyncio.to_thread(self.wait, complete), response_id)


def in_trace(spans: list[SeenSpan], response_id: str) -> list[SeenSpan]:
    """The spans of the trace holding the gateway's GenAI span of ``response_id``."""
    genai = [s for s in spans if s.service == GATEWAY and s.attributes.get("gen_ai.response.id") == response_id]
    return [s for s in spans if genai and s.trace_id == genai[0].trace_id]


def tops(trace: list[SeenSpan]) -> list[SeenSpan]:
    """The spans whose parent is not in the trace: the root (and any orphan)."""
    ids = {s.span_id for s in trace}
    return [s for s in trace if s.parent_id not in ids]


def count(spans: list[SeenSpan], service: str, name: str) -> int:
    return sum(1 for s in spans if s.service == service and s.name == name)


def one(spans: list[SeenSpan], service: str, name: str) -> SeenSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, f"{len(found)} {service} {name!r} span(s) in {tree(spans)}"
    return found[0]


def tree(trace: list[SeenSpan]) -> str:
    """The trace as an indented tree of ``name [service]`` lines (assertion messages)."""
    lines: list[str] = []

    def walk(span: SeenSpan, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name} [{span.service}]")
        for child in trace:
            if child.parent_id == span.span_id:
                walk(child, depth + 1)

    for top in tops(trace):
        walk(top, 0)
    return "\n" + "\n".join(lines)


def assert_one_tree(trace: list[SeenSpan], caller_span: str = "") -> SeenSpan:
    """One trace id, one root (a gateway server span: the HTTP framework's, or the GenAI span
    when the framework makes none), every other span's parent in the trace. The GenAI span."""
    assert trace, "no trace"
    assert len({s.trace_id for s in trace}) == 1
    assert len({s.span_id for s in trace}) == len(trace)
    (root, *orphans) = tops(trace)
    assert not orphans, f"spans whose parent is not in the trace: {tree(trace)}"
    assert root.parent_id == caller_span
    assert root.service == GATEWAY and root.kind == PbSpan.SPAN_KIND_SERVER, tree(trace)
    by_id = {s.span_id: s for s in trace}
    genai = one(trace, GATEWAY, GENAI)
    if root is not genai:  # the framework's server span, named after the route (semantic conventions)
        route = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}[str(genai.attributes["chorus.api"])]
        assert (root.name, root.attributes.get("http.route")) == (f"POST {route}", route)
    above = genai
    while above is not root:  # only the gateway's own (framework) spans above the GenAI span
        above = by_id[above.parent_id]
        assert above.service == GATEWAY, tree(trace)
    assert genai.kind == (PbSpan.SPAN_KIND_SERVER if genai is root else PbSpan.SPAN_KIND_INTERNAL)
    return genai


def assert_genai(
    span: SeenSpan, *, response_id: str, api: str, max_tokens: int, temperature: float, top_p: float
) -> None:
    """The GenAI semantic-convention attributes of the gateway's span."""
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["chorus.api"] == api
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == max_tokens
    assert a["gen_ai.request.temperature"] == pytest.approx(temperature)
    assert a["gen_ai.request.top_p"] == pytest.approx(top_p)
    assert a["gen_ai.response.id"] == response_id
    assert isinstance(a["gen_ai.response.finish_reasons"], list) and a["gen_ai.response.finish_reasons"]
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert "first_token" in span.events and a["gen_ai.response.time_to_first_chunk"] > 0


def assert_engine_span(span: SeenSpan, stack: RunningStack) -> None:
    """The dispatcher's engine call: a GenAI client span naming its worker, with its TTFT."""
    assert span.kind == PbSpan.SPAN_KIND_CLIENT
    assert "first_token" in span.events
    assert span.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert span.attributes["chorus.engine.worker"] == stack.engine_url
    assert span.attributes["gen_ai.usage.output_tokens"] > 0
    assert span.attributes["gen_ai.response.finish_reasons"]


def assert_whole(receiver: Receiver, request_id: str, trace: list[SeenSpan]) -> None:
    """Nothing of the request outside its trace: no generation of it elsewhere, no HTTP span
    of the API in a trace of its own; and no span named after a reply inbox anywhere."""
    spans = receiver.seen()
    elsewhere = [
        s
        for s in spans
        if str(s.attributes.get("chorus.generation_id", "")).startswith(request_id) and s.trace_id != trace[0].trace_id
    ]
    assert not elsewhere, f"spans of {request_id} in other traces: {elsewhere}"
    with_genai = {s.trace_id for s in spans if s.name == GENAI}
    api_routes = ("/v1/chat/completions", "/v1/responses")
    split = [s for s in spans if s.attributes.get("http.route") in api_routes and s.trace_id not in with_genai]
    assert not split, f"HTTP spans of API requests in traces of their own: {split}"
    assert not [s.name for s in spans if s.name.startswith("_INBOX")]
