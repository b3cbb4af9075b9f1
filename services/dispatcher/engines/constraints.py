"""``OutputConstraint`` -> the engines' grammar parameter: an xgrammar structural tag.

vLLM (``structured_outputs.structural_tag``) and SGLang (``sampling_params.structural_tag``)
both compile it with xgrammar (>= 0.1.25: the ``{"type": "structural_tag", "format": ...}``
form; only formats that version has are used). The tag constrains only what a Harmony model
must get right and leaves the rest free, so the model still reasons first:

- ``final_schema``: the final channel's text is the schema's JSON. Free text (analysis,
  preambles, tool calls) until ``final<|message|>``, then the JSON, then only a stop token.
- ``tools``: the output must reach a call ``to=NAMESPACE.NAME`` (any header form Harmony
  renders) with a JSON object as arguments; anything before it (analysis, preambles) is free.

Where the grammar starts differs between deployments, and each tag is correct for both:

- from the first output token (SGLang; vLLM with ``enable_in_reasoning``): the output begins
  ``<|channel|>`` (or `` to=`` for a recipient-first header);
- from the final answer's first token: vLLM turns its ``openai_gptoss`` reasoning parser on for
  gpt-oss by itself and then applies grammars only once ``<|channel|>final...<|message|>`` was
  generated. ``final_schema`` tags therefore also accept the bare JSON, and ``tools`` tags accept
  any answer there (a call cannot be forced after the final header; nothing is garbled).

Stop tokens (``<|return|>``, ``<|call|>``) are never spelled in the tag: depending on the engine
they are xgrammar stop tokens (allowed wherever the grammar may end) or ordinary tokens (taken by
a trailing ``any_text``). A generation resumed from its tokens gets no grammar: the tag would
restart in the middle of the output."""

from __future__ import annotations

import json
from typing import Any

from contracts.messages.generate import GenerateRequest, OutputConstraint

FINAL_TRIGGER = "final<|message|>"  # follows <|channel|>; <|message|> only ever ends a header
# what may follow "to=NAMESPACE.NAME" up to the arguments, in every header order Harmony has:
# "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" (the model's usual form),
# "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>" (the
# prompt's), and their "json" spellings without <|constrain|>
CALL_HEADER_ENDS = (
    " <|constrain|>json<|message|>",
    "<|constrain|>json<|message|>",
    " json<|message|>",
    "<|channel|>commentary <|constrain|>json<|message|>",
    "<|channel|>commentary json<|message|>",
)
ARGUMENTS_SCHEMA: dict[str, Any] = {"type": "object"}
# the first character of a final answer the engine constrains only from there (vLLM's gate):
# not "<" (a Harmony output starts "<|channel|>") and not " " (" to=" starts a call)
ANSWER_START = "[^< ]"


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema}


def _seq(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


ANY_TEXT: dict[str, Any] = {"type": "any_text"}


def final_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The final answer is ``schema``'s JSON; everything before the final channel is free."""
    return {
        "type": "or",
        "elements": [
            # the grammar starts at the final answer (vLLM's gpt-oss reasoning gate)
            _seq(_json(schema), ANY_TEXT),
            # the grammar sees the whole output: free Harmony messages up to the final header
            _seq(
                _const("<|channel|>"),
                {
                    "type": "triggered_tags",
                    "triggers": [FINAL_TRIGGER],
                    "tags": [{"type": "tag", "begin": FINAL_TRIGGER, "content": _json(schema), "end": ""}],
                    "at_least_one": False,
                    "stop_after_first": True,
                },
            ),
            # a recipient-first header (" to=functions.f<|channel|>commentary ..."): a tool call
            _seq(_const(" to="), ANY_TEXT),
        ],
    }


def tool_call_format(namespace: str, names: list[str]) -> dict[str, Any]:
    """The output reaches a call to ``namespace.NAME`` (NAME in ``names``) with JSON arguments."""
    recipient = f" to={namespace}."
    calls = {
        "type": "or",
        "elements": [
            _seq(_const(name + end), _json(ARGUMENTS_SCHEMA), ANY_TEXT)
            for name in dict.fromkeys(names)
            for end in CALL_HEADER_ENDS
        ],
    }
    before = {
        "type": "or",
        "elements": [
            # free messages (analysis, preambles), up to the first "to=NAMESPACE.": the call's
            {"type": "tag", "begin": "<|channel|>", "content": ANY_TEXT, "end": recipient},
            # or the first message is the call, recipient first
            _const(recipient),
        ],
    }
    return {
        "type": "or",
        "elements": [
            _seq(before, calls),
            # the grammar starts at a final answer (vLLM's gate): nothing can be forced there
            _seq({"type": "regex", "pattern": ANSWER_START}, ANY_TEXT),
        ],
    }


def structural_tag(constraint: OutputConstraint | None) -> dict[str, Any] | None:
    """The structural tag for a constraint (``None``: nothing to enforce). A required call wins
    over the final schema: this generation ends with the call, the answer comes in a later one."""
    if constraint is None:
        return None
    if constraint.tools:
        fmt = tool_call_format(constraint.namespace, constraint.tools)
    elif constraint.final_schema is not None:
        fmt = final_format(constraint.final_schema)
    else:
        return None
    return {"type": "structural_tag", "format": fmt}


def request_tag(req: GenerateRequest) -> str | None:
    """The request's structural tag as the JSON string both engines take, if it has one."""
    if req.resume_tokens:
        return None
    tag = structural_tag(req.sampling.constraint)
    return None if tag is None else json.dumps(tag, ensure_ascii=False, separators=(",", ":"))


def vllm_structured_outputs(req: GenerateRequest) -> dict[str, Any] | None:
    """vLLM's ``structured_outputs`` (StructuredOutputsParams: ``structural_tag`` is a string)."""
    tag = request_tag(req)
    return None if tag is None else {"structural_tag": tag}


def sglang_structural_tag(req: GenerateRequest) -> str | None:
    """SGLang's ``sampling_params.structural_tag`` (a JSON string)."""
    return request_tag(req)
