"""xgrammar 0.2.8's checks of a structural tag's formats: its parser and analyser
(cpp/structural_tag.cc ``StructuralTagParser``, ``StructuralTagAnalyzer``) and the checks its
converter makes, with the same messages (SIMULATOR support code, used by ``grammar``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FORMAT_TYPES = _words(
    "const_string json_schema any_text sequence or tag triggered_tags tags_with_separator optional "
    "plus star repeat qwen_xml_parameter grammar regex token exclude_token any_tokens "
    "token_triggered_tags dispatch token_dispatch"
)
# a format without "type" is the first of these its fields parse as (xgrammar's order)
_TYPELESS = _words(
    "tag const_string json_schema any_text sequence or triggered_tags tags_with_separator optional "
    "plus star repeat dispatch token_dispatch"
)
_JSON_STYLES = _words(
    "json qwen_xml minimax_xml minimax_m3_xml deepseek_xml glm_xml cohere_xml kimi_k3_xml deepseek_v4_1_xml"
)
_MAX_DEPTH = 100
_INT32 = 2**31 - 1


class GrammarError(ValueError):
    """A grammar the engine cannot compile (its message is xgrammar's)."""


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


def format_kind(fmt: dict[str, Any]) -> str:
    """A (checked) format's type; without ``type``, the first type its fields parse as."""
    kind = fmt.get("type")
    if isinstance(kind, str):
        return kind
    for candidate in _TYPELESS:
        try:
            getattr(_Checker(), "_" + candidate)(fmt, ())
        except GrammarError:
            continue
        return candidate
    raise GrammarError("Invalid format: " + json.dumps(fmt, separators=(",", ":")))


def _strings(value: Any, message: str, *, non_empty: bool = False) -> list[str]:
    if not isinstance(value, list) or any(not isinstance(s, str) or (non_empty and not s) for s in value):
        raise GrammarError(message)
    return value


def _flags(fmt: dict[str, Any], *names: str) -> None:
    for name in names:
        if name in fmt and not isinstance(fmt[name], bool):
            raise GrammarError(f"{name} must be a boolean")


def _budget(fmt: dict[str, Any], name: str, kind: str) -> None:
    value = fmt.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= _INT32 or value != int(value):
        raise GrammarError(f"{name} in {kind} must be a non-negative 32-bit integer or null")


def _token(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise GrammarError("TokenFormat's token must be an integer or string")
    if isinstance(value, str) and not value:
        raise GrammarError("Token string must be non-empty")
    if not isinstance(value, str) and value != int(value):
        raise GrammarError("Token ID must be an integer")
    if not isinstance(value, str) and value < 0:
        raise GrammarError("Token ID must be non-negative")


def _tokens(fmt: dict[str, Any], field: str) -> list[Any]:
    value = fmt.get(field, [])
    if not isinstance(value, list):
        raise GrammarError(f"{field} must be an array")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise GrammarError(f"{field} elements must be integers or strings")
        if isinstance(v, float) and v != int(v):
            raise GrammarError(f"{field} elements must be integers, not floats")
        if isinstance(v, str) and not v:
            raise GrammarError(f"{field} string elements must be non-empty")
        if not isinstance(v, str) and v < 0:
            raise GrammarError(f"{field} elements must be non-negative integers or strings")
    return value


@dataclass(frozen=True)
class _Checked:
    unlimited: bool = False
    excluded: bool = False  # an unlimited format with excludes (it can end a tag by itself)


class _Checker:
    """xgrammar's parser and analyser in one pass over the format tree."""

    def format(self, fmt: Any, path: tuple[str, ...]) -> _Checked:
        if len(path) >= _MAX_DEPTH:
            raise GrammarError(f"Formats are nested deeper than {_MAX_DEPTH} levels")
        if not isinstance(fmt, dict):
            raise GrammarError("Format must be an object")
        if "type" in fmt and not isinstance(fmt["type"], str):
            raise GrammarError("Format's type must be a string")
        if "type" in fmt and fmt["type"] not in FORMAT_TYPES:
            raise GrammarError(f"Format type not recognized: {fmt['type']}")
        kind = format_kind(fmt)
        checked: _Checked = getattr(self, "_" + ("json_schema" if kind == "qwen_xml_parameter" else kind))(
            fmt, (*path, kind)
        )
        return checked

    def _const_string(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if not isinstance(fmt.get("value"), str):
            raise GrammarError("ConstString format must have a value field with a string")
        return _Checked()

    def _json_schema(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict | bool):
            raise GrammarError("JSON schema format must have a json_schema field with a object or boolean value")
        if isinstance(fmt.get("style"), str) and fmt["style"] not in _JSON_STYLES and path[-1] != "qwen_xml_parameter":
            raise GrammarError(
                "style must be " + ", ".join(f'"{s}"' for s in _JSON_STYLES[:-1]) + ', or "deepseek_v4_1_xml"'
            )
        _flags(fmt, "any_order")
        spaces = fmt.get("max_whitespace_cnt")
        if spaces is not None and (isinstance(spaces, bool) or not isinstance(spaces, int | float)):
            raise GrammarError("max_whitespace_cnt must be an integer or null")
        if "excludes" in fmt:
            _strings(
                fmt["excludes"], "JSONSchema format's excludes must be an array of non-empty strings", non_empty=True
            )
        check_schema(schema)
        return _Checked()

    def _any_text(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        _budget(fmt, "max_tokens", "any_text")
        _budget(fmt, "max_chars", "any_text")
        if "excludes" not in fmt:
            if "type" not in fmt:
                raise GrammarError("Any text format should not have any fields other than type")
            return _Checked(unlimited=True)
        if not isinstance(fmt["excludes"], list):
            raise GrammarError("AnyText format's excluded_strs field must be an array")
        excludes = _strings(fmt["excludes"], "AnyText format's excluded_strs array must contain strings")
        return _Checked(unlimited=True, excluded=bool(excludes))

    def _grammar(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if not isinstance(fmt.get("grammar"), str) or not fmt["grammar"]:
            raise GrammarError("Grammar format must have a grammar field with a non-empty string")
        return _Checked()

    def _regex(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise GrammarError("Regex format must have a pattern field with a non-empty string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise GrammarError(f"Invalid regex: {exc}") from exc
        return _Checked()

    def _sequence(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        return self._elements(fmt, path, "Sequence")

    def _or(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        return self._elements(fmt, path, "Or")

    def _elements(self, fmt: dict[str, Any], path: tuple[str, ...], name: str) -> _Checked:
        if not isinstance(fmt.get("elements"), list):
            raise GrammarError(f"{name} format must have an elements field with an array")
        elements = [self.format(e, path) for e in fmt["elements"]]
        if not elements:
            raise GrammarError(f"{name} format must have at least one element")
        return _Checked(unlimited=any(e.unlimited and not e.excluded for e in elements))

    def _tag(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if "type" in fmt and fmt["type"] != "tag":
            raise GrammarError('Tag format\'s type must be a string "tag"')
        begin = fmt.get("begin")
        if isinstance(begin, dict):
            self._token(begin, path)
        elif not isinstance(begin, str):
            raise GrammarError("Tag format's begin field must be a string")
        if "content" not in fmt:
            raise GrammarError("Tag format must have a content field")
        content = self.format(fmt["content"], path)
        if "end" not in fmt:
            raise GrammarError("Tag format must have an end field")
        end = fmt["end"]
        if isinstance(end, list):
            if not end:
                raise GrammarError("Tag format's end array cannot be empty")
            _strings(end, "Tag format's end array must contain only strings")
        elif isinstance(end, dict):
            self._token(end, path)
        elif not isinstance(end, str):
            raise GrammarError("Tag format's end field must be a string or array of strings")
        ends = end if isinstance(end, list) else [end] if isinstance(end, str) else ["<token>"]
        if content.unlimited and not any(ends) and not content.excluded:
            raise GrammarError("When the content is unlimited, at least one end string must be non-empty")
        return _Checked()

    def _tag_list(self, fmt: dict[str, Any], path: tuple[str, ...], label: str) -> list[dict[str, Any]]:
        tags = fmt.get("tags")
        if not isinstance(tags, list):
            raise GrammarError(f"{label} must have a tags field with an array")
        for tag in tags:
            if not isinstance(tag, dict):
                raise GrammarError("Tag format must be an object")
            self._tag(tag, path)
        return tags

    def _triggered_tags(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if not isinstance(fmt.get("triggers"), list):
            raise GrammarError("Triggered tags format must have a triggers field with an array")
        triggers = _strings(
            fmt["triggers"], "Triggered tags format's triggers must be non-empty strings", non_empty=True
        )
        if not triggers:
            raise GrammarError("Triggered tags format's triggers must be non-empty")
        tags = self._tag_list(fmt, path, "Triggered tags format")
        if not tags:
            raise GrammarError("Triggered tags format's tags must be non-empty")
        excludes: list[str] = []
        if "excludes" in fmt:
            if not isinstance(fmt["excludes"], list):
                raise GrammarError("Triggered tags format should have a excludes field with an array")
            excludes = _strings(
                fmt["excludes"], "Triggered tags format's excluded_strs must be non-empty strings", non_empty=True
            )
        _flags(fmt, "at_least_one", "stop_after_first")
        for tag in tags:  # the converter's checks
            if not isinstance(tag["begin"], str):
                raise GrammarError("Tags in triggered_tags must have a string begin, not a token format")
            matched = [t for t in triggers if tag["begin"].startswith(t)]
            if len(matched) > 1:
                raise GrammarError("One tag matches multiple triggers in a triggered tags format")
            if not matched:
                raise GrammarError("One tag does not match any trigger in a triggered tags format")
        return _Checked(unlimited=True, excluded=bool(excludes))

    def _tags_with_separator(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        tags = self._tag_list(fmt, path, "Tags with separator format")
        if not tags:
            raise GrammarError("Tags with separator format's tags must be non-empty")
        if not isinstance(fmt.get("separator"), str):
            raise GrammarError("Tags with separator format's separator field must be a string")
        _flags(fmt, "at_least_one", "stop_after_first")
        return _Checked(unlimited=True)

    def _content(self, fmt: dict[str, Any], path: tuple[str, ...], name: str) -> _Checked:
        if "content" not in fmt:
            raise GrammarError(f"{name} format must have a content field")
        return self.format(fmt["content"], path)

    def _optional(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        return _Checked(unlimited=self._content(fmt, path, "Optional").unlimited)

    def _plus(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        self._content(fmt, path, "Plus")
        return _Checked(unlimited=True)

    def _star(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        self._content(fmt, path, "Star")
        return _Checked(unlimited=True)

    def _repeat(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        low, high = fmt.get("min"), fmt.get("max")
        if isinstance(low, bool) or not isinstance(low, int | float):
            raise GrammarError("Repeat format must have a min field (number)")
        if isinstance(high, bool) or not isinstance(high, int | float):
            raise GrammarError("Repeat format must have a max field (number)")
        low, high = int(low), int(high)
        if high >= 0 and low > high:
            raise GrammarError("Repeat min must be <= max")
        if low < 0:
            raise GrammarError("Repeat min must be >= 0")
        if high < -1:
            raise GrammarError("Repeat max must be -1 (unbounded) or >= 0")
        if low > _INT32:
            raise GrammarError(f"Repeat min is too large, must be <= {_INT32}")
        content = self._content(fmt, path, "Repeat")
        return _Checked(unlimited=high == -1 or high > _INT32 or (high != 0 and content.unlimited))

    def _token(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if "token" not in fmt:
            raise GrammarError("TokenFormat must have a token field")
        _token(fmt["token"])
        return _Checked()

    def _exclude_token(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        _tokens(fmt, "exclude_tokens")
        return _Checked()

    def _any_tokens(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        excluded = _tokens(fmt, "exclude_tokens")
        _budget(fmt, "max_tokens", "any_tokens")
        return _Checked(unlimited=True, excluded=bool(excluded))

    def _token_triggered_tags(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        if "trigger_tokens" not in fmt:
            raise GrammarError("TokenTriggeredTagsFormat must have a trigger_tokens field")
        if not _tokens(fmt, "trigger_tokens"):
            raise GrammarError("trigger_tokens must be non-empty")
        if not self._tag_list(fmt, path, "TokenTriggeredTagsFormat"):
            raise GrammarError("TokenTriggeredTagsFormat tags must be non-empty")
        excluded = _tokens(fmt, "exclude_tokens")
        _flags(fmt, "at_least_one", "stop_after_first")
        if any(not isinstance(t["begin"], dict) for t in fmt["tags"]):
            raise GrammarError("Tags in token_triggered_tags must have a token format begin, not a string")
        return _Checked(unlimited=True, excluded=bool(excluded))

    def _dispatch(self, fmt: dict[str, Any], path: tuple[str, ...], token: bool = False) -> _Checked:
        name = "TokenTagDispatch" if token else "TagDispatch"
        rules = fmt.get("rules")
        if not isinstance(rules, list):
            raise GrammarError(f"{name} format must have a rules field with an array")
        if not rules:
            raise GrammarError(f"{name} format rules must be non-empty")
        for rule in rules:
            if not isinstance(rule, list) or len(rule) != 2:
                raise GrammarError(f"{name} pair must be a 2-element array")
            if token:
                _token(rule[0])
            elif not isinstance(rule[0], str):
                raise GrammarError("TagDispatch pair first element must be a string")
            self.format(rule[1], path)
        _flags(fmt, "loop")
        if token:
            return _Checked(unlimited=True, excluded=bool(_tokens(fmt, "exclude_tokens")))
        excludes = fmt.get("excludes", [])
        if not isinstance(excludes, list):
            raise GrammarError("excludes must be an array")
        _strings(excludes, "excludes must contain non-empty strings", non_empty=True)
        return _Checked(unlimited=True, excluded=bool(excludes))

    def _token_dispatch(self, fmt: dict[str, Any], path: tuple[str, ...]) -> _Checked:
        return self._dispatch(fmt, path, token=True)


def checker() -> _Checker:
    """A checker of one format tree (``.format(fmt, ())`` raises ``GrammarError``)."""
    return _Checker()
