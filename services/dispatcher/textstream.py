"""Text mode: what an OpenAI-compatible upstream streams as TEXT, turned into Harmony token ids,
so the parser service (token based) treats a text upstream exactly like vLLM or SGLang.

``TextToHarmonyTokens`` is fed one request's stream, piece by piece, and returns token ids:

- raw text (``/v1/completions``, or chat ``content`` before any parsed field) is recognised
  from its first non-blank characters: ``<|`` is raw Harmony (every special marker becomes
  its special token; a marker split across pieces is held back until whole), ``<think>``
  opens reasoning (``<think>..</think>`` becomes an analysis message, the rest a final one),
  anything else is plain text (one final message);
- already-parsed chat fields: ``reasoning_content`` / ``reasoning`` become an analysis
  message, ``content`` a final one, ``tool_calls`` a commentary call message each
  (``to=functions.NAME <|constrain|>json``), with ``<|end|><|start|>assistant...`` between
  messages of different kinds;
- ``finish("stop")`` appends the terminator the upstream did not send (``<|call|>`` after a
  tool call, ``<|return|>`` otherwise); ``finish("length")`` leaves the message cut off.

Messages start at their first non-blank character; a think-tag reasoning ends at its last.
Ordinary text is encoded in pieces cut only where o200k's pre-tokenizer always splits (after a
letter, before a non-letter that cannot continue the word; after a newline), so any split of
the same stream into pieces gives the same token ids as the whole. A piece of text with no
such place in ``MAX_HELD_CHARS`` characters is encoded anyway (it keeps streaming)."""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from openai_harmony import HarmonyEncoding

from services.common.harmony import CALL, CHANNEL, END, MESSAGE, RETURN, START
from services.common.tokens import stable_cut

log = logging.getLogger("chorus.textstream")

