"""What the SIMULATED engine says: prompt token ids -> output token ids. Pure and deterministic.

Not a model. It reads the decoded prompt and writes plausible Harmony:
- last message from the user, tools declared: analysis, then a call to the first tool (or the
  tool named in the user's text) with arguments synthesized from its signature, ending <|call|>;
- last message a tool result: analysis, then a final answer quoting the tool's output;
- otherwise: analysis ("The user says ...") and a final answer echoing the user, <|return|>.

The developer message's "# Response Formats" section is followed, as a model reading it would:
the final answer is a minimal JSON value of its schema. A request's grammar is not read here:
the script is generated through it (``constrained``), and ``Script.calls`` are the calls the
model could make instead of its scripted message (one to each declared tool).

Directives in the last user message steer it (see ``Directives``)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openai_harmony import HarmonyEncoding

from services.common.harmony import START
from services.common.tokens import encode_text
from services.simengine.instance import NoInstance, minimal_instance
from services.simengine.prompt import (
    PromptMessage,
    ToolProp,
    ToolSignature,
    directives,
    parse_prompt,
    parse_response_format,
    parse_tools,
    strip_directives,
)

# each one token with its leading space, so N words are exactly N tokens
_FILLER = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "and",
    "then",
    "it",
    "rests",
    "a",
    "while",
    "before",
    "running",
    "again",
)
_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'")
_WORD = re.compile(r"[A-Za-z][\w-]*")
_TOOL_AUTHORS = ("user", "assistant", "system", "developer")


@dataclass(frozen=True)
class Directives:
    """``[[sim:KEY=VALUE]]`` in the last user message.

    Content (only when that user message is the last message): ``raw`` emits exactly the given
    Harmony text (``<|...|>`` markers become special tokens; may be malformed on purpose),
    ``tokens`` makes the final answer N tokens long. Transport (every generation after that
    user message): ``delay_ms`` per chunk, ``error_after`` N tokens then a mid-stream error,
    ``abort_after`` N tokens then the end an engine gives a request it aborted itself (vLLM's
    finish reason ``abort``, SGLang's ``{"type": "abort"}``), ``status`` an HTTP error before
    streaming."""

    raw: str | None = None
    tokens: int | None = None
    delay_ms: float | None = None
    error_after: int | None = None
    abort_after: int | None = None
    status: int | None = None


@dataclass(frozen=True)
class Call:
    """A call the simulated model could write: ``functions.NAME`` and its JSON arguments."""

    recipient: str
    arguments: str


@dataclass(frozen=True)
class Script:
    output_ids: list[int]
    directives: Directives
    calls: tuple[Call, ...] = ()  # the script's tool first


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def read_directives(user_text: str, *, content: bool) -> Directives:
    found = directives(user_text)
    return Directives(
        raw=found.get("raw") if content else None,
        tokens=_int(found.get("tokens")) if content else None,
        delay_ms=_float(found.get("delay_ms")),
        error_after=_int(found.get("error_after")),
        abort_after=_int(found.get("abort_after")),
        status=_int(found.get("status")),
    )


QUOTE_CHARS = 4096  # the most of the user's (or a tool's) text the script quotes back


def _quote(text: str) -> str:
    """Text from the prompt to quote, at most ``QUOTE_CHARS`` of it: a reply echoing a prompt
    of 300,000 characters would cost the engine's event loop as much to write as the prompt."""
    return _safe(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "...")


def _safe(text: str) -> str:
    """Text from the prompt, made unable to forge special tokens when re-encoded."""
    return text.replace("<|", "< |")


def pick_value(user_text: str) -> str:
    """A string argument taken from the user's words: a quoted phrase, else the last
    capitalized word after the first (a place or a name), else the last word, else the text."""
    if m := _QUOTED.search(user_text):
        quoted: str = m.group(1) or m.group(2)
        return quoted
    words: list[str] = _WORD.findall(user_text)
    capitalized = [w for w in words[1:] if w[0].isupper()]
    if capitalized:
        return capitalized[-1]
    return words[-1] if words else user_text or "value"


def _value_for(prop: ToolProp, user_text: str) -> Any:
    kind = prop.type
    if kind.startswith("string"):
        return [pick_value(user_text)] if kind.endswith("[]") else pick_value(user_text)
    if kind.startswith('"'):
        return kind.split('"')[1][:QUOTE_CHARS]  # first literal of a string enum
    if kind.startswith("number"):
        return 1
    if kind.startswith("boolean"):
        return True
    if kind.endswith("[]") or kind.startswith("Array"):
        return []
    if kind.startswith("{"):
        return {}
    return None


def synthesize_args(tool: ToolSignature, user_text: str) -> dict[str, Any]:
    return {p.name: _value_for(p, user_text) for p in tool.props}


def choose_tool(tools: Sequence[ToolSignature], user_text: str) -> ToolSignature:
    lowered = user_text.lower()
    return next((t for t in tools if t.name.lower() in lowered), tools[0])


def _last_user(messages: Sequence[PromptMessage]) -> tuple[int, str]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].author == "user":
            return i, messages[i].content
    return -1, ""


