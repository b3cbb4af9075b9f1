"""One request's parse: Harmony token ids -> typed events (items added, text deltas, items
done, finished). Deterministic for a given token sequence, so a replacement worker can replay a
request's tokens and produce the same events and ids.

This module is the token side: a token-level framing guard that owns message boundaries and
headers, because real gpt-oss output breaks Harmony's grammar in ways openai-harmony's parser
either rejects (recipient before the channel, a repeated recipient, text after a terminator) or
silently turns into user-visible text (``<|start|>``/``<|channel|>``/``<|endoftext|>`` inside
content). The guard parses headers leniently (``recovery.parse_header``). Inside a message only
ordinary tokens remain, so content is decoded the way openai-harmony's ``StreamableParser``
decodes it (token bytes, UTF-8, invalid sequences as U+FFFD), but a whole run of a batch's
content tokens at once: a table lookup and one incremental UTF-8 decode instead of a parser call
per token, and a character split across tokens or batches is held until it is whole. What the
decoded text becomes (output items, held text, streamed arguments, recovered tool calls) is
``items.OutputItems``'s part. Every repair is named and counted; nothing in here raises on
model output."""

from __future__ import annotations

import base64
import enum
import functools
import logging
from codecs import utf_8_decode
from collections import Counter
from typing import Any

from openai_harmony import HarmonyEncoding

from contracts.errors import BusError, ErrorCode
from contracts.messages.generate import EngineFinishReason, EngineUsage
from contracts.messages.parse import Failed, Finished, FinishReason, ItemDelta, ParseEvent, Usage
from services.common.harmony import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    ENDOFTEXT,
    MESSAGE,
    RETURN,
    START,
    VOCAB_FILE,
    ensure_vocabulary,
)
from services.parser.items import OpenItem, OutputItems
from services.parser.recovery import Header, parse_header, strip_recipient

log = logging.getLogger("chorus.parser")

FIRST_SPECIAL = 199998  # o200k: ids below are ordinary text tokens
TERMINATORS = (END, RETURN, CALL)


class _At(enum.Enum):
    """Where in the Harmony framing the next token falls."""

    HEADER = "header"  # after <|start|>: role, channel, recipient, constrain, up to <|message|>
    CONTENT = "content"  # after <|message|>: the message body, up to a terminator
    BETWEEN = "between"  # after a terminator: only <|start|> (or stray text) can follow


_HEADER, _CONTENT, _BETWEEN = _At.HEADER, _At.CONTENT, _At.BETWEEN


@functools.cache
def token_bytes() -> tuple[bytes, ...]:
    """The bytes of every ordinary token (ranks 0..FIRST_SPECIAL-1), read once per process from
    the verified vocabulary file that openai-harmony's encoding is built from (~0.4 s)."""
    table = [b""] * FIRST_SPECIAL
    for line in (ensure_vocabulary() / VOCAB_FILE).read_bytes().splitlines():
        token, rank = line.split()
        table[int(rank)] = base64.b64decode(token)
    return tuple(table)


