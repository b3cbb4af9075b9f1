"""``OutputConstraint`` -> the engines' grammar parameter: an xgrammar structural tag.

vLLM (``structured_outputs.structural_tag``) and SGLang (``sampling_params.structural_tag``)
both compile it with xgrammar (the ``{"type": "structural_tag", "format": ...}`` form, with
``any_text`` ``excludes``: xgrammar 0.1.30 and later; vLLM 0.33 pins 0.2.8, SGLang 0.5.23
0.2.7). The tag constrains only what a Harmony model must get right and leaves the rest free,
so the model still reasons first:

- ``final_schema``: the final channel's text is the schema's JSON, whichever final header the
  model writes (``<|channel|>final<|message|>`` or ``<|channel|>final <|constrain|>json<|message|>``).
  Free text (analysis, preambles, tool calls) until then, then the JSON, then only a stop token.
- ``tools``: the output must reach a call ``to=NAMESPACE.NAME`` (any header form Harmony
  renders) with a JSON object as arguments. Before it only analysis and commentary messages
  (preambles) may come: the free text cannot contain a final channel, so a model that wants to
  answer cannot write its answer and be forced into call syntax inside it; it must call.

Both engines apply the grammar from the first output token for gpt-oss (SGLang's /generate;
vLLM from 0.27, whose gpt-oss reasoning parser no longer gates grammars). vLLM 0.10.2-0.26
applies grammars only once ``<|channel|>final...<|message|>`` was generated, unless started with
reasoning-time structured outputs (``--structured-outputs-config.enable_in_reasoning``): start
those releases so for forced tool calls; ``final_schema`` tags also accept the bare JSON there.

Stop tokens (``<|return|>``, ``<|call|>``) are never spelled in the tag: depending on the engine
they are xgrammar stop tokens (allowed wherever the grammar may end) or ordinary tokens (taken by
a trailing ``any_text``). A generation resumed from its tokens gets no grammar: the tag would
restart in the middle of the output."""

from __future__ import annotations

import json
from typing import Any

from contracts.messages.generate import GenerateRequest, OutputConstraint

FINAL_TRIGGER = "final<|message|>"  # follows <|channel|>; <|message|> only ever ends a header
TYPED_FINAL_TRIGGER = "final <|constrain|>"  # the typed final header gpt-oss also writes
TYPED_FINAL_HEADER = "final <|constrain|>json<|message|>"
# what the free text before a required call may not contain: a final channel header
NO_FINAL = ["<|channel|>final"]
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


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema}


def _seq(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


ANY_TEXT: dict[str, Any] = {"type": "any_text"}


def final_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The final answer is ``schema``'s JSON; everything before the final channel is free."""
    answer = _json(schema)
    return {
        "type": "or",
        "elements": [
            # the grammar starts at the final answer (vLLM 0.10.2-0.26's gpt-oss reasoning gate)
            _seq(answer, ANY_TEXT),
            # the grammar sees the whole output: free Harmony messages up to a final header
            _seq(
                _const("<|channel|>"),
                {
                    "type": "triggered_tags",
                    "triggers": [FINAL_TRIGGER, TYPED_FINAL_TRIGGER],
                    "tags": [
                        {"type": "tag", "begin": FINAL_TRIGGER, "content": answer, "end": ""},
                        {"type": "tag", "begin": TYPED_FINAL_HEADER, "content": answer, "end": ""},
                    ],
                    "at_least_one": False,
                    "stop_after_first": True,
                },
            ),
            # a recipient-first header (" to=functions.f<|channel|>commentary ..."): a tool call
            _seq(_const(" to="), ANY_TEXT),
        ],
    }


def tool_call_format(namespace: str, names: list[str]) -> dict[str, Any]:
    """The output reaches a call to ``namespace.NAME`` (NAME in ``names``) with JSON arguments;
    before it, analysis and commentary messages only (never a final answer)."""
    recipient = f" to={namespace}."
    calls = {
        "type": "or",
        "elements": [
            _seq(_const(name + end), _json(ARGUMENTS_SCHEMA), ANY_TEXT)
            for name in dict.fromkeys(names)
            for end in CALL_HEADER_ENDS
        ],
    }
    # after the first <|channel|>: its channel (not final), then any text without a final
    # channel header, up to the first "to=NAMESPACE.": the call's
    free = _seq(
        {"type": "or", "elements": [_const("analysis"), _const("commentary")]},
        {"type": "any_text", "excludes": NO_FINAL},
    )
    before = {
        "type": "or",
        "elements": [
            {"type": "tag", "begin": "<|channel|>", "content": free, "end": recipient},
            # or the first message is the call, recipient first
            _const(recipient),
        ],
    }
    return _seq(before, calls)


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