@functools.cache
def _filler_words(encoding: HarmonyEncoding) -> tuple[int, ...]:
    return tuple(encoding.encode(" " + w, disallowed_special=())[0] for w in _FILLER)


def filler_ids(encoding: HarmonyEncoding, n: int) -> list[int]:
    """Exactly ``n`` tokens of filler prose (each filler word is one token)."""
    words = _filler_words(encoding)
    return [words[i % len(words)] for i in range(n)]


def _arguments(tool: ToolSignature, user: str) -> str:
    return _safe(json.dumps(synthesize_args(tool, user), ensure_ascii=False))


def _call(tool: ToolSignature, user: str, why: str) -> str:
    return (
        f"<|channel|>analysis<|message|>{why}<|end|>"
        f"<|start|>assistant<|channel|>commentary to={tool.recipient} "
        f"<|constrain|>json<|message|>{_arguments(tool, user)}<|call|>"
    )


def calls(tools: Sequence[ToolSignature], user_text: str) -> tuple[Call, ...]:
    """A call to each declared tool, the one the script would choose first."""
    if not tools:
        return ()
    first = choose_tool(tools, user_text)
    ordered = [first, *(t for t in tools if t is not first)]
    return tuple(Call(t.recipient, _arguments(t, user_text)) for t in ordered)


def final_json(schema: object) -> str | None:
    """The final answer a schema asks for: a minimal conforming value, as JSON."""
    try:
        return json.dumps(minimal_instance(schema), ensure_ascii=False)
    except (NoInstance, KeyError, IndexError, TypeError, ValueError):
        return None


def compose(
    messages: Sequence[PromptMessage], tools: Sequence[ToolSignature], final_schema: object | None = None
) -> str:
    """The Harmony completion text (after the prompt's ``<|start|>assistant``); ``final_schema``:
    the JSON schema the final answer follows (the prompt's response format)."""
    user_index, user_raw = _last_user(messages)
    user = _quote(strip_directives(user_raw))
    last = messages[-1] if messages else None
    answer = final_json(final_schema) if final_schema is not None else None
    answer = _safe(answer) if answer is not None else None
    if last is not None and last.author not in _TOOL_AUTHORS:
        output = _quote(last.content.strip())
        name = last.author.split(".", 1)[-1]
        return (
            f"<|channel|>analysis<|message|>The tool {name} returned: {output}. "
            f"I can answer now.<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{answer or f'According to {name}: {output}'}"
            "<|return|>"
        )
    if tools and user_index == len(messages) - 1:
        tool = choose_tool(tools, user)
        return _call(tool, user, f'The user says "{user}". I should call {tool.name}.')
    return (
        f'<|channel|>analysis<|message|>The user says "{user}". I will answer briefly.<|end|>'
        f"<|start|>assistant<|channel|>final<|message|>{answer or f'Hello! You said: {user}'}<|return|>"
    )


def plan(prompt_ids: Sequence[int], encoding: HarmonyEncoding) -> Script:
    """Everything the simulated model will say for this prompt (before max_tokens/stops and
    before any grammar).

    A prompt that ends inside the model's own output (a gateway continuing an interrupted
    generation sends the output so far after the prompt) continues that output, as a model
    sampling greedily would: the script of the prompt before the output, minus what is there."""
    start = output_start(prompt_ids, encoding)
    if start is not None and start < len(prompt_ids):
        base = _plan(prompt_ids[:start], encoding)
        already = list(prompt_ids[start:])
        if base.output_ids[: len(already)] == already:
            return Script(base.output_ids[len(already) :], base.directives, base.calls)
    return _plan(prompt_ids, encoding)


