"""One sample of every contract model, with every field set to a value other than its default,
so a field that stops crossing the wire (dropped, excluded, renamed, mis-serialised) changes the
decoded object and fails the round-trip tests."""

from __future__ import annotations

import importlib
import pkgutil

from pydantic import BaseModel

import contracts.messages
from contracts.errors import BusError, ErrorCode
from contracts.messages.base import Contract
from contracts.messages.control import Cancel, CancelResponse, Heartbeat, MetricsRequest, MetricsSnapshot
from contracts.messages.encode import (
    CountRequest,
    EncodeRequest,
    FunctionTool,
    NamedToolChoice,
    PromptContinuation,
    ResponseFormat,
    TokenCount,
    ToolNamespace,
)
from contracts.messages.generate import (
    EngineUsage,
    EventFrame,
    GenerateJob,
    GenerateRequest,
    GenerationAccepted,
    GenerationFailed,
    OutputConstraint,
    ParsedBatch,
    ParseSpec,
    Route,
    SamplingParams,
    TokenBatch,
    TokenFrame,
)
from contracts.messages.items import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    McpToolInfo,
    MessageItem,
    ReasoningItem,
)
from contracts.messages.parse import Failed, Finished, ItemAdded, ItemDelta, ItemDone, Usage
from contracts.messages.routing import RouteNote, RoutingSnapshot, SnapshotRequest
from contracts.messages.tools import CallToolRequest, ListToolsRequest, McpServer, ToolResult, ToolsListed

# text that needs escaping in JSON: quotes, backslashes, control characters, non-BMP characters
TRICKY = 'a "quoted" \\ back\tslash\n\x00 — 日本語 🎵 \u2028 end'
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "x": [1, 2.5, None, True]}

# the tag (``kind`` / ``type``) of a model has one possible value: it cannot differ from its default
TAGS = ("kind", "type")


