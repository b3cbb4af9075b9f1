"""One generation as it moves forward through the services, never back to the gateway:

    gateway --GenerateJob--> encoder --GenerateRequest--> dispatcher --TokenFrame--> parser
       ^                        |                              |                       |
       +------ EventFrame: GenerationFailed ------------------+--- GenerationAccepted  |
       +------ EventFrame: ParsedBatch (typed events, and the tokens they cover) -----+

A ``generation_id`` names one attempt; the gateway starts a new attempt (a new id, with the
tokens already parsed as ``resume_tokens``) when a process on the path dies, so messages of an
abandoned attempt are simply not routed anywhere. The API request id (``ParseSpec.request_id``)
stays the same across attempts: item ids derive from it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract
from contracts.messages.encode import EncodeRequest
from contracts.messages.parse import ParseEvent

EngineFinishReason = Literal["stop", "length", "abort", "error"]
Stage = Literal["gateway", "encoder", "dispatcher", "parser"]


class OutputConstraint(Contract):
    """What the engine must enforce with a grammar (xgrammar structural tags, which constrain
    only the text after a trigger, so the model still reasons first): the final answer's text
    matching ``final_schema``, and/or the next message being a call to one of ``tools``."""

    final_schema: dict[str, Any] | None = None
    tools: list[str] = Field(default_factory=list)  # a call is required: to one of these
    namespace: str = "functions"


class SamplingParams(Contract):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # (Anthropic's Messages API takes it; OpenAI's do not)
    presence_penalty: float | None = None  # [-2, 2], as vLLM and SGLang check it
    frequency_penalty: float | None = None  # [-2, 2]
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    constraint: OutputConstraint | None = None


class ParseSpec(Contract):
    """How the parser reads a generation: which tools the model may call (for recovery) and
    what its item ids derive from (the API request id, the model turn)."""

    request_id: str
    turn: int = 0
    tool_names: list[str] = Field(default_factory=list)  # offered function tools
    namespaces: list[str] = Field(default_factory=list)  # tool namespaces besides functions
    tool_schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Route(Contract):
    """Where a generation's pieces go: events to the owning gateway, tokens to one parser."""

    gateway: str  # instance id of the gateway that owns the generation
    parser: str  # instance id of the parser worker that parses it


class GenerateJob(Contract):
    """gateway -> encoder: everything a generation needs, sent once."""

    kind: Literal["job"] = "job"
    generation_id: str
    encode: EncodeRequest
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    parse: ParseSpec
    route: Route
    deadline: float  # unix time; nobody waits for the generation after it
    resume_tokens: list[int] = Field(default_factory=list)  # output already parsed (an earlier attempt)
    trace: dict[str, str] = Field(default_factory=dict)  # W3C trace context of the request


class GenerateRequest(Contract):
    """encoder -> dispatcher: the rendered prompt and where its tokens go."""

    kind: Literal["generate"] = "generate"
    generation_id: str
    model: str
    prompt_token_ids: list[int]  # the rendered prompt, without ``resume_tokens``
    stop_token_ids: list[int]
    resume_tokens: list[int] = Field(default_factory=list)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    selection_text: str = ""  # the last user message, for worker selection
    parse: ParseSpec
    route: Route
    deadline: float
    render_ms: float = 0.0
    trace: dict[str, str] = Field(default_factory=dict)


class EngineUsage(Contract):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None


class TokenBatch(Contract):
    """Token ids of one generation as the engine delivered them (a delta, in order).

    ``offset`` is the index of ``token_ids[0]`` in the generation's output, resumed tokens
    included. The first batch carries ``open`` (the parser starts a session); the last has
    ``done`` with finish_reason and usage, or ``error``."""

    generation_id: str
    offset: int = 0
    token_ids: list[int] = Field(default_factory=list)
    open: ParseSpec | None = None
    gateway: str = ""  # with ``open``: whose events subject the parser sends to
    trace: dict[str, str] = Field(default_factory=dict)  # with ``open``
    done: bool = False
    finish_reason: EngineFinishReason | None = None
    stop_token_id: int | None = None
    stop_text: str | None = None  # the stop string that ended the output, when one did
    usage: EngineUsage | None = None
    error: BusError | None = None


class TokenFrame(Contract):
    """dispatcher -> one parser worker: the batches of every generation that were ready at
    once (coalesced while the dispatcher was busy, one batch when idle)."""

    kind: Literal["tokens"] = "tokens"
    batches: list[TokenBatch]


class GenerationAccepted(Contract):
    """dispatcher -> gateway: an engine took the generation (it can still fail later)."""

    kind: Literal["accepted"] = "accepted"
    generation_id: str
    dispatcher: str  # the dispatcher instance streaming it
    worker: str  # the engine worker
    engine: str  # vllm | sglang | sim | openai | openai-chat
    prompt_tokens: int = 0
    render_ms: float = 0.0


class GenerationFailed(Contract):
    """encoder or dispatcher -> gateway: the generation could not start."""

    kind: Literal["failed"] = "failed"
    generation_id: str
    stage: Stage
    error: BusError


class ParsedBatch(Contract):
    """parser -> gateway: typed events of one generation, in order, and the output tokens
    they were parsed from (so the gateway can resume the generation elsewhere)."""

    kind: Literal["parsed"] = "parsed"
    generation_id: str
    offset: int  # tokens of the generation parsed before this batch
    token_ids: list[int] = Field(default_factory=list)
    events: list[ParseEvent] = Field(default_factory=list)
    parser: str = ""  # the parser instance (its death is noticed through heartbeats)


GatewayEvent = Annotated[GenerationAccepted | GenerationFailed | ParsedBatch, Field(discriminator="kind")]


class EventFrame(Contract):
    """-> one gateway: events of every generation that were ready at once."""

    kind: Literal["events"] = "events"
    events: list[GatewayEvent]
