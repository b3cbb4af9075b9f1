"""Grammar parameters as the engines check them, and what they ask of the output (SIMULATOR
support code).

``check_structural_tag`` refuses what xgrammar 0.1.25-0.1.29 (vLLM pins 0.1.29) refuses when
it parses and analyses a structural tag (cpp/structural_tag.cc: the same rules, the same
messages), plus JSON schemas that are not schemas. ``constraint_of`` reads back what a tag
asks for: the final answer's JSON schema (a ``json_schema`` right after ``final<|message|>``,
or one the grammar starts with) and the tools a call must go to (``const_string``s right
after a tag ending in `` to=NAMESPACE.``). The simulator does not run the grammar: its script
is made to conform instead."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

FORMAT_TYPES = (
    "const_string",
    "json_schema",
    "any_text",
    "grammar",
    "regex",
    "qwen_xml_parameter",
    "sequence",
    "or",
    "tag",
    "triggered_tags",
    "tags_with_separator",
)
_UNLIMITED = ("any_text", "triggered_tags", "tags_with_separator")
_RECIPIENT_END = re.compile(r" to=([\w.-]+)\.$")
_NAME = re.compile(r"[\w.-]+")


class GrammarError(ValueError):
    """A grammar the engine cannot compile (its message is xgrammar's)."""


@dataclass(frozen=True)
class Constraint:
    """What the grammar asks of the output."""

    final_schema: dict[str, Any] | bool | None = None
    tools: tuple[str, ...] = ()
    namespace: str = "functions"


def check_schema(schema: Any) -> None:
    """A JSON schema must be an object or a boolean, and a valid schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError("JSON schema must be an object or a boolean")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise GrammarError(f"Invalid JSON schema: {exc.message}") from exc


def check_structural_tag(text: str) -> dict[str, Any]:
    """The parsed tag; ``GrammarError`` when xgrammar would not compile it."""
    try:
        tag = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"Structural tag is not valid JSON: {exc}") from exc
    if not isinstance(tag, dict):
        raise GrammarError("Structural tag must be an object")
    if "structures" in tag:  # the legacy form both engines still take
        _check_legacy(tag)
        return tag
    if "type" in tag and tag["type"] != "structural_tag":
        raise GrammarError('Structural tag\'s type must be a string "structural_tag"')
    if "format" not in tag:
        raise GrammarError("Structural tag must have a format field")
    _format(tag["format"])
    return tag


def _check_legacy(tag: dict[str, Any]) -> None:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list) or not triggers:
        raise GrammarError("Legacy structural tag must have structures and triggers arrays")
    for s in structures:
        if not isinstance(s, dict) or not isinstance(s.get("begin"), str) or not isinstance(s.get("end"), str):
            raise GrammarError("Each structure must have begin and end strings")
        if not any(s["begin"].startswith(t) for t in triggers if isinstance(t, str)):
            raise GrammarError("Each structure's begin must start with a trigger")
        check_schema(s.get("schema"))


def _format(fmt: Any) -> bool:
    """Check one format (recursively); whether it is unlimited (xgrammar's analyzer)."""
    if not isinstance(fmt, dict):
        raise GrammarError("Format must be an object")
    kind = fmt.get("type")
    if kind is None and {"begin", "content", "end"} <= fmt.keys():
        kind = "tag"
    if not isinstance(kind, str):
        raise GrammarError("Format's type must be a string")
    if kind not in FORMAT_TYPES:
        raise GrammarError(f"Format type not recognized: {kind}")
    if kind == "const_string":
        if not isinstance(fmt.get("value"), str) or not fmt["value"]:
            raise GrammarError("ConstString format must have a value field with a non-empty string")
    elif kind in ("json_schema", "qwen_xml_parameter"):
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict | bool):
            raise GrammarError("JSON schema format must have a json_schema field with a object or boolean value")
        check_schema(schema)
    elif kind == "any_text":
        if set(fmt) - {"type"}:
            raise GrammarError("Any text format should not have any fields other than type")
    elif kind == "grammar":
        if not isinstance(fmt.get("grammar"), str) or not fmt["grammar"]:
            raise GrammarError("Grammar format must have a grammar field with a non-empty string")
    elif kind == "regex":
        _regex(fmt)
    elif kind in ("sequence", "or"):
        return _elements(fmt, kind)
    elif kind == "tag":
        _tag(fmt)
    else:
        _tags(fmt, kind)
    return kind in _UNLIMITED


def _regex(fmt: dict[str, Any]) -> None:
    pattern = fmt.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("Regex format must have a pattern field with a non-empty string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise GrammarError(f"Invalid regex: {exc}") from exc


def _elements(fmt: dict[str, Any], kind: str) -> bool:
    name = "Sequence" if kind == "sequence" else "Or"
    elements = fmt.get("elements")
    if not isinstance(elements, list):
        raise GrammarError(f"{name} format must have an elements field with an array")
    if not elements:
        raise GrammarError(f"{name} format must have at least one element")
    unlimited = [_format(e) for e in elements]
    if kind == "sequence":
        for i, flag in enumerate(unlimited[:-1]):
            if flag:
                raise GrammarError(
                    "Only the last element in a sequence can be unlimited, but the "
                    f"{i}th element of sequence format is unlimited"
                )
        return unlimited[-1]
    if any(unlimited) and not all(unlimited):
        raise GrammarError(
            "Now we only support all elements in an or format to be unlimited or all "
            "limited, but the or format has both unlimited and limited elements"
        )
    return any(unlimited)


def _tag(fmt: Any) -> dict[str, Any]:
    if not isinstance(fmt, dict):
        raise GrammarError("Tag format must be an object")
    if "type" in fmt and fmt["type"] != "tag":
        raise GrammarError('Tag format\'s type must be a string "tag"')
    if not isinstance(fmt.get("begin"), str):
        raise GrammarError("Tag format's begin field must be a string")
    if "content" not in fmt:
        raise GrammarError("Tag format must have a content field")
    unlimited = _format(fmt["content"])
    if not isinstance(fmt.get("end"), str):
        raise GrammarError("Tag format's end field must be a string")
    if unlimited and not fmt["end"]:
        raise GrammarError("When the content is unlimited, the end of the tag format cannot be empty")
    return fmt


def _tags(fmt: dict[str, Any], kind: str) -> None:
    label = "Triggered tags" if kind == "triggered_tags" else "Tags with separator"
    triggers: list[str] = []
    if kind == "triggered_tags":
        raw = fmt.get("triggers")
        if not isinstance(raw, list):
            raise GrammarError("Triggered tags format must have a triggers field with an array")
        if any(not isinstance(t, str) or not t for t in raw):
            raise GrammarError("Triggered tags format's triggers must be non-empty strings")
        if not raw:
            raise GrammarError("Triggered tags format's triggers must be non-empty")
        triggers = raw
    tags = fmt.get("tags")
    if not isinstance(tags, list):
        raise GrammarError(f"{label} format must have a tags field with an array")
    checked = [_tag(t) for t in tags]
    if not checked:
        raise GrammarError(f"{label} format's tags must be non-empty")
    if kind == "tags_with_separator" and (not isinstance(fmt.get("separator"), str) or not fmt["separator"]):
        raise GrammarError("Tags with separator format's separator field must be a non-empty string")
    for flag in ("at_least_one", "stop_after_first"):
        if flag in fmt and not isinstance(fmt[flag], bool):
            raise GrammarError(f"{flag} must be a boolean")
    for tag in checked:
        matched = [t for t in triggers if tag["begin"].startswith(t)]
        if kind == "triggered_tags" and len(matched) > 1:
            raise GrammarError("One tag matches multiple triggers in a triggered tags format")
        if kind == "triggered_tags" and not matched:
            raise GrammarError("One tag does not match any trigger in a triggered tags format")


# what a (checked) tag asks for ---------------------------------------------------------------
def _walk(node: Any) -> list[dict[str, Any]]:
    """Every format object in the tag, depth first, in order."""
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        out.append(node)
        for key in ("format", "content", "elements", "tags"):
            value = node.get(key)
            for child in value if isinstance(value, list) else [value]:
                out += _walk(child)
    return out


def _first_json(node: Any) -> dict[str, Any] | bool | None:
    """The JSON schema a format starts with, if it starts with one."""
    while isinstance(node, dict):
        if node.get("type") == "json_schema":
            schema = node.get("json_schema")
            return schema if isinstance(schema, dict | bool) else None
        if node.get("type") == "sequence" and node.get("elements"):
            node = node["elements"][0]
        else:
            return None
    return None


def constraint_of(tag: dict[str, Any]) -> Constraint:
    formats = _walk(tag)
    final: dict[str, Any] | bool | None = None
    for fmt in formats:
        begin = fmt.get("begin")
        if isinstance(begin, str) and begin.endswith("final<|message|>"):
            final = _first_json(fmt.get("content"))
            break
    if final is None:
        root = tag.get("format")
        alternatives = root.get("elements", []) if isinstance(root, dict) and root.get("type") == "or" else [root]
        final = next((s for s in map(_first_json, alternatives) if s is not None), None)
    namespace, tools = "functions", []
    for fmt in formats:
        end = fmt.get("end")
        m = _RECIPIENT_END.search(end) if fmt.get("type") == "tag" and isinstance(end, str) else None
        if m:
            namespace = m.group(1)
            tools = [
                n.group(0)
                for f in formats
                if f.get("type") == "const_string"
                and not str(f.get("value", "")).startswith(" to=")
                and (n := _NAME.match(str(f.get("value", "")))) is not None
            ]
            break
    return Constraint(final_schema=None if tools else final, tools=tuple(dict.fromkeys(tools)), namespace=namespace)


def structured_outputs_constraint(params: dict[str, Any]) -> Constraint | None:
    """vLLM's ``structured_outputs`` (already checked): what it asks of the output."""
    if params.get("structural_tag") is not None:
        return constraint_of(json.loads(params["structural_tag"]))
    if params.get("json") is not None:
        schema = params["json"]
        return Constraint(final_schema=json.loads(schema) if isinstance(schema, str) else schema)
    if params.get("json_object"):
        return Constraint(final_schema={"type": "object"})
    return None
