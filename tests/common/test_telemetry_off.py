"""Spans without tracing set up (no exporter): the invalid span, made without the propagators'
and the no-op tracer's steps when there is no trace to continue; a caller's trace still
carried on to the next message, as the no-op tracer would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from services.common import telemetry

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(autouse=True)
def not_exporting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_exporting", False)


def no_op(parent: Span | Mapping[str, Any] | None) -> Span:
    """What the no-op tracer makes for ``parent`` (the way without the shortcut)."""
    context = telemetry.extract(parent) if not isinstance(parent, Span) else trace.set_span_in_context(parent)
    return trace.NoOpTracer().start_span("x", context=context)


@pytest.mark.parametrize("parent", [None, {}, {"other": "header"}, trace.INVALID_SPAN])
def test_no_trace_to_continue_is_the_invalid_span_itself(parent: Span | Mapping[str, Any] | None) -> None:
    span = telemetry.child_span("x", parent, SpanKind.CONSUMER, a=1)
    assert span is trace.INVALID_SPAN  # not a new object: the shortcut was taken
    assert span.get_span_context() == no_op(parent).get_span_context()
    assert telemetry.carrier_of(span) == {}


def test_a_callers_trace_is_carried_on() -> None:
    span = telemetry.child_span("x", {"traceparent": TRACEPARENT}, SpanKind.SERVER)
    assert span.get_span_context() == no_op({"traceparent": TRACEPARENT}).get_span_context()
    assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    carrier = telemetry.carrier_of(span)
    assert carrier["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    downstream = telemetry.child_span("y", carrier, SpanKind.CONSUMER)  # the next service's span
    assert downstream.get_span_context().trace_id == span.get_span_context().trace_id
    under_a_span = telemetry.child_span("z", span)
    assert under_a_span.get_span_context().trace_id == span.get_span_context().trace_id


def test_http_headers_are_looked_up_without_regard_to_case() -> None:
    from starlette.datastructures import Headers

    headers = Headers(headers={"Traceparent": TRACEPARENT})  # as a server passes them on
    span = telemetry.child_span("x", headers, SpanKind.SERVER)
    assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
