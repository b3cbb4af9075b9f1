"""What one model turn of a Responses run asks for: the prompt to encode (the conversation so
far, the tools, the tool choice, the text format), how to sample, and how to parse the answer."""

from __future__ import annotations

from typing import Literal

from contracts.messages.encode import EncodeRequest, FunctionTool, NamedToolChoice, ResponseFormat, ToolNamespace
from contracts.messages.generate import ParseSpec, SamplingParams
from contracts.messages.items import ConversationItem
from services.gateway import structured
from services.gateway.context import GatewayContext
from services.gateway.generation import GenerationSpec, RenderedPrompt
from services.gateway.responses.request import (
    NamedFunction,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """The request's ``text.format`` as the encoder and the engine's grammar take it."""
    fmt = req.text.format if req.text else None
    if isinstance(fmt, TextFormatJsonSchema):
        return structured.response_format(
            "json_schema", name=fmt.name, schema=fmt.schema_, description=fmt.description, strict=fmt.strict
        )
    if isinstance(fmt, TextFormatJsonObject):
        return structured.response_format("json_object")
    return None


def turn_spec(
    ctx: GatewayContext,
    req: ResponsesRequest,
    *,
    request_id: str,
    turn: int,
    items: list[ConversationItem],
    mcp_namespaces: list[ToolNamespace],
    completion_tokens: int,
    trace: dict[str, str] | None = None,
    remember: bool = False,
    after: RenderedPrompt | None = None,
) -> GenerationSpec | None:
    """Model turn ``turn`` over ``items`` (the visible conversation so far), offering the
    request's tools and ``mcp_namespaces``; None when the ``completion_tokens`` the response
    has used already spend its ``max_output_tokens``."""
    limit = req.max_output_tokens
    if limit is not None:
        limit -= completion_tokens
        if limit <= 0:
            return None
    functions = [
        FunctionTool(name=t.name, description=t.description, parameters=t.parameters) for t in req.function_tools()
    ]
    namespaces = [
        ToolNamespace(
            name=ns.name,
            description=ns.description,
            tools=[FunctionTool(name=t.name, description=t.description, parameters=t.parameters) for t in ns.tools],
        )
        for ns in req.namespace_tools()
    ]
    namespaces += mcp_namespaces
    choice: Literal["auto", "none", "required"] | NamedToolChoice = "auto"
    if isinstance(req.tool_choice, NamedFunction):
        choice = NamedToolChoice(name=req.tool_choice.name)
    elif req.tool_choice is not None:
        choice = req.tool_choice
    fmt = response_format(req)
    encode = EncodeRequest(
        model=req.model,
        items=items,
        instructions=req.instructions,
        response_format=fmt,
        tools=functions,
        namespaces=namespaces,
        tool_choice=choice,
        builtin_tools=[b for b in req.builtin_tools() if b in ctx.settings.builtin_tools],
        reasoning_effort=req.effort,
        truncation=req.truncation or "disabled",
        remember=remember,
    )
    offered = [] if choice == "none" else req.function_tools()
    parse = ParseSpec(
        request_id=request_id,
        turn=turn,
        tool_names=[t.name for t in offered],
        namespaces=[ns.name for ns in namespaces],
        tool_schemas={t.name: t.parameters or {} for t in offered},
    )
    named = req.tool_choice.name if isinstance(req.tool_choice, NamedFunction) else req.tool_choice
    sampling = SamplingParams(
        max_tokens=limit or ctx.settings.default_max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        constraint=structured.constraint(fmt, named, [t.name for t in req.function_tools()]),
    )
    return GenerationSpec(encode, sampling, parse, trace, after)