class ParseSession:
    """The parse of one generation: ``feed`` its token batches in order, then ``finish``; each
    call returns the events it completed."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        request_id: str,
        tool_names: list[str] | None = None,
        namespaces: list[str] | None = None,
        tool_schemas: dict[str, dict[str, Any]] | None = None,
        turn: int = 0,
    ) -> None:
        self.enc = encoding
        self._bytes = token_bytes()
        self.request_id = request_id
        self.recoveries: Counter[str] = Counter()
        self.tokens_seen = 0
        self.reasoning_tokens = 0
        self._out = OutputItems(
            request_id, turn, list(tool_names or []), list(namespaces or []), tool_schemas or {}, self.recoveries
        )
        self._state: _At = _HEADER  # the prompt ended with <|start|>assistant
        self._sections: dict[str, list[int]] = {"role": []}
        self._section = "role"
        self._item: OpenItem | None = None
        self._finished = False

    # -- public ---------------------------------------------------------------------------
    def feed(self, token_ids: list[int]) -> list[ParseEvent]:
        n = len(token_ids)
        entry = self._item
        if (
            entry is not None
            and n
            and (
                0 <= token_ids[0] < FIRST_SPECIAL if n == 1 else max(token_ids) < FIRST_SPECIAL and min(token_ids) >= 0
            )
        ):
            # the hot path: the whole batch is text inside an open message (nothing is pending
            # between batches: every feed returns after take)
            self.tokens_seen += n
            if entry.kind == "reasoning":
                self.reasoning_tokens += n
            table = self._bytes
            data = table[token_ids[0]] if n == 1 else b"".join([table[t] for t in token_ids])
            if entry.undecoded:
                data = entry.undecoded + data
            delta, used = utf_8_decode(data, "replace", False)
            entry.undecoded = data[used:] if used < len(data) else b""
            if delta and "<" not in delta and not entry.filter.pending:
                if entry.plain:
                    entry.text.append(delta)
                    return [ItemDelta(output_index=entry.index, delta=delta)]
                if entry.arguments is not None:
                    sent = entry.arguments.feed(delta)
                    return [ItemDelta(output_index=entry.index, delta=sent)] if sent else []
            if delta:
                self._out.text(entry, delta)
            return self._out.take()
        if self._finished:
            return []
        self.tokens_seen += n
        i = 0
        while i < n:
            t = token_ids[i]
            if t >= FIRST_SPECIAL or t < 0:  # a special token, or an id no vocabulary has
                self._special(t)
                i += 1
            elif self._state == _CONTENT:  # a run of content tokens, decoded together
                j = i + 1
                while j < n and 0 <= token_ids[j] < FIRST_SPECIAL:
                    j += 1
                delta = self._content(token_ids[i:j])
                if delta:
                    self._out.text(self._item, delta)  # type: ignore[arg-type]
                i = j
            else:
                if self._state == _BETWEEN:
                    self.recoveries["text_after_terminator"] += 1
                    self._new_header()
                self._sections[self._section].append(t)
                i += 1
        return self._out.take()

    def finish(
        self,
        finish_reason: EngineFinishReason | None,
        usage: EngineUsage | None = None,
        error: BusError | None = None,
        stop_text: str | None = None,
    ) -> list[ParseEvent]:
        """The last events: the open message ended (cut short by a length, abort or error
        finish), then ``Finished`` (or ``Failed``). ``stop_text``: the caller's stop string the
        engine matched; its tokens are in the output, as vLLM's own gpt-oss serving keeps them
        (the engines trim only their text)."""
        if self._finished:
            return []
        cut = finish_reason in ("length", "abort", "error") or error is not None
        if self._state == _CONTENT:
            self._end_message(incomplete=cut)
        elif self._state == _HEADER:
            self._header_as_body("trailing_header_text", incomplete=cut)
        self._finished = True
        u = Usage(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage and usage.completion_tokens else self.tokens_seen,
            reasoning_tokens=self.reasoning_tokens,
            cached_tokens=usage.cached_tokens if usage else None,
        )
        if self.recoveries:
            log.warning("request %s: repaired model output: %s", self.request_id, dict(self.recoveries))
        if error is not None or finish_reason == "error":
            self._out.push(
                Failed(error=error or BusError(code=ErrorCode.ENGINE_ERROR, message="the engine failed"), usage=u)
            )
        else:
            reason: FinishReason = "stop" if finish_reason in (None, "error") else finish_reason
            if reason == "stop" and self._out.calls:
                reason = "tool_calls"
            self._out.push(
                Finished(
                    finish_reason=reason,
                    usage=u,
                    recoveries=sorted(self.recoveries),
                    stop_sequence=stop_text if reason == "stop" else None,
                )
            )
        return self._out.take()

    # -- framing --------------------------------------------------------------------------
    def _new_header(self) -> None:
        self._state = _HEADER
        self._sections = {"role": []}
        self._section = "role"

    def _header_has_text(self) -> bool:
        return any(self._sections.values())

    def _special(self, t: int) -> None:
        state = self._state
        if t == START:
            if state == _CONTENT:
                self.recoveries["start_in_content"] += 1
                self._end_message()
            elif state == _HEADER and (self._header_has_text() or len(self._sections) > 1):
                self.recoveries["restarted_header"] += 1
                self._header_as_body("restarted_header")
            self._new_header()
        elif t == CHANNEL:
            if state == _CONTENT:
                self.recoveries["channel_in_content"] += 1
                self._end_message()
                self._new_header()
            elif state == _BETWEEN:
                self.recoveries["missing_start"] += 1
                self._new_header()
            elif "channel" in self._sections:  # a second <|channel|>: keep what the first held
                self.recoveries["repeated_channel"] += 1
                self._sections["role"] += self._sections["channel"]
            self._sections["channel"] = []
            self._section = "channel"
        elif t == CONSTRAIN:
            if state == _HEADER:
                if "constrain" in self._sections:  # a second <|constrain|>: keep what the first held
                    self.recoveries["repeated_constrain"] += 1
                self._sections.setdefault("constrain", [])
                self._section = "constrain"
            elif state == _CONTENT:
                self.recoveries["constrain_in_content"] += 1
        elif t == MESSAGE:
            if state == _HEADER:
                self._open_message()
            elif state == _CONTENT:
                self.recoveries["message_in_content"] += 1
            else:
                self.recoveries["missing_header"] += 1
                self._new_header()
                self._open_message()
        elif t in TERMINATORS:
            if state == _CONTENT:
                self._end_message()
            elif state == _HEADER:
                self._header_as_body("body_in_header")
                self._state = _BETWEEN
        else:  # <|endoftext|> or any other special token: a boundary
            kind = "endoftext_boundary" if t == ENDOFTEXT else "unexpected_special_token"
            self.recoveries[kind] += 1
            if state == _CONTENT:
                self._end_message()
            elif state == _HEADER:
                self._header_as_body(kind)
            self._state = _BETWEEN

    def _header(self) -> Header:
        dec = self.enc.decode
        channel = self._sections.get("channel")
        constrain = self._sections.get("constrain")
        return parse_header(
            dec(self._sections["role"]) if self._sections["role"] else "",
            dec(channel) if channel is not None else None,
            dec(constrain) if constrain is not None else None,
        )

    def _header_as_body(self, kind: str, incomplete: bool = False) -> None:
        """A header that never reached <|message|>: whatever text it holds is the answer."""
        if not self._header_has_text():
            self._state = _BETWEEN
            return
        header = self._header()
        body = header.body
        channel_tokens = self._sections.get("channel")
        if channel_tokens:
            channel_text = strip_recipient(self.enc.decode(channel_tokens)).strip()
            rest = channel_text.split(None, 1)
            # after a known channel name the rest is the body; with no known name, all of it is
            tail = (rest[1] if len(rest) > 1 else "") if header.channel else channel_text
            body = (body + " " if body else "") + tail
        constrain_tokens = self._sections.get("constrain")
        if constrain_tokens and header.recipient is None:
            # <|constrain|> means nothing without a recipient: its words are body text
            body += self.enc.decode(constrain_tokens)
        self._state = _BETWEEN
        if not body.strip():
            if not incomplete and (header.recipient or constrain_tokens):
                self.recoveries["header_without_message"] += 1  # a call the model never wrote
            return
        self.recoveries[kind] += 1
        channel = header.channel if header.channel in ("analysis", "final") else "final"
        self._out.complete(channel, body, incomplete)

    def _open_message(self) -> None:
        header = self._header()
        if header.junk:
            self.recoveries["junk_in_header"] += 1
        body = header.body
        constrain = self._sections.get("constrain")
        if constrain and header.recipient is None and header.channel is None:
            # <|constrain|> with neither a channel nor a recipient qualifies nothing: its words
            # are stray text, like the role's (a content type after a channel stays one)
            body += self.enc.decode(constrain)
        if body.strip():
            self.recoveries["text_before_header"] += 1
            self._out.complete("final", body, incomplete=False)
        self._item = self._out.open(header)
        self._state = _CONTENT

    def _end_message(self, incomplete: bool = False) -> None:
        entry, self._item = self._item, None
        self._state = _BETWEEN
        if entry is not None:
            self._out.close(entry, incomplete)

    # -- content --------------------------------------------------------------------------
    def _content(self, run: list[int]) -> str:
        """Ordinary tokens inside the open message -> the text they complete (UTF-8 across
        runs: a character's first bytes wait for the rest)."""
        entry = self._item
        assert entry is not None
        if entry.kind == "reasoning":
            self.reasoning_tokens += len(run)
        table = self._bytes
        data = table[run[0]] if len(run) == 1 else b"".join([table[t] for t in run])
        if entry.undecoded:
            data = entry.undecoded + data
        delta, used = utf_8_decode(data, "replace", False)  # invalid bytes -> U+FFFD, as openai-harmony
        entry.undecoded = data[used:] if used < len(data) else b""
        return delta
