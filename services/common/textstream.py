"""Text mode: turn what an OpenAI-compatible upstream streams as TEXT into Harmony token ids,
so the parser service (token based, robust) handles text upstreams exactly like vLLM/SGLang.

Three shapes of upstream output are recognised from the first non-blank characters:
- raw Harmony text (``<|channel|>analysis<|message|>...``): markers become their special
  tokens; a marker split across chunks is held back until it is whole;
- ``<think>...</think>answer`` (non-Harmony reasoning models): an analysis message, then final;
- plain text: a final message.
Already-parsed chat deltas (``reasoning_content`` or ``reasoning``, ``content``, ``tool_calls``)
are framed as the matching Harmony messages. Any split of the same stream into chunks yields the
same Harmony stream: the same special tokens and the same text (ordinary text may be tokenised
at other boundaries, which the parser does not see)."""

from __future__ import annotations

import re
from typing import Any

from openai_harmony import HarmonyEncoding

from services.common.harmony import CALL, END, MESSAGE, RETURN, START

_PARTIAL_MARKER = re.compile(r"<(\|[A-Za-z_]{0,20}\|?)?$")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HarmonyTextTokenizer:
    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.enc = encoding
        self.mode: str | None = None  # harmony | think | plain
        self.kind: str | None = None  # the open message: analysis | final | call
        self._buf = ""
        self._thinking = False
        self._tool_index: int | None = None

    # -- helpers ----------------------------------------------------------------------------
    def _encode(self, text: str, markers: bool = False) -> list[int]:
        if not text:
            return []
        if markers:
            return self.enc.encode(text, allowed_special="all")
        return self.enc.encode(text, disallowed_special=())

    def _open(self, kind: str, recipient: str | None = None) -> list[int]:
        """Close the open message (if another kind) and open ``kind``."""
        if self.kind == kind and recipient is None:
            return []
        out = self._close(END) if self.kind else []
        head = "" if not out and self.kind is None and not self._started else "<|start|>assistant"
        if kind == "call":
            head += f"<|channel|>commentary to=functions.{recipient} <|constrain|>json<|message|>"
        else:
            head += f"<|channel|>{kind}<|message|>"
        self.kind = kind
        self._started = True
        return out + self._encode(head, markers=True)

    _started = False

    def _close(self, terminator: int) -> list[int]:
        self.kind = None
        return [terminator]

    # -- raw text (completions, or chat content from an engine without a reasoning parser) --------
    def text(self, delta: str) -> list[int]:
        self._buf += delta
        if self.mode is None:
            stripped = self._buf.lstrip()
            if not stripped:
                return []
            if stripped.startswith("<|") or "<|" in stripped[:12]:
                self.mode = "harmony"
            elif stripped.startswith(_THINK_OPEN):
                self.mode = "think"
            elif _THINK_OPEN.startswith(stripped) or "<|".startswith(stripped):
                return []  # could still become a tag: wait
            else:
                self.mode = "plain"
        return self._drain(final=False)

    def _drain(self, final: bool) -> list[int]:
        buf = self._buf
        if self.mode == "harmony":
            keep = 0 if final else (len(buf) - m.start() if (m := _PARTIAL_MARKER.search(buf)) else 0)
            out, self._buf = buf[: len(buf) - keep], buf[len(buf) - keep :]
            encoded = self._encode(out, markers=True)
            if encoded:
                self._started = True
            return encoded
        ids: list[int] = []
        if self.mode == "think":
            while True:
                tag = _THINK_CLOSE if self._thinking else _THINK_OPEN
                at = buf.find(tag)
                if at < 0:
                    keep = 0 if final else _partial_suffix(buf, tag)
                    text, buf = buf[: len(buf) - keep], buf[len(buf) - keep :]
                    ids += self._emit(text)
                    break
                ids += self._emit(buf[:at])
                buf = buf[at + len(tag) :]
                if self._thinking:
                    self._thinking = False
                    ids += self._open("final")
                else:
                    self._thinking = True
                    ids += self._open("analysis")
            self._buf = buf
            return ids
        out, self._buf = buf, ""
        return self._emit(out)

    def _emit(self, text: str) -> list[int]:
        if not text:
            return []
        if self.kind is None:
            kind = "analysis" if self._thinking else "final"
            if self.mode == "think" and not self._thinking and not text.strip():
                return []
            return self._open(kind) + self._encode(text)
        return self._encode(text)

    # -- already-parsed chat deltas --------------------------------------------------------------
    def reasoning(self, delta: str) -> list[int]:
        return self._open("analysis") + self._encode(delta) if delta else []

    def content(self, delta: str) -> list[int]:
        if not delta:
            return []
        if self.mode in ("harmony", "think"):
            return self.text(delta)  # content that is itself raw Harmony or think-tagged
        if self.kind in ("analysis", "call"):  # pre-parsed: content after reasoning is the answer
            return self._open("final") + self._encode(delta)
        return self.text(delta)

    def tool_call(self, call: dict[str, Any]) -> list[int]:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        ids: list[int] = []
        if fn.get("name") and index != self._tool_index:
            ids += self._close(CALL) if self.kind == "call" else []
            ids += self._open("call", recipient=fn["name"])
            self._tool_index = index
        if fn.get("arguments"):
            ids += self._encode(fn["arguments"])
        return ids

    def finish(self, finish_reason: str | None) -> list[int]:
        """What is held back, and the terminator the upstream did not send."""
        ids = self._drain(final=True) if self._buf else []
        if finish_reason == "length" or self.kind is None or (ids and ids[-1] in (RETURN, CALL, END)):
            return ids
        return ids + self._close(CALL if self.kind == "call" else RETURN)


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
            role = {"system": "system", "developer": "system", "user": "user"}.get(role, "assistant"
                    if role == "assistant" else "user")
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
