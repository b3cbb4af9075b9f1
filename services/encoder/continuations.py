"""Prompts an encoder remembers, so that the next turn of a conversation renders only what is
new: a WebSocket chain's next response, a response's next model turn.

A request that asks to be remembered (``EncodeRequest.remember``) leaves its rendered
conversation here under its generation id: the tokens after the system and developer messages
(``body``) and what rendering more of it depends on. A request that continues it
(``EncodeRequest.continues``) carries only the items after the remembered ones; its prompt is
the system and developer messages (from the request, cached), the remembered body, and the new
items' messages: the same tokens as rendering the whole conversation (a test checks), in time
that does not grow with the history.

What rendering more of a conversation changes in what came before is decided by what Harmony's
rendering looks at across messages. A later final answer drops the reasoning before it: so the
remembered body is kept only up to the end of its last final answer (``stable``) when the new
items hold a final answer, and the items after that point (``open_items``: an agent loop's
reasoning, calls and outputs since its last answer) are rendered again with the new ones.
System and developer items and compaction summaries join the developer message: new items
holding any of them, or a request truncating its oldest messages, are refused (``unusable``
says why) and the gateway then sends the whole conversation."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.messages.encode import EncodeRequest, PromptContinuation
from contracts.messages.items import CompactionItem, ConversationItem, FunctionCallItem, MessageItem
from services.common.harmony import CHANNEL, END, FINAL
from services.encoder.render import EncodedPrompt, is_final, recipient_of, selection_text


@dataclass(frozen=True, slots=True)
class Remembered:
    """A rendered conversation, as a continuation needs it."""

    length: int  # the items it was rendered from
    body: array[int]  # its messages' tokens, after the system and developer messages
    stable: int  # the body's tokens up to the end of its last final answer
    open_items: tuple[ConversationItem, ...]  # its items after that answer
    prefix_items: tuple[ConversationItem, ...]  # its items that join the developer message
    recipients: dict[str, str]  # call id -> the tool called (a tool's output is its message)
    selection: str  # the last user message's text


def _joins_developer(item: ConversationItem) -> bool:
    return isinstance(item, CompactionItem) or (isinstance(item, MessageItem) and item.role in ("system", "developer"))


def after_last_final(items: Sequence[ConversationItem]) -> tuple[ConversationItem, ...] | None:
    """The items after the last final answer (None: there is none)."""
    for i in range(len(items) - 1, -1, -1):
        if is_final(items[i]):
            return tuple(items[i + 1 :])
    return None


_FINAL_HEADER = array("I", [CHANNEL, FINAL]).tobytes()  # "<|channel|>final": only a header has it
_END = array("I", [END]).tobytes()


def final_end(tokens: array[int]) -> int | None:
    """Where the last final answer in ``tokens`` ends (just past its ``<|end|>``), or None. A
    message's text never holds special tokens, so a final answer's header is the only place
    ``<|channel|>final`` appears (searched as bytes: no Python loop over the tokens)."""
    data = tokens.tobytes()
    at = data.rfind(_FINAL_HEADER)
    while at > 0 and at % 4:
        at = data.rfind(_FINAL_HEADER, 0, at + len(_FINAL_HEADER) - 1)
    if at < 0:
        return None
    end = data.find(_END, at)
    while end > 0 and end % 4:
        end = data.find(_END, end + 1)
    return None if end < 0 else end // 4 + 1


def remembered(req: EncodeRequest, prompt: EncodedPrompt, assistant: int) -> Remembered:
    """What a whole render of ``req`` leaves for a continuation (``assistant``: the tokens that
    end every prompt, not part of the body)."""
    items = req.items
    body = array("I", prompt.token_ids[prompt.prefix_len : len(prompt.token_ids) - assistant])
    open_items = after_last_final(items)
    return Remembered(
        length=len(items),
        body=body,
        stable=0 if open_items is None else final_end(body) or 0,
        open_items=tuple(items) if open_items is None else open_items,
        prefix_items=tuple(i for i in items if _joins_developer(i)),
        recipients={i.call_id: recipient_of(i) for i in items if isinstance(i, FunctionCallItem)},
        selection=prompt.selection_text,
    )


def redone(base: Remembered, items: list[ConversationItem]) -> tuple[int, list[ConversationItem]]:
    """How a continuation by ``items`` renders: the body's tokens it keeps, and the items it
    renders after them (a final answer among ``items`` renders the open items again with them)."""
    if any(is_final(i) for i in items):
        return base.stable, [*base.open_items, *items]
    return len(base.body), items


def continued(
    base: Remembered,
    items: list[ConversationItem],
    kept: int,
    redo: list[ConversationItem],
    tokens: list[int],
    recipients: dict[str, str],
) -> Remembered:
    """``base`` continued by ``items``: its first ``kept`` body tokens, then ``redo`` rendered as
    ``tokens`` (``recipients``: the calls known after them)."""
    body = array("I", base.body[:kept] if kept < len(base.body) else base.body)
    body.extend(tokens)
    open_items = after_last_final(redo)
    if open_items is None:
        stable, open_items = base.stable, (*base.open_items, *items)
    else:
        stable = kept + (final_end(array("I", tokens)) or 0)
    return Remembered(
        length=base.length + len(items),
        body=body,
        stable=stable,
        open_items=open_items,
        prefix_items=base.prefix_items,
        recipients=recipients,
        selection=selection_text(items) or base.selection,
    )


def unusable(base: Remembered | None, continues: PromptContinuation, req: EncodeRequest) -> str | None:
    """Why ``req`` cannot continue ``base`` (None: it can)."""
    if base is None:
        return "this encoder does not remember the prompt the request continues"
    if base.length != continues.length:
        return f"the remembered prompt has {base.length} items, not {continues.length}"
    if req.truncation == "auto":
        return "a truncated conversation renders whole"
    if any(_joins_developer(i) for i in req.items):
        return "new system or developer items, or a compaction, change the developer message"
    return None


class PromptMemory:
    """The remembered prompts, the least recently used forgotten first once they hold more
    than ``budget`` tokens between them (4 bytes each)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._prompts: OrderedDict[str, Remembered] = OrderedDict()
        self._tokens = 0

    def get(self, key: str) -> Remembered | None:
        found = self._prompts.get(key)
        if found is not None:
            self._prompts.move_to_end(key)
        return found

    def put(self, key: str, prompt: Remembered) -> None:
        if len(prompt.body) > self.budget:
            return
        old = self._prompts.pop(key, None)
        if old is not None:
            self._tokens -= len(old.body)
        self._prompts[key] = prompt
        self._tokens += len(prompt.body)
        while self._tokens > self.budget:
            _, evicted = self._prompts.popitem(last=False)
            self._tokens -= len(evicted.body)

    def __len__(self) -> int:
        return len(self._prompts)

    @property
    def tokens(self) -> int:
        return self._tokens