def all_contract_classes() -> set[type[BaseModel]]:
    """Every ``Contract`` subclass defined in ``contracts.messages``, and ``BusError``."""
    for module in pkgutil.iter_modules(contracts.messages.__path__, "contracts.messages."):
        importlib.import_module(module.name)
    found: set[type[BaseModel]] = {BusError}
    todo: list[type[BaseModel]] = [Contract]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("contracts.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


bus_error = BusError(code=ErrorCode.ENGINE_ERROR, message=TRICKY, param="input[0]", retryable=True)

# items ------------------------------------------------------------------------------------
message_item = MessageItem(role="assistant", content=TRICKY, id="msg_1", status="incomplete", channel="final")
reasoning_item = ReasoningItem(text="thinking… ∑", id="rs_1", status="in_progress")
function_call_item = FunctionCallItem(
    call_id="call_1",
    name="get_weather",
    arguments='{"city": "Zürich"}',
    namespace="mcp_srv",
    id="fc_1",
    status="incomplete",
)
function_call_output_item = FunctionCallOutputItem(call_id="call_1", output="12°C", id="fco_1", status="in_progress")
mcp_tool_info = McpToolInfo(name="search", description="Search", input_schema=SCHEMA, annotations={"readOnly": True})
mcp_list_tools_item = McpListToolsItem(id="mcpl_1", server_label="srv", tools=[mcp_tool_info], error="partial")
mcp_call_item = McpCallItem(
    id="mcp_1",
    server_label="srv",
    name="search",
    arguments="{}",
    output="found",
    error="none",
    approval_request_id="mcpr_1",
    status="incomplete",
)
mcp_approval_request_item = McpApprovalRequestItem(id="mcpr_1", server_label="srv", name="search", arguments="{}")
mcp_approval_response_item = McpApprovalResponseItem(
    approval_request_id="mcpr_1", approve=True, id="mcpa_1", reason="ok"
)
compaction_item = CompactionItem(summary="earlier: greetings", id="cmp_1", sealed="b64blob==")

# encode ------------------------------------------------------------------------------------
function_tool = FunctionTool(name="get_weather", description="Weather now", parameters=SCHEMA)
tool_namespace = ToolNamespace(name="srv", description="An MCP server", tools=[function_tool])
named_tool_choice = NamedToolChoice(name="get_weather")
response_format = ResponseFormat(name="answer", description="The answer", json_schema=SCHEMA, strict=True)
encode_request = EncodeRequest(
    model="gpt-oss-120b",
    items=[
        message_item,
        reasoning_item,
        function_call_item,
        function_call_output_item,
        mcp_list_tools_item,
        mcp_call_item,
        mcp_approval_request_item,
        mcp_approval_response_item,
        compaction_item,
    ],
    instructions="Be brief.",
    tools=[function_tool],
    namespaces=[tool_namespace],
    tool_choice=named_tool_choice,
    reasoning_effort="high",
    builtin_tools=["browser", "python"],
    response_format=response_format,
    current_date="2025-08-05",
    truncation="auto",
    remember=True,
    continues=(prompt_continuation := PromptContinuation(key="chatcmpl-1.0.0", length=4)),
)

# parse ---------------------------------------------------------------------------------------
usage = Usage(prompt_tokens=11, completion_tokens=22, reasoning_tokens=5, cached_tokens=3)
item_added = ItemAdded(output_index=1, item=function_call_item)
item_delta = ItemDelta(output_index=2, delta=TRICKY)
item_done = ItemDone(output_index=3, item=reasoning_item)
finished = Finished(finish_reason="stop", usage=usage, recoveries=["unclosed_json"], stop_sequence="END")
failed = Failed(error=bus_error, usage=usage)

# generate ------------------------------------------------------------------------------------
output_constraint = OutputConstraint(final_schema=SCHEMA, tools=["get_weather"], namespace="srv")
sampling_params = SamplingParams(
    max_tokens=512,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    presence_penalty=-1.5,
    frequency_penalty=0.25,
    seed=42,
    stop=["\n\n", "END"],
    constraint=output_constraint,
)
parse_spec = ParseSpec(
    request_id="resp_1", turn=2, tool_names=["get_weather"], namespaces=["srv"], tool_schemas={"get_weather": SCHEMA}
)
route = Route(gateway="gw1", parser="p1")
trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
generate_job = GenerateJob(
    generation_id="gen_1",
    encode=encode_request,
    sampling=sampling_params,
    parse=parse_spec,
    route=route,
    deadline=1754400000.125,
    resume_tokens=[200005, 17, 0],
    trace=trace,
)
generate_request = GenerateRequest(
    generation_id="gen_1",
    model="gpt-oss-120b",
    prompt_token_ids=[200006, 17360, 200008],
    stop_token_ids=[200002],
    resume_tokens=[1, 2],
    sampling=sampling_params,
    selection_text=TRICKY,
    parse=parse_spec,
    route=route,
    deadline=1754400000.5,
    render_ms=3.25,
    trace=trace,
)
engine_usage = EngineUsage(prompt_tokens=100, completion_tokens=7, cached_tokens=64)
token_batch = TokenBatch(
    generation_id="gen_1",
    offset=2,
    token_ids=[200005, 35644, 200008],
    open=parse_spec,
    gateway="gw1",
    trace=trace,
    done=True,
    finish_reason="length",
    stop_token_id=200012,
    stop_text="END",
    usage=engine_usage,
    error=bus_error,
)
token_frame = TokenFrame(batches=[token_batch, TokenBatch(generation_id="gen_2", offset=9, token_ids=[5])])
generation_accepted = GenerationAccepted(
    generation_id="gen_1", dispatcher="d1", worker="w1", engine="vllm", prompt_tokens=100, render_ms=1.5
)
generation_failed = GenerationFailed(generation_id="gen_1", stage="dispatcher", error=bus_error)
parsed_batch = ParsedBatch(
    generation_id="gen_1",
    offset=4,
    token_ids=[1, 2, 3],
    events=[item_added, item_delta, item_done, finished, failed],
    parser="p1",
)
event_frame = EventFrame(events=[generation_accepted, generation_failed, parsed_batch])

# control ------------------------------------------------------------------------------------
cancel = Cancel(generation_id="gen_1", reason="deadline")
heartbeat = Heartbeat(
    service="parser",
    instance="p1",
    interval_s=0.25,
    ready=False,
    detail="warming up",
    load=3,
    draining=True,
    stopping=True,
    simulated=True,
)
cancel_response = CancelResponse(response_id="resp_1")
metrics_request = MetricsRequest()
metrics_snapshot = MetricsSnapshot(service="parser", instance="p1", exposition="# TYPE x counter\nx_total 1\n")

# tools --------------------------------------------------------------------------------------
mcp_server = McpServer(
    server_label="srv",
    server_url="https://mcp.example/sse",
    headers={"Authorization": "Bearer t"},
    server_description="Example",
)
list_tools_request = ListToolsRequest(request_id="req_1", server=mcp_server)
tools_listed = ToolsListed(server_label="srv", tools=[mcp_tool_info], error="slow")
call_tool_request = CallToolRequest(
    request_id="req_1", server=mcp_server, name="search", arguments='{"q": "ü"}', timeout_s=2.5
)
tool_result = ToolResult(output=TRICKY, error="partial", truncated=True)

count_request = CountRequest(encode=encode_request)
token_count = TokenCount(tokens=1234)
route_note = RouteNote(
    dispatcher="d1",
    generation_id="g1",
    engine="http://gpu1:8000",
    phase="decode",
    prefill_tokens=300,
    context_tokens=5000,
    block_size=16,
    blocks=[1, 2, 3],
)
snapshot_request = SnapshotRequest(dispatcher="d2")
routing_snapshot = RoutingSnapshot(
    index={"v": 1, "engines": []},
    kv_seq={"http://gpu1:8000": 7},
    in_flight=[route_note],
    served_ago={"http://gpu1:8000": 1.5},
)

SAMPLES: dict[type[BaseModel], BaseModel] = {
    type(sample): sample
    for sample in (
        bus_error,
        message_item,
        reasoning_item,
        function_call_item,
        function_call_output_item,
        mcp_tool_info,
        mcp_list_tools_item,
        mcp_call_item,
        mcp_approval_request_item,
        mcp_approval_response_item,
        compaction_item,
        function_tool,
        tool_namespace,
        named_tool_choice,
        response_format,
        prompt_continuation,
        encode_request,
        usage,
        item_added,
        item_delta,
        item_done,
        finished,
        failed,
        output_constraint,
        sampling_params,
        parse_spec,
        route,
        generate_job,
        generate_request,
        engine_usage,
        token_batch,
        token_frame,
        generation_accepted,
        generation_failed,
        parsed_batch,
        event_frame,
        cancel,
        heartbeat,
        cancel_response,
        metrics_request,
        metrics_snapshot,
        mcp_server,
        list_tools_request,
        tools_listed,
        call_tool_request,
        tool_result,
        count_request,
        token_count,
        route_note,
        snapshot_request,
        routing_snapshot,
    )
}