def output_start(prompt_ids: Sequence[int], encoding: HarmonyEncoding) -> int | None:
    """Where the current assistant output begins: after the ``<|start|>assistant`` that
    follows the prompt's last message from anyone else (user, tool, system, developer)."""
    assistant = _assistant_id(encoding)
    starts = [i for i, t in enumerate(prompt_ids) if t == START]
    for k in range(len(starts) - 1, -1, -1):
        i = starts[k]
        if i + 1 < len(prompt_ids) and prompt_ids[i + 1] != assistant:
            following = starts[k + 1] if k + 1 < len(starts) else None
            if following is None or following + 1 >= len(prompt_ids) or prompt_ids[following + 1] != assistant:
                return None
            return following + 2
    return None


_MARKER = re.compile(r"(<\|[^|<>\s]{1,64}\|>)")


def encode_harmony(encoding: HarmonyEncoding, text: str) -> list[int]:
    """Harmony text (its special-token markers as special tokens) as token ids, in time linear
    in its length (``encoding.encode`` is quadratic in a word: 100,000 characters of one held
    the engine's event loop for seconds, and its health checks failed)."""
    specials = encoding.special_tokens_set
    out: list[int] = []
    plain: list[str] = []
    for i, part in enumerate(_MARKER.split(text)):
        if i % 2 and part in specials:
            out += encode_text(encoding, "".join(plain))
            out += encoding.encode(part, allowed_special="all")
            plain = []
        else:
            plain.append(part)
    return out + encode_text(encoding, "".join(plain))


@functools.cache
def _assistant_id(encoding: HarmonyEncoding) -> int:
    ids: list[int] = encoding.encode("assistant", disallowed_special=())
    return ids[0]


def _plan(prompt_ids: Sequence[int], encoding: HarmonyEncoding) -> Script:
    messages = parse_prompt(prompt_ids, encoding.decode)
    user_index, user_raw = _last_user(messages)
    said = read_directives(user_raw, content=user_index >= 0 and user_index == len(messages) - 1)
    if said.raw is not None:
        return Script(encoding.encode(said.raw, allowed_special="all"), said)
    if said.tokens is not None:
        user = _quote(strip_directives(user_raw))
        head = encode_harmony(
            encoding,
            f'<|channel|>analysis<|message|>The user says "{user}". '
            f"A long answer is wanted.<|end|><|start|>assistant<|channel|>final<|message|>",
        )
        tail = encoding.encode("<|return|>", allowed_special="all")
        return Script([*head, *filler_ids(encoding, max(0, said.tokens)), *tail], said)
    developer = [m.content for m in messages if m.author == "developer"]
    tools = [t for text in developer for t in parse_tools(text)]
    prompted = next((s for text in developer if (s := parse_response_format(text)) is not None), None)
    body = compose(messages, tools, prompted)
    user = _quote(strip_directives(user_raw))
    return Script(encode_harmony(encoding, body), said, calls(tools, user))


@dataclass(frozen=True)
class Outcome:
    """The output after max_tokens and stop ids: what the engine streams."""

    token_ids: list[int]
    finish_reason: str  # stop | length | abort
    stop_token_id: int | None  # the stop token emitted (included in token_ids), if any
    stop_text: str | None = None  # the stop string matched (its tokens included in token_ids)


def limit(
    output_ids: Sequence[int], max_tokens: int | None, stop_token_ids: Sequence[int], eos: Sequence[int]
) -> Outcome:
    """Stop at the first stop (or EOS) token emitted, then cut at ``max_tokens``."""
    stops = set(stop_token_ids) | set(eos)
    ids = list(output_ids)
    stop_id = None
    for i, tok in enumerate(ids):
        if tok in stops:
            ids, stop_id = ids[: i + 1], tok
            break
    if max_tokens is not None and len(ids) > max_tokens:
        return Outcome(ids[: max(0, max_tokens)], "length", None)
    return Outcome(ids, "stop", stop_id)
