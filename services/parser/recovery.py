"""Pure helpers that repair what gpt-oss writes when it does not write clean Harmony:
lenient header parsing, recipient mapping, control-text filtering, and recovering a tool call
the model wrote as JSON text (the strategies of shared/seeds/002: the whole answer as JSON, a
```json block, a {"tool": ...} object inside prose, the tool inferred from its arguments; only
offered tools count). Nothing here raises on model output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from services.parser.arguments import repair_json

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
            (c for c in CHANNELS if name and (name.startswith(c) or c.startswith(name) and len(name) >= 4)), None
        )
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


def _known(name: str, by_norm: dict[str, str]) -> str | None:
    """An offered tool's name for a variant of it: case, hyphens, or ``json`` glued on
    (``to=functions.shelljson``, the content type written without a space)."""
    norm = _norm(name)
    fixed = by_norm.get(norm)
    if fixed is None and norm.endswith("json"):
        fixed = by_norm.get(norm[:-4])
    return fixed


UNOFFERED = "unoffered_tool_call"  # a recipient that names no tool the request offered


@dataclass(frozen=True)
class Recipient:
    namespace: str
    name: str
    recovered: str | None = None  # the kind of repair, when one was needed; UNOFFERED: no call


def map_recipient(recipient: str | None, tool_names: list[str], namespaces: list[str]) -> Recipient | None:
    """A header recipient -> (namespace, tool name), or None when it names no tool. A function
    or namespace the request did not offer comes back with ``recovered=UNOFFERED``: as in
    shared/seeds/002, a call to a tool nobody offered is no tool call (the caller keeps its text
    as text). Built-in namespaces (browser, python, container) are not checked: the parse spec
    does not say which of them were enabled."""
    if not recipient:
        return None
    r = _CONTROL.sub("", recipient).strip().strip("\"'")
    if not r or r in ("assistant", "user", "all"):
        return None
    by_norm = {_norm(n): n for n in tool_names}
    if "." in r:
        ns, _, name = r.partition(".")
        if ns == "functions":
            if name in tool_names:
                return Recipient("functions", name)
            fixed = _known(name, by_norm)
            return Recipient("functions", fixed, "tool_name_normalised") if fixed else Recipient(ns, name, UNOFFERED)
        if ns in namespaces or ns in BUILTIN_NAMESPACES:
            return Recipient(ns, name)
        fixed = _known(name, by_norm)
        if fixed:
            return Recipient("functions", fixed, "wrong_namespace")
        return Recipient(ns, name, UNOFFERED)
    if r in BUILTIN_NAMESPACES:
        return Recipient(r, r)
    fixed = _known(r, by_norm)
    if fixed:
        return Recipient("functions", fixed, "bare_recipient")
    if r in namespaces:
        return None
    if _WORD.fullmatch(r):
        return Recipient("functions", r, UNOFFERED)
    return None


class ControlTextFilter:
    """Removes ``<|...|>`` control-token *text* from streamed text (models sometimes emit the
    markers as ordinary tokens), holding back a trailing partial marker between deltas."""

    __slots__ = ("pending", "removed")

    def __init__(self) -> None:
        self.pending = ""  # the start of what may be a marker, held until the next delta
        self.removed = 0

    def feed(self, text: str) -> str:
        text = self.pending + text
        self.pending = ""
        if "<" not in text:
            return text
        cleaned, n = _CONTROL.subn("", text)
        self.removed += n
        m = _PARTIAL_CONTROL.search(cleaned)
        if m:
            self.pending = cleaned[m.start() :]
            cleaned = cleaned[: m.start()]
        return cleaned

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


def strip_control_text(text: str) -> str:
    return _CONTROL.sub("", text)


# --- tool calls written as text ---------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*([\s\S]*?)```")


def _json_objects(text: str) -> tuple[list[str], str | None]:
    """Balanced {...} spans in ``text``, outermost first, and an object still open at the end.
    Strings count only inside an object: a stray quote in the prose around it does not hide it."""
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
        if ch == '"' and depth:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans, (text[start:] if depth else None)


@dataclass(frozen=True)
class RecoveredCall:
    name: str
    arguments: str
    kind: str
    whole: bool = False  # the call is all the text said (no prose around it)


_NAME_KEYS = ("tool", "name", "function", "tool_name")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")


def _load(candidate: str) -> Any:
    if not candidate.startswith("{"):
        return None
    fixed, ok = repair_json(candidate)
    if not ok:
        return None
    try:
        return json.loads(fixed)
    except (ValueError, RecursionError):
        return None


def _as_call(
    data: Any,
    tool_names: list[str],
    schemas: dict[str, dict[str, Any]],
    kind: str = "json_tool_call",
    need_arguments: bool = False,
) -> RecoveredCall | None:
    if not isinstance(data, dict):
        return None
    key = next((k for k in _NAME_KEYS if data.get(k)), None)
    name = data.get(key) if key else None
    if isinstance(name, dict):  # {"function": {"name":..., "arguments":...}}
        data, name, key = name, name.get("name"), "name"
    if not any(k in data for k in _ARGUMENT_KEYS):
        if need_arguments or kind == "prose_tool_call" and key != "tool":
            return None  # inside prose, {"name": X} alone is no call; {"tool": X} is (seed 002, strategy 3)
        # {"tool": X, "city": ...}: the other keys are the arguments
        args: Any = {k: v for k, v in data.items() if k != key}
    else:
        args = data.get("arguments", data.get("parameters", data.get("args", data.get("input"))))
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
        except (ValueError, RecursionError):
            return RecoveredCall(tool, args, kind)
    if args is None:
        args = {}
    if isinstance(args, dict):
        args = normalise_aliases(args, schemas.get(tool) or {})
    return RecoveredCall(tool, json.dumps(args, ensure_ascii=False), kind)


def _infer(data: Any, tool_names: list[str], schemas: dict[str, dict[str, Any]]) -> RecoveredCall | None:
    """Bare arguments without a tool name (seed 002, strategy 4): the call, when exactly one
    offered tool's schema takes them (every key a property, after alias normalisation; every
    required property present)."""
    if (
        not isinstance(data, dict)
        or not data
        or any(k in data for k in ("tool", "function", "tool_name", *_ARGUMENT_KEYS))
    ):
        return None  # written as a call (to a tool nobody offered, or it would have matched)
    matches: list[RecoveredCall] = []
    for tool in tool_names:
        schema = schemas.get(tool)
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not schema or not isinstance(props, dict) or not props:
            continue
        args = normalise_aliases(data, schema)
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        if all(k in props for k in args) and all(r in args for r in required if isinstance(r, str)):
            matches.append(RecoveredCall(tool, json.dumps(args, ensure_ascii=False), "inferred_tool_call"))
    return matches[0] if len(matches) == 1 else None


def recover_tool_call(
    text: str, tool_names: list[str], schemas: dict[str, dict[str, Any]] | None = None
) -> RecoveredCall | None:
    """Find a tool call the model wrote as text (shared/seeds/002's strategies). The whole text
    as JSON, or a ```json block that is all the text, is a call when it names an offered tool
    (``whole``), or, without a name, when its keys fit exactly one offered tool's schema. Inside
    prose (a ```json block or a balanced {...}), an object carrying an offered tool's name and
    arguments, or a ``"tool"`` key naming one, is a call (kind ``prose_tool_call``); an object the
    text ends inside, only with name and arguments. Calls to tools nobody offered are no calls:
    the text stays text."""
    if not tool_names:
        return None
    schemas = schemas or {}
    stripped = text.strip()
    fences = list(_FENCE.finditer(text))
    whole = [stripped] + [m.group(1).strip() for m in fences if m.group(0) == stripped]
    for candidate in whole:
        data = _load(candidate)
        call = _as_call(data, tool_names, schemas) or _infer(data, tool_names, schemas)
        if call is not None:
            return replace(call, whole=True)
    objects, still_open = _json_objects(text)
    for candidate in [m.group(1).strip() for m in fences] + objects:
        call = _as_call(_load(candidate), tool_names, schemas, "prose_tool_call")
        if call is not None:
            return call
    if still_open is not None:  # an object the text ends inside: a call only with name and arguments
        return _as_call(_load(still_open), tool_names, schemas, "prose_tool_call", need_arguments=True)
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