Mode = Literal["harmony", "think", "plain"]
Finish = Literal["stop", "length"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_HELD_CHARS = 512
_MARKER = re.compile(r"<\|[A-Za-z0-9_]+\|>")
_TERMINATORS = frozenset({END, RETURN, CALL})


@functools.cache
def _specials(encoding: HarmonyEncoding) -> tuple[frozenset[str], frozenset[str], int]:
    """The special markers' texts, every proper prefix of one, and the longest length."""
    markers = frozenset(encoding.special_tokens_set)
    prefixes = frozenset(m[:n] for m in markers for n in range(1, len(m)))
    return markers, prefixes, max(map(len, markers))


def held_marker(text: str, prefixes: frozenset[str], longest: int) -> int:
    """Length of the longest suffix of ``text`` that may still grow into a special marker."""
    start = max(0, len(text) - longest + 1)
    at = text.find("<", start)
    while at >= 0:
        if text[at:] in prefixes:
            return len(text) - at
        at = text.find("<", at + 1)
    return 0


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class _ToolCall:
    name: str = ""
    pending: str = ""  # arguments received before the call could be opened
    opened: bool = False


class TextToHarmonyTokens:
    """One request's upstream stream -> Harmony completion token ids (after the prompt's
    ``<|start|>assistant``). Not thread-safe; one per request."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.enc = encoding
        self._markers, self._prefixes, self._longest = _specials(encoding)
        self.mode: Mode | None = None  # of the raw text, once recognised
        self._buf = ""  # raw text not yet looked at (a partial marker or tag, or undecided)
        self._think: Literal["before", "in", "after"] = "before"
        self._parsed = False  # an already-parsed field (reasoning, tool call) was seen
        self._pending = ""  # ordinary text of the open message not yet encoded
        self._calls: dict[int | str, _ToolCall] = {}
        self._last_call: int | str = 0
        # what was emitted, as Harmony framing
        self.emitted = 0
        self.last_id: int | None = None
        self._state: Literal["idle", "header", "body"] = "idle"
        self._header: list[int] = []
        self._recipient = False  # the open message is addressed to a tool
        self._open_key: str | None = None  # the message this converter opened and is writing

    # -- public ---------------------------------------------------------------------------
    def text(self, delta: str) -> list[int]:
        """Raw upstream text: ``/v1/completions`` ``text``, or chat ``content``."""
        if not delta:
            return []
        self._buf += delta
        return self._drain(final=False)

    def reasoning(self, delta: str) -> list[int]:
        """A parsed reasoning delta (``reasoning_content`` or ``reasoning``)."""
        if not delta:
            return []
        ids = self._end_raw()
        self._parsed = True
        return ids + self._write("analysis", delta)

    def content(self, delta: str) -> list[int]:
        """A chat ``content`` delta: the answer after parsed fields, else raw text."""
        if not delta:
            return []
        if not self._parsed:
            return self.text(delta)
        return self._write("final", delta)

    def tool_call(self, call: Mapping[str, Any]) -> list[int]:
        """One ``tool_calls`` entry of a chat delta: ``index`` (or ``id``), then
        ``function.name`` once and ``function.arguments`` in pieces."""
        ids = self._end_raw()
        self._parsed = True
        index = call.get("index")
        key: int | str = index if isinstance(index, int) else call.get("id") or self._last_call
        self._last_call = key
        fn = call.get("function") or {}
        state = self._calls.setdefault(key, _ToolCall())
        name, args = fn.get("name"), fn.get("arguments")
        if isinstance(name, str) and name.strip() and not state.name:
            state.name = name.strip()
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        if isinstance(args, str):
            state.pending += args
        tag = f"call:{key}"
        if state.name and not state.opened:
            ids += self._open(tag, self._call_head(state.name))
            state.opened = True
        if state.opened and state.pending:
            if self._open_key == tag:
                ids += self._text(state.pending)
            else:
                log.warning("tool call %s: arguments after its message ended were dropped", key)
            state.pending = ""
        return ids

    def finish(self, reason: Finish) -> list[int]:
        """What is held back, then (``stop``) the terminator the upstream did not send."""
        ids = self._end_raw()
        ids += self._flush()
        unnamed = [k for k, c in self._calls.items() if not c.opened]
        if unnamed:
            log.warning("tool calls %s never got a name and were dropped", unnamed)
        if reason == "stop" and self._state == "body":
            ids += self._out([CALL if self._recipient else RETURN])
        return ids

    @property
    def stop_token_id(self) -> int | None:
        """The terminator that ended the output, if it ended on one."""
        return self.last_id if self.last_id in (RETURN, CALL) else None

    # -- raw text -------------------------------------------------------------------------
    def _end_raw(self) -> list[int]:
        return self._drain(final=True) if self._buf else []

    def _recognise(self, final: bool) -> bool:
        stripped = self._buf.lstrip()
        if not stripped:
            if final:
                self._buf = ""
            return False
        if stripped.startswith("<|"):
            self.mode = "harmony"
        elif stripped.startswith(THINK_OPEN):
            self.mode = "think"
        elif not final and ("<|".startswith(stripped) or THINK_OPEN.startswith(stripped)):
            return False  # may still become a marker or a tag
        else:
            self.mode = "plain"
        self._buf = stripped
        return True

    def _drain(self, final: bool) -> list[int]:
        if self.mode is None and not self._recognise(final):
            return []
        if self.mode == "harmony":
            return self._drain_harmony(final)
        if self.mode == "think":
            return self._drain_think(final)
        text, self._buf = self._buf, ""
        return self._write("final", text)

    def _drain_harmony(self, final: bool) -> list[int]:
        buf = self._buf
        keep = 0 if final else held_marker(buf, self._prefixes, self._longest)
        work, self._buf = buf[: len(buf) - keep], buf[len(buf) - keep :]
        ids: list[int] = []
        pos = 0
        for m in _MARKER.finditer(work):
            if m.group() not in self._markers:
                continue  # looks like a marker, is ordinary text
            ids += self._text(work[pos : m.start()])
            ids += self._flush()
            ids += self._out(self.enc.encode(m.group(), allowed_special="all"))
            pos = m.end()
        ids += self._text(work[pos:])
        return ids + self._flush() if final else ids

    def _drain_think(self, final: bool) -> list[int]:
        buf, ids = self._buf, []
        while True:
            if self._think == "before":  # recognised: starts with <think>
                buf, self._think = buf[len(THINK_OPEN) :], "in"
            elif self._think == "in":
                at = buf.find(THINK_CLOSE)
                if at < 0:
                    keep = 0 if final else partial_tag(buf, THINK_CLOSE)
                    ids += self._write("analysis", buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep :]
                    if final:
                        ids += self._flush(rstrip=True)
                    break
                ids += self._write("analysis", buf[:at])
                if self._open_key == "analysis":
                    ids += self._flush(rstrip=True) + self._out([END])
                buf, self._think = buf[at + len(THINK_CLOSE) :], "after"
            else:
                ids += self._write("final", buf)
                buf = ""
                break
        self._buf = buf
        return ids

    # -- messages -------------------------------------------------------------------------
    def _write(self, key: str, text: str) -> list[int]:
        """Text for message ``key``, opening it (at its first non-blank character) if needed."""
        if self._state == "body" and self._open_key == key:
            return self._text(text)
        text = text.lstrip()
        if not text:
            return []
        head = f"<|channel|>{key}<|message|>"
        return self._open(key, self.enc.encode(head, allowed_special="all")) + self._text(text)

    def _call_head(self, name: str) -> list[int]:
        recipient = "_".join(name.split())
        if "." not in recipient:
            recipient = f"functions.{recipient}"
        return [
            *self.enc.encode("<|channel|>commentary to=", allowed_special="all"),
            *self.enc.encode(recipient, disallowed_special=()),
            *self.enc.encode(" <|constrain|>json<|message|>", allowed_special="all"),
        ]

    def _open(self, key: str, head: list[int]) -> list[int]:
        """End the open message and start ``key`` with ``head`` (``<|channel|>...<|message|>``)."""
        ids = self._flush()
        if self._state == "body":
            ids += self._out([CALL if self._recipient else END])
        if self.emitted:  # the prompt ends with <|start|>assistant: only later messages need it
            ids += self._out(self.enc.encode("<|start|>assistant", allowed_special="all"))
        ids += self._out(head)
        self._open_key = key
        return ids

    # -- text and framing -----------------------------------------------------------------
    def _text(self, text: str) -> list[int]:
        """Ordinary text: encoded up to the last place where later text cannot change it."""
        self._pending += text
        cut = stable_cut(self._pending)
        if cut == 0 and len(self._pending) > MAX_HELD_CHARS:
            cut = len(self._pending)
        if cut == 0:
            return []
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return self._out(self.enc.encode(out, disallowed_special=()))

    def _flush(self, rstrip: bool = False) -> list[int]:
        out, self._pending = self._pending, ""
        if rstrip:
            out = out.rstrip()
        return self._out(self.enc.encode(out, disallowed_special=())) if out else []

    def _out(self, ids: list[int]) -> list[int]:
        """Emit ``ids``, following the Harmony framing they make."""
        for t in ids:
            if t == START or (t == CHANNEL and self._state != "header"):
                self._state, self._header, self._open_key = "header", [t], None
            elif t == MESSAGE:
                self._recipient = "to=" in self.enc.decode(self._header)
                self._state, self._header = "body", []
            elif t in _TERMINATORS:
                self._state, self._header, self._open_key, self._recipient = "idle", [], None, False
            elif self._state == "header":
                self._header.append(t)
        if ids:
            self.emitted += len(ids)
            self.last_id = ids[-1]
        return ids


def prompt_messages(prompt_ids: list[int], encoding: HarmonyEncoding) -> list[dict[str, str]]:
    """A rendered Harmony prompt back as chat messages, for upstreams that want messages."""
    messages: list[dict[str, str]] = []
    header: list[int] = []
    body: list[int] = []
    in_body = False
    for t in prompt_ids:
        if t == START:
            header, body, in_body = [], [], False
        elif t == MESSAGE:
            in_body = True
        elif t in (END, RETURN, CALL):
            head = encoding.decode(header).split("<|channel|>")[0].strip()
            role = head.split(" ")[0] if head else "assistant"
            role = {"system": "system", "developer": "system", "user": "user"}.get(
                role, "assistant" if role == "assistant" else "user"
            )
            text = encoding.decode(body)
            if role == "assistant" and "analysis" in encoding.decode(header):
                continue
            messages.append({"role": role, "content": text})
            header, body, in_body = [], [], False
        elif in_body:
            body.append(t)
        else:
            header.append(t)
    return messages
