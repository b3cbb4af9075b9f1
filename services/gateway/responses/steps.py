"""What a Responses run yields and how another replica takes it over: a ``Step`` (one batch of
events and what was behind them), a ``RunCheckpoint`` (the run's state before a model turn,
stored for a background response) and a ``Resume`` (where a taken-over run continues); and
usage summed over a run's model turns."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from contracts.messages.items import ConversationItem
from contracts.messages.parse import ParseEvent, Usage
from services.gateway.responses.events import Event
from services.gateway.responses.output import Output
from services.gateway.responses.tool_loop import ToolLoop


class RunCheckpoint(BaseModel):
    """A run's state before a model turn: enough for another replica to continue it."""

    turn: int
    done: dict[int, ConversationItem]
    offset: int
    seq: int
    usage: Usage
    calls_run: int = 0
    history: dict[int, list[ConversationItem]] = Field(default_factory=dict)

    @classmethod
    def taken(cls, turn: int, output: Output, usage: Usage, tools: ToolLoop) -> RunCheckpoint:
        """The run's state before model turn ``turn`` (nothing is streaming then)."""
        return cls(
            turn=turn,
            done=dict(output.done),
            offset=output.offset,
            seq=output.seq,
            usage=usage,
            calls_run=tools.calls_run,
            history=dict(tools.history),
        )

    def restore(self, output: Output, tools: ToolLoop) -> Usage:
        """The run's output and tool loop as they were; returns its usage then."""
        output.done = dict(self.done)
        output.open = {}
        output.offset, output.turn_max, output.seq = self.offset, -1, self.seq
        tools.calls_run = self.calls_run
        tools.history = dict(self.history)
        return self.usage


@dataclass
class Resume:
    """Where a taken-over run continues: its last checkpoint, and the parse events and tokens
    of the turn that was under way."""

    checkpoint: RunCheckpoint | None
    parsed: list[ParseEvent] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One batch of a run: the events to send, and what was behind them."""

    events: list[Event]
    parsed: list[ParseEvent] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    turn: int = 0
    checkpoint: RunCheckpoint | None = None


def added(a: Usage, b: Usage) -> Usage:
    """Usage over two model turns (cached tokens unknown when neither knows them)."""
    cached = (
        None if a.cached_tokens is None and b.cached_tokens is None else (a.cached_tokens or 0) + (b.cached_tokens or 0)
    )
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
        cached_tokens=cached,
    )
