"""The ``Response`` object (openai.types.responses.Response): every field, with the values
actually used (defaults included), the tools echoed normalised; and the form it is stored in."""

from __future__ import annotations

import time
from typing import Any, Literal, Self

from openai.types.responses import Response
from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, PrivateAttr, model_serializer, model_validator

from contracts.messages.parse import Usage
from services.gateway.responses.request import (
    BuiltinToolParam,
    FunctionToolParam,
    McpToolParam,
    NamedFunction,
    NamespaceToolParam,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    ToolParam,
)


class ResponseObject(Response):
    """openai-python's ``Response`` with its timestamps as the integers OpenAI sends (and the
    Open Responses document requires): openai-python types them ``float``, which writes
    ``1700000000.0``. Inside an event it is written as the event's declared ``Response`` (float
    again) unless the dump passes ``serialize_as_any=True``."""

    created_at: int
    completed_at: int | None = None


Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
# the events a response stream ends with (a cancelled one ends with response.failed)
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
DEFAULT_TEMPERATURE = 1.0  # gpt-oss's recommended sampling (and the engines' defaults)
DEFAULT_TOP_P = 1.0


class ResponseBody(BaseModel):
    """A Response object as stored (``store.StoredResponse``): the fields Chorus reads, typed;
    every other field kept as it came. It is written back (to Redis, to the API) exactly as
    given, its keys in their order with the typed ones among them: a stored response
    round-trips byte for byte, and nothing is validated beyond the fields read."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str
    status: Status
    background: bool
    _keys: tuple[str, ...] = PrivateAttr(default=())  # the order the object came in

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        body = handler(data)
        if isinstance(data, dict):
            body._keys = tuple(data)
        return body

    @model_serializer
    def _as_given(self) -> dict[str, Any]:
        given = {**self.__dict__, **(self.__pydantic_extra__ or {})}
        return {key: given[key] for key in self._keys or given}


def _function(t: FunctionToolParam) -> dict[str, Any]:
    return {
        "type": "function",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters or {"type": "object", "properties": {}},
        "strict": bool(t.strict),
    }


def echo_tool(t: ToolParam) -> dict[str, Any]:
    """A request tool as the response echoes it (normalised; MCP credentials never shown)."""
    if isinstance(t, FunctionToolParam):
        return _function(t)
    if isinstance(t, NamespaceToolParam):
        return {
            "type": "namespace",
            "name": t.name,
            "description": t.description or "",
            "tools": [_function(f) for f in t.tools],
        }
    if isinstance(t, McpToolParam):
        return {
            "type": "mcp",
            "server_label": t.server_label,
            "server_url": t.server_url,
            "server_description": t.server_description,
            "allowed_tools": t.allowed_tools
            if isinstance(t.allowed_tools, list) or t.allowed_tools is None
            else t.allowed_tools.model_dump(exclude_none=True),
            "require_approval": t.require_approval
            if isinstance(t.require_approval, str) or t.require_approval is None
            else t.require_approval.model_dump(exclude_none=True),
        }
    if isinstance(t, BuiltinToolParam) and t.type == "code_interpreter":
        return {"type": "code_interpreter", "container": {"type": "auto"}}
    return {"type": "web_search"}


def _text(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text else None
    verbosity = (req.text.verbosity if req.text else None) or "medium"
    if isinstance(fmt, TextFormatJsonSchema):
        out = {
            "type": "json_schema",
            "name": fmt.name,
            "description": fmt.description,
            "schema": fmt.schema_,
            "strict": bool(fmt.strict),
        }  # description null when not given (always present)
        return {"format": out, "verbosity": verbosity}
    kind = "json_object" if isinstance(fmt, TextFormatJsonObject) else "text"
    return {"format": {"type": kind}, "verbosity": verbosity}


def usage_of(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "output_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


def build_response(
    req: ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    status: Status,
    completed_at: int | None = None,
    output: list[Any],
    usage: Usage | None,
    error: dict[str, str] | None = None,
    incomplete_reason: str | None = None,
) -> ResponseObject:
    terminal = status in TERMINAL
    choice: Any = req.tool_choice or "auto"
    if isinstance(choice, NamedFunction):
        choice = {"type": "function", "name": choice.name}
    summary = None
    if req.reasoning is not None and req.reasoning.wants_summary:
        summary = req.reasoning.summary or req.reasoning.generate_summary
    return ResponseObject.model_validate(
        {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "completed_at": (completed_at or int(time.time())) if status == "completed" else None,
            "status": status,
            "background": bool(req.background),
            "model": req.model,
            "output": output if terminal else [],
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "tool_choice": choice,
            "tools": [echo_tool(t) for t in req.tools or []],
            "instructions": req.instructions,
            "metadata": req.metadata or {},
            "temperature": req.temperature if req.temperature is not None else DEFAULT_TEMPERATURE,
            "top_p": req.top_p if req.top_p is not None else DEFAULT_TOP_P,
            "presence_penalty": 0.0,  # the Open Responses specification's fields
            "frequency_penalty": 0.0,
            "top_logprobs": 0,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": req.conversation_id} if req.conversation_id else None,
            "reasoning": {"effort": req.effort, "summary": summary},
            "text": _text(req),
            "truncation": req.truncation or "disabled",
            "store": req.stored,
            "user": req.user,
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "service_tier": req.service_tier
            if req.service_tier in ("auto", "default", "flex", "priority")
            else "default",
            "error": error,
            "incomplete_details": {"reason": incomplete_reason} if status == "incomplete" else None,
            "usage": usage_of(usage) if terminal and usage is not None else None,
        }
    )
