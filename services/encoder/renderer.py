"""The encoder's renderer: prompt token ids for a request, with the caches that make an agent
loop's next turn cheap (rendered system/developer prefixes, message frames, encoded contents),
and Responses' ``truncation: "auto"`` (the oldest messages left out when the context is short).
What each message says is built in ``render``."""

from __future__ import annotations

import datetime as dt
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, Role

from contracts.messages.encode import EncodeRequest
from contracts.messages.items import CompactionItem, ConversationItem, MessageItem
from services.common.harmony import ASSISTANT_STOP_TOKENS, START
from services.encoder.render import (
    EncodedPrompt,
    Frame,
    PastLimit,
    RenderError,
    body_messages,
    encode_within,
    invalid,
    kept,
    messages_of,
    prefix_tokens,
    selection_text,
    too_long,
)

MIN_CACHED_CHARS = 64  # shorter contents encode faster than a cache entry costs
# fields of a request that its system and developer messages do not depend on: left out of
# the key they are cached under (a continuation's key names the previous turn, new each turn)
NOT_IN_PREFIX = {"items", "model", "remember", "continues"}


class Renderer:
    """Prompt token ids for a request. The system and developer messages are rendered by
    openai-harmony and cached (they repeat across requests: only the conversation differs);
    each later message is its rendered header and terminator with its content encoded in
    between, in time linear in its length, and contents seen before come from a cache (so a
    continuation encodes only its new messages). The result equals
    ``render_conversation_for_completion`` of the same conversation (a test checks)."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        knowledge_cutoff: str = "2024-06",
        cache_size: int = 256,
        text_budget: int = 16_000_000,
    ) -> None:
        self.enc = encoding
        self.cutoff = knowledge_cutoff
        self.cache_size = cache_size
        self._prefixes: OrderedDict[str, list[int]] = OrderedDict()
        self._frames: OrderedDict[Frame, tuple[list[int], int]] = OrderedDict()
        # message contents already encoded, by text (an agent loop re-sends its whole history
        # each turn: only the new messages are encoded), at most ``text_budget`` characters
        self._texts: OrderedDict[str, array[int]] = OrderedDict()  # 4 bytes a token
        self._text_chars = 0
        self.text_budget = text_budget
        self._assistant = [START, *encoding.encode("assistant", disallowed_special=())]

    def render(self, req: EncodeRequest, today: dt.date, limit: int | None = None, reserve: int = 0) -> EncodedPrompt:
        """``limit``: the context length; a prompt that reaches it is refused (``too_long``) as
        soon as it does, without encoding the rest, unless ``req.truncation`` is "auto": then
        its oldest messages are left out until it fits with ``reserve`` tokens to spare (the
        output's budget; without one, an eighth of the context)."""
        t0 = time.perf_counter()
        try:
            tokens = list(self.prefix(req, today, limit))
            prefix_len = len(tokens)
            messages = body_messages(req)
            if req.truncation == "auto" and limit is not None:
                # below the limit (a prompt of exactly ``limit`` tokens leaves no room at all)
                room = limit - 1 - len(tokens) - len(self._assistant) - (reserve or limit // 8)
                tokens += self._latest(messages, room)
            else:
                for frame, text in messages:
                    tokens += self.message(frame, text, None if limit is None else limit - len(tokens))
                    if limit is not None and len(tokens) >= limit:
                        raise PastLimit
        except PastLimit:
            raise too_long(limit or 0) from None
        tokens += self._assistant
        return EncodedPrompt(
            token_ids=tokens,
            stop_token_ids=list(ASSISTANT_STOP_TOKENS),
            selection_text=selection_text(req.items),
            render_ms=(time.perf_counter() - t0) * 1000,
            prefix_len=prefix_len,
        )

    @property
    def assistant(self) -> list[int]:
        """What every prompt ends with: the start of the assistant's message."""
        return self._assistant

    def tail(self, items: list[ConversationItem], recipients: dict[str, str], room: int) -> list[int]:
        """The messages of ``items``, the part of a conversation after a remembered prompt (see
        ``continuations.py``), as tokens; ``PastLimit`` once they take ``room``."""
        tokens: list[int] = []
        for frame, text in messages_of(kept(items), recipients):
            tokens += self.message(frame, text, room - len(tokens))
            if len(tokens) >= room:
                raise PastLimit
        return tokens

    def _latest(self, messages: list[tuple[Frame, str]], room: int) -> list[int]:
        """The most recent messages that fit in ``room`` tokens, starting at a user message when
        one is among them (a reply or a tool's output without what it answered would mislead the
        model), else at least not at a tool's output; the last message always (``PastLimit`` when
        even it does not fit)."""
        encoded: list[list[int] | None] = []
        for frame, text in messages:
            try:
                encoded.append(self.message(frame, text, max(room, 1)))
            except PastLimit:
                encoded.append(None)  # longer than the room on its own: left out
        start, total = len(encoded), 0
        for i in range(len(encoded) - 1, -1, -1):
            tokens = encoded[i]
            if tokens is None or total + len(tokens) > room:
                break
            start, total = i, total + len(tokens)
        if encoded and start == len(encoded):
            raise PastLimit
        roles = [frame.role for frame, _ in messages]
        user = next((i for i in range(start, len(messages)) if roles[i] == Role.USER), None)
        if user is not None:
            start = user
        else:  # no user message left: at least no tool output without its call
            while start < len(messages) - 1 and roles[start] == Role.TOOL:
                start += 1
        return [t for tokens in encoded[start:] if tokens is not None for t in tokens]

    def prefix(
        self,
        req: EncodeRequest,
        today: dt.date,
        limit: int | None = None,
        items: Sequence[ConversationItem] | None = None,
    ) -> list[int]:
        """The system and developer messages. ``items``: the conversation whose system and
        developer items and compaction summaries join the instructions (``req.items`` unless
        given: a continued prompt's are those it remembered)."""
        # every field but the conversation (instructions, tools, tool choice, effort, response
        # format, date), and the system/developer items and compaction summaries that join the
        # instructions
        items = req.items if items is None else items
        key = (
            req.model_dump_json(exclude=NOT_IN_PREFIX)
            + "|"
            + today.isoformat()
            + "|"
            + "\x00".join(
                i.content if isinstance(i, MessageItem) else i.summary
                for i in items
                if isinstance(i, MessageItem) and i.role in ("system", "developer") or isinstance(i, CompactionItem)
            )
        )
        cached = self._prefixes.get(key)
        if cached is not None:
            self._prefixes.move_to_end(key)
            return cached
        try:
            given = req if items is req.items else req.model_copy(update={"items": list(items)})
            tokens = prefix_tokens(given, self.enc, today, self.cutoff, limit)
        except (RenderError, PastLimit):
            raise
        except Exception as exc:  # openai-harmony rejects what it cannot render
            raise invalid(f"The instructions or tools cannot be rendered as Harmony: {exc}", "tools") from exc
        self._prefixes[key] = tokens
        if len(self._prefixes) > self.cache_size:
            self._prefixes.popitem(last=False)
        return tokens

    def message(self, frame: Frame, text: str, limit: int | None = None) -> list[int]:
        """One message: its header and terminator (cached per frame), its content between."""
        rendered = self._frames.get(frame)
        if rendered is None:
            tokens = self.enc.render(frame.message())
            rendered = self._frames[frame] = (tokens[:-1], tokens[-1])
            if len(self._frames) > self.cache_size:
                self._frames.popitem(last=False)
        head, terminator = rendered
        return [*head, *self.content(text, limit), terminator]

    def content(self, text: str, limit: int | None = None) -> Sequence[int]:
        """A message's content as tokens, from the cache when it was encoded before."""
        cached = self._texts.get(text)
        if cached is not None:
            self._texts.move_to_end(text)
            return cached
        tokens = encode_within(self.enc, text, limit)
        if len(text) >= MIN_CACHED_CHARS and len(text) <= self.text_budget // 4:
            self._texts[text] = array("I", tokens)
            self._text_chars += len(text)
            while self._text_chars > self.text_budget:
                evicted, _ = self._texts.popitem(last=False)
                self._text_chars -= len(evicted)
        return tokens
