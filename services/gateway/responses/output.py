"""What a Responses run has produced and how it is shown.

``Output`` holds the run's items by output index across every model turn (those done, those
still streaming); ``ItemView`` decides how a parsed item appears to the client: an MCP call, a
web search, a reasoning item with a sealed copy or a summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.messages.items import (
    ConversationItem,
    FunctionCallItem,
    McpApprovalRequestItem,
    McpCallItem,
    ReasoningItem,
)
from services.gateway.responses.items import output_item


@dataclass
class ItemView:
    """How parsed items are shown: calls into an MCP server's namespace as ``mcp_call`` (or
    ``mcp_approval_request``), python/container calls as reasoning (as vLLM does), reasoning
    with a sealed copy (``include: reasoning.encrypted_content``) and a summary."""

    mcp_labels: frozenset[str] = frozenset()
    needs_approval: Callable[[str, str], bool] = lambda label, name: False
    seal: Callable[[str], str] | None = None
    summary: bool = False

    def show(self, item: ConversationItem) -> ConversationItem:
        if isinstance(item, FunctionCallItem):
            if item.namespace in self.mcp_labels:
                suffix = (item.id or "").split("_", 1)[-1]
                if self.needs_approval(item.namespace, item.name):
                    return McpApprovalRequestItem(
                        id=f"mcpr_{suffix}", server_label=item.namespace, name=item.name, arguments=item.arguments
                    )
                return McpCallItem(
                    id=f"mcp_{suffix}",
                    server_label=item.namespace,
                    name=item.name,
                    arguments=item.arguments,
                    status=item.status,
                )
            if item.namespace in ("python", "container"):
                return ReasoningItem(id=item.id, text=item.arguments, status=item.status)
        return item

    def json(self, item: ConversationItem, *, streaming_start: bool = False) -> Any:
        return output_item(item, streaming_start=streaming_start, seal=self.seal, summary=self.summary)


@dataclass
class Open:
    item: ConversationItem
    texts: list[str] = field(default_factory=list)


@dataclass
class Output:
    """Everything the run has produced, by output index."""

    done: dict[int, ConversationItem] = field(default_factory=dict)
    open: dict[int, Open] = field(default_factory=dict)
    offset: int = 0  # output_index of the current model turn's first item
    turn_max: int = -1  # highest local index seen in the current turn
    seq: int = 0

    @property
    def items(self) -> list[ConversationItem]:
        return [self.done[i] for i in sorted(self.done)]

    def indexed(self) -> list[tuple[int, ConversationItem]]:
        return sorted(self.done.items())

    def turn_items(self) -> list[ConversationItem]:
        return [self.done[i] for i in sorted(self.done) if i >= self.offset]

    @property
    def next_index(self) -> int:
        return self.offset + self.turn_max + 1

    def next_turn(self) -> None:
        self.offset = self.next_index
        self.turn_max = -1
