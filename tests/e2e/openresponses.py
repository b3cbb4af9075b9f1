"""The Open Responses OpenAPI document (tests/fixtures/openresponses/openapi.json, version
2026-04-24) as JSON Schema validators, and raw-HTTP helpers that check what they read against
it: a response object posted, streamed or retrieved, each streamed event, an SSE body read
event by event.

Schemas are the document's own components, resolved by ``$ref``; nothing is loosened except the
few places (below) where OpenAI and the document disagree and Chorus follows OpenAI."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).parents[1] / "fixtures" / "openresponses" / "openapi.json"
SPEC_URI = "urn:openresponses:openapi"
SPEC_VERSION = "2026-04-24"

# Where OpenAI (openai-python's types, the ground truth for OpenAI) and the Open Responses
# document disagree, Chorus follows OpenAI. Each difference is one narrow change to the
# document, made here and nowhere else; everything else about the object is still checked
# (and test_openresponses_spec.py notices when the document moves).
OPENAI_EVENT_NAMES = {  # OpenAI's event type -> the document's schema for the same event
    # ResponseReasoningTextDeltaEvent / ResponseReasoningTextDoneEvent: OpenAI streams raw
    # reasoning as response.reasoning_text.*, the document as response.reasoning.*
    "response.reasoning_text.delta": "ResponseReasoningDeltaStreamingEvent",
    "response.reasoning_text.done": "ResponseReasoningDoneStreamingEvent",
}
# The document types the echoed text.format.schema as null; OpenAI echoes the schema object
# the request gave (ResponseFormatTextJSONSchemaConfig.schema: Dict[str, object], required).
OPENAI_JSON_SCHEMA_FORMAT_SCHEMA = {"type": "object"}


def load_document() -> dict[str, Any]:
    """The document as it is (its version checked)."""
    spec: dict[str, Any] = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    assert spec["info"]["version"] == SPEC_VERSION
    return spec


def _spec() -> dict[str, Any]:
    """The document, with OpenAI's side of each deliberate difference."""
    spec = load_document()
    schemas = spec["components"]["schemas"]
    for openai_name, document_name in OPENAI_EVENT_NAMES.items():
        renamed = copy.deepcopy(schemas[document_name])
        renamed["properties"]["type"]["enum"] = [openai_name]
        renamed["properties"]["type"]["default"] = openai_name
        schemas[f"OpenAI:{openai_name}"] = renamed
    schemas["JsonSchemaResponseFormat"]["properties"]["schema"] = OPENAI_JSON_SCHEMA_FORMAT_SCHEMA
    return spec


SPEC = _spec()
REGISTRY: Registry = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(SPEC))


def _validator(name: str) -> Draft202012Validator:
    assert name in SPEC["components"]["schemas"], name
    return Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=REGISTRY)


def _event_schemas() -> dict[str, str]:
    """Event ``type`` -> schema name: the document's ``text/event-stream`` union, plus OpenAI's
    names for the reasoning text events."""
    union = SPEC["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    out = {}
    for ref in union["oneOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        (kind,) = SPEC["components"]["schemas"][name]["properties"]["type"]["enum"]
        out[kind] = name
    for kind in OPENAI_EVENT_NAMES:
        out[kind] = f"OpenAI:{kind}"
    return out


EVENT_SCHEMAS = _event_schemas()
RESPONSE = _validator("ResponseResource")
COMPACTED = _validator("CompactResource")
ERROR_PAYLOAD = _validator("ErrorPayload")
WEBSOCKET_ERROR = _validator("WebSocketErrorEvent")
EVENTS = {kind: _validator(name) for kind, name in EVENT_SCHEMAS.items()}


def _explain(error: ValidationError) -> list[ValidationError]:
    """The errors under a failed ``oneOf``/``anyOf`` in the branch the object meant (the one
    its ``type`` discriminator and JSON type fit), else the error itself."""
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = defaultdict(list)
    for sub in error.context:
        branches[sub.relative_schema_path[0]].append(sub)
    meant = [
        errors
        for errors in branches.values()
        if not any(
            (list(e.relative_path) == ["type"] and e.validator in ("enum", "const"))
            or (not e.relative_path and e.validator == "type")
            for e in errors
        )
    ]
    if len(meant) != 1:
        return [error]
    return [leaf for sub in meant[0] for leaf in _explain(sub)]


def conforms(validator: Draft202012Validator, instance: Any, what: str) -> None:
    errors = [leaf for e in validator.iter_errors(instance) for leaf in _explain(e)]
    errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError(
            f"{what} does not conform to Open Responses {SPEC_VERSION}:\n"
            + "\n".join(lines)
            + f"\n{json.dumps(instance)[:3000]}"
        )


def event_conforms(event: dict[str, Any]) -> None:
    kind = event.get("type")
    assert kind in EVENTS, f"{kind!r} is not an Open Responses streaming event: {event}"
    conforms(EVENTS[kind], event, f"event {kind} (sequence_number {event.get('sequence_number')})")


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of an SSE body, each checked to name its ``type`` on its ``event:`` line."""
    name: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())
        elif not line and data:
            event = json.loads("\n".join(data))
            assert name is None or name == event.get("type"), (name, event.get("type"))
            yield event
            name, data = None, []
    assert not data, "the stream ended inside an event"


def post(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    payload: dict[str, Any] = r.json()
    conforms(RESPONSE, payload, f"the response to {json.dumps(body)[:200]}")
    return payload


def stream(http: httpx.Client, body: dict[str, Any], path: str = "/v1/responses") -> list[dict[str, Any]]:
    method = "POST" if path == "/v1/responses" else "GET"
    with http.stream(method, path, json={**body, "stream": True} if method == "POST" else None) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    for event in events:
        event_conforms(event)
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    return events


def retrieved(http: httpx.Client, response_id: str) -> dict[str, Any]:
    r = http.get(f"/v1/responses/{response_id}")
    assert r.status_code == 200, r.text
    payload: dict[str, Any] = r.json()
    conforms(RESPONSE, payload, f"GET /v1/responses/{response_id}")
    return payload


def output_types(payload: dict[str, Any]) -> list[str]:
    return [item["type"] for item in payload["output"]]
