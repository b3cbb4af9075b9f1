"""gateway -> dispatcher: generate from prompt token ids; dispatcher -> parser: token stream."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from contracts.errors import BusError
from contracts.messages.base import Contract

EngineFinishReason = Literal["stop", "length", "abort", "error"]


class SamplingParams(Contract):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)


class GenerateRequest(Contract):
    kind: Literal["generate"] = "generate"
    request_id: str
    model: str
    prompt_token_ids: list[int]
    stop_token_ids: list[int]
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    selection_text: str = ""
    token_subject: str  # where the dispatcher streams TokenBatch messages


class GenerateAccepted(Contract):
    kind: Literal["accepted"] = "accepted"
    worker: str  # the engine worker's URL
    engine: str  # vllm | sglang | sim


GenerateReply = Annotated[GenerateAccepted | BusError, Field(discriminator="kind")]


class EngineUsage(Contract):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None


class TokenBatch(Contract):
    """Token ids as the engine delivered them (a delta, in order; ``seq`` from 0).

    The last batch of a request has ``done=True`` with finish_reason and usage, or error."""

    kind: Literal["tokens"] = "tokens"
    request_id: str
    seq: int
    token_ids: list[int] = Field(default_factory=list)
    done: bool = False
    finish_reason: EngineFinishReason | None = None
    stop_token_id: int | None = None
    usage: EngineUsage | None = None
    error: BusError | None = None
