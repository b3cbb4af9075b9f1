"""Grammar parameters as the engines check them (SIMULATOR support code).

``check_structural_tag`` refuses what xgrammar 0.2.8 refuses when it parses, analyses and
converts a structural tag (cpp/structural_tag.cc, checked in ``tagcheck``: the same rules, the
same messages): the version vLLM 0.33.0 pins (requirements/common.txt ``xgrammar == 0.2.8``).
SGLang 0.5.23 pins 0.2.7, which differs only in ignoring ``json_schema``'s ``excludes``.
Since xgrammar 0.1.30, ``any_text`` and ``triggered_tags`` take ``excludes`` and a tag's
``end`` may be a list; since 0.1.33 there are ``optional``/``plus``/``star``/``repeat``,
``dispatch`` and the token formats; since 0.2.0 unlimited formats may stand anywhere in a
sequence or an ``or``. JSON schemas that are not schemas are refused too. What the grammar asks
of the output is not read here: the simulated model generates through it (``matcher``)."""

from __future__ import annotations

import json
from typing import Any

from services.simengine.tagcheck import GrammarError, check_schema, checker

__all__ = ["GrammarError", "check_schema", "check_structural_tag", "legacy_format"]


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
    checker().format(tag["format"], ())
    return tag


def legacy_format(tag: dict[str, Any]) -> dict[str, Any]:
    """A legacy tag (``structures`` + ``triggers``) as the format xgrammar makes of it."""
    tags = [
        {
            "type": "tag",
            "begin": s["begin"],
            "content": {"type": "json_schema", "json_schema": s["schema"]},
            "end": s["end"],
        }
        for s in tag["structures"]
    ]
    return {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}


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
