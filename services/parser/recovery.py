"""Pure helpers that repair what gpt-oss writes when it does not write clean Harmony:
lenient header parsing, recipient mapping, control-text filtering, and recovering a tool call
the model wrote as JSON text. Nothing here raises on model output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CHANNELS = ("analysis", "commentary", "final")
BUILTIN_NAMESPACES = ("browser", "python", "container")
_CONTROL = re.compile(r"<\|[A-Za-z_]{1,20}\|>")
_PARTIAL_CONTROL = re.compile(r"<(\|[A-Za-z_]{0,20}\|?)?$")
_RECIPIENT = re.compile(r"to=\s*([^\s<]+)")
_WORD = re.compile(r"[A-Za-z_][\w.\-]*")


@dataclass
class Header:
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    body: str = ""  # text the model wrote into the header that belongs to the message body
    junk: list[str] = field(default_factory=list)
    unknown_channel: str | None = None


def parse_header(role_text: str, channel_text: str | None, constrain_text: str | None) -> Header:
    """``role_text``: header text before any <|channel|> (after <|start|>); ``channel_text``:
    text after <|channel|>; ``constrain_text``: text after <|constrain|>. Recipient may sit in
    either; junk words are ignored; an unknown channel is kept for the caller to decide."""
    header = Header()
    everything = " ".join(t for t in (role_text, channel_text or "", constrain_text or "") if t)
    m = _RECIPIENT.search(everything)
    if m:
        header.recipient = m.group(1).strip().rstrip(".,")
    if channel_text is not None:
        rest = _RECIPIENT.sub(" ", channel_text).strip()
        words = rest.split(None, 1)
        raw = words[0] if words else ""
        name = re.sub(r"[^a-z]", "", raw.lower())
        channel = next((c for c in CHANNELS if name == c), None) or next(
            (c for c in CHANNELS if name and (name.startswith(c) or c.startswith(name) and len(name) >= 4)), None)
        if channel is None and name and any(k in name for k in ("analy", "think", "reason", "thought")):
            channel = "analysis"  # clearly reasoning under another name
        if channel is None and raw:
            header.unknown_channel = raw
        header.channel = channel
        tail = words[1] if len(words) > 1 else ""
        for word in tail.split():
            if word.lower() in ("json", "<|constrain|>json") and header.content_type is None:
                header.content_type = "json"
            else:
                header.junk.append(word)
    if constrain_text is not None:
        words = _RECIPIENT.sub(" ", constrain_text).split()
        if words:
            header.content_type = words[0]
            header.junk += words[1:]
    # text before the channel that is neither a role nor a recipient (e.g. a refusal written
    # with no header at all) is the message body; leading whitespace is kept (it may follow a
    # message the model already closed)
    role_rest = _RECIPIENT.sub(" ", role_text).rstrip()
    stripped = role_rest.strip()
    if stripped:
        first, _, remainder = stripped.partition(" ")
        bare = re.sub(r"[^a-z]", "", first.lower())
        if first in ("assistant", "user", "system", "developer") or re.fullmatch(r"[a-z_]+\.[\w.\-]+", first):
            if remainder.strip():
                header.junk.append(remainder.strip())
        elif bare in CHANNELS and not remainder.strip():
            header.junk.append(first)  # a channel name left over from a repeated <|channel|>
            if header.channel is None and channel_text is None:
                header.channel = bare
        else:
            header.body = role_rest
    return header


def strip_recipient(text: str) -> str:
    return _RECIPIENT.sub(" ", text)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class Recipient:
    namespace: str
    name: str
    recovered: str | None = None  # the kind of repair, when one was needed


def map_recipient(
    recipient: str | None, tool_names: list[str], namespaces: list[str]
) -> Recipient | None:
    """A header recipient -> (namespace, tool name), or None when it names no tool."""
    if not recipient:
        return None
    r = _CONTROL.sub("", recipient).strip().strip("\"'")
    if not r or r in ("assistant", "user", "all"):
        return None
    by_norm = {_norm(n): n for n in tool_names}
    if "." in r:
        ns, _, name = r.partition(".")
        if ns == "functions":
            if name in tool_names or not tool_names:
                return Recipient("functions", name)
            fixed = by_norm.get(_norm(name))
            return Recipient("functions", fixed or name, "tool_name_normalised" if fixed else "unknown_tool")
        if ns in namespaces or ns in BUILTIN_NAMESPACES:
            return Recipient(ns, name)
        fixed = by_norm.get(_norm(name))
        if fixed:
            return Recipient("functions", fixed, "wrong_namespace")
        return Recipient(ns, name, "unknown_namespace")
    if r in BUILTIN_NAMESPACES:
        return Recipient(r, r)
    fixed = by_norm.get(_norm(r))
    if fixed:
        return Recipient("functions", fixed, "bare_recipient")
    if r in namespaces:
        return None
    if _WORD.fullmatch(r) and tool_names:
        return Recipient("functions", r, "unknown_tool")
    return None


class ControlTextFilter:
    """Removes ``<|...|>`` control-token *text* from streamed text (models sometimes emit the
    markers as ordinary tokens), holding back a trailing partial marker between deltas."""

    def __init__(self) -> None:
        self._pending = ""
        self.removed = 0

    def feed(self, text: str) -> str:
        text = self._pending + text
        self._pending = ""
        if "<" not in text:
            return text
        cleaned, n = _CONTROL.subn("", text)
        self.removed += n
        m = _PARTIAL_CONTROL.search(cleaned)
        if m:
            self._pending = cleaned[m.start():]
            cleaned = cleaned[: m.start()]
        return cleaned

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def flush(self) -> str:
        rest, self._pending = self._pending, ""
        return rest


def strip_control_text(text: str) -> str:
    return _CONTROL.sub("", text)


# --- tool calls written as text ---------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*([\s\S]*?)```")


def _json_objects(text: str) -> list[str]:
    """Balanced {...} spans in ``text`` (string-aware), outermost first."""
    spans, depth, start, in_str, esc = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def repair_json(text: str) -> tuple[str, bool]:
    """Arguments as JSON text: unchanged when valid; repaired when unambiguous (trailing
    commas, single quotes, a missing closing brace); else returned verbatim (False)."""
    candidate = text.strip() or "{}"
    try:
        json.loads(candidate)
        return candidate, True
    except ValueError:
        pass
    attempts = [
        re.sub(r",\s*([}\]])", r"\1", candidate),
        candidate.replace("'", '"'),
        candidate + "}" * max(0, candidate.count("{") - candidate.count("}")),
    ]
    for attempt in attempts:
        try:
            value = json.loads(attempt)
        except ValueError:
            continue
        return json.dumps(value, ensure_ascii=False), True
    return text, False


@dataclass(frozen=True)
class RecoveredCall:
    name: str
    arguments: str
    kind: str


def _as_call(data: Any, tool_names: list[str], schemas: dict[str, dict[str, Any]]) -> RecoveredCall | None:
    if not isinstance(data, dict):
        return None
    name = data.get("tool") or data.get("name") or data.get("function") or data.get("tool_name")
    if isinstance(name, dict):  # {"function": {"name":..., "arguments":...}}
        data, name = name, name.get("name")
    args: Any = data.get("arguments", data.get("parameters", data.get("args", data.get("input"))))
    kind = "json_tool_call"
    for _ in range(3):  # unwrap {"tool": X, "arguments": {"tool": X, "arguments": {...}}}
        if isinstance(args, dict) and ("tool" in args or "name" in args) and "arguments" in args:
            args = args["arguments"]
            kind = "nested_tool_call"
        else:
            break
    if not isinstance(name, str):
        return None
    by_norm = {_norm(n): n for n in tool_names}
    tool = name if name in tool_names else by_norm.get(_norm(name.split(".")[-1]))
    if tool is None:
        return None
    if isinstance(args, str):
        args_text, _ = repair_json(args)
        try:
            args = json.loads(args_text)
        except ValueError:
            return RecoveredCall(tool, args, kind)
    if args is None:
        args = {}
    if isinstance(args, dict):
        args = normalise_aliases(args, schemas.get(tool) or {})
    return RecoveredCall(tool, json.dumps(args, ensure_ascii=False), kind)


def recover_tool_call(
    text: str, tool_names: list[str], schemas: dict[str, dict[str, Any]] | None = None
) -> RecoveredCall | None:
    """Find a tool call the model wrote as text: the whole text as JSON, a ```json block, or a
    {"tool"/"name": ..., "arguments": ...} object inside prose. Only offered tools count."""
    if not tool_names:
        return None
    schemas = schemas or {}
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    candidates += _json_objects(text)
    for candidate in candidates:
        if not candidate.startswith("{"):
            continue
        fixed, ok = repair_json(candidate)
        if not ok:
            continue
        call = _as_call(json.loads(fixed), tool_names, schemas)
        if call is not None:
            return call
    return None


_ALIASES = [
    {"filepath", "file_path", "filePath", "file", "path"},
    {"directory", "dir_path", "dir", "folder"},
    {"command", "cmd", "shell_command"},
    {"query", "query_text", "search_query", "q"},
    {"unified_diff", "diff", "patch"},
    {"url", "link", "webpage", "uri"},
    {"location", "city", "place"},
]


def normalise_aliases(args: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Rename argument keys to the schema's name for the same thing, only when the schema
    names exactly one member of the alias group and the model used another."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return args
    out = dict(args)
    for group in _ALIASES:
        wanted = [p for p in props if p in group]
        if len(wanted) != 1 or wanted[0] in out:
            continue
        given = [k for k in out if k in group and k not in props]
        if len(given) == 1:
            out[wanted[0]] = out.pop(given[0])
    return out
