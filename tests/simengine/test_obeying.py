"""The simulator generates THROUGH the grammar it is sent, as a real engine's mask makes a model
do: what the grammar allows is taken, what it refuses is replaced by what it allows. So a
grammar a model can escape is escaped here too (driven over HTTP, in this event loop)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from openai_harmony import DeveloperContent, Message, Role

from contracts.messages.generate import OutputConstraint
from services.common.harmony import CALL, RETURN, harmony_encoding
from services.dispatcher.engines.constraints import CALL_HEADER_ENDS, structural_tag, tool_call_format
from services.simengine.app import serving
from services.simengine.settings import Settings
from tests.simengine.prompts import LOOKUP, WEATHER, parse_output, render, tool_round, user, user_prompt
from tests.simengine.wire import events, sglang_body, vllm_body

ENC = harmony_encoding()
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
PROTOCOLS = ["vllm", "sglang"]


async def generate(http: httpx.AsyncClient, protocol: str, prompt: list[int], rid: str, tag: Any) -> list[int]:
    """The output token ids for ``prompt`` under the structural tag ``tag``."""
    text = json.dumps(tag)
    if protocol == "vllm":
        body = vllm_body(prompt, rid, stream=False, structured_outputs={"structural_tag": text})
        resp = await http.post("/v1/completions", json=body)
        ids: list[int] = resp.json()["choices"][0]["token_ids"]
        return ids
    resp = await http.post("/generate", json={**sglang_body(prompt, rid, structural_tag=text), "stream": False})
    out: list[int] = resp.json()["output_ids"]
    return out


def final_text(ids: list[int]) -> str:
    finals = [m for m in parse_output(ids) if m.get("channel") == "final"]
    assert finals, ENC.decode(ids)
    return str(finals[-1]["content"][0]["text"])


def call_format(tools: list[str]) -> dict[str, Any]:
    """What follows ``to=functions.`` in Chorus's required-call tag: a name, a header end, JSON."""
    fmt = tool_call_format("functions", tools)
    calls: dict[str, Any] = fmt["elements"][1]
    assert {e["elements"][0]["value"] for e in calls["elements"]} == {
        t + end for t in tools for end in CALL_HEADER_ENDS
    }
    return calls


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_final_schema_grammar_makes_the_answer_conform(http: httpx.AsyncClient, protocol: str) -> None:
    """The script answers in words; the grammar refuses them where JSON is due: the model
    writes the shortest JSON the schema allows instead."""
    tag = structural_tag(OutputConstraint(final_schema=SCHEMA))
    ids = await generate(http, protocol, user_prompt("Plan my trip"), f"f-{protocol}", tag)
    answer = json.loads(final_text(ids))
    jsonschema.validate(answer, SCHEMA)
    assert answer == {"city": "", "days": 1} and ids[-1] == RETURN


async def test_plain_json_grammars_constrain_from_the_first_token(http: httpx.AsyncClient) -> None:
    """vLLM's ``json`` and SGLang's ``json_schema`` are JSON grammars: from the first output
    token (vLLM 0.27+, SGLang), gpt-oss can write nothing but the JSON, no Harmony header."""
    prompt = user_prompt("Plan my trip")
    body = vllm_body(prompt, "j1", stream=False, structured_outputs={"json": SCHEMA})
    ids = (await http.post("/v1/completions", json=body)).json()["choices"][0]["token_ids"]
    assert ENC.decode(ids) == '{"city": "", "days": 1}<|return|>'
    body = {**sglang_body(prompt, "j2", json_schema=json.dumps(SCHEMA)), "stream": False}
    assert (await http.post("/generate", json=body)).json()["output_ids"] == ids


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_required_call_header_is_moved_to_an_allowed_tool(http: httpx.AsyncClient, protocol: str) -> None:
    """The script calls get_weather; the grammar refuses that name in the header: the model
    calls the tool the grammar allows, with arguments from its signature."""
    tag = structural_tag(OutputConstraint(tools=["lookup"]))
    ids = await generate(http, protocol, user_prompt("Weather in Paris?", [WEATHER, LOOKUP]), f"c-{protocol}", tag)
    call = parse_output(ids)[-1]
    assert call["recipient"] == "functions.lookup" and ids[-1] == CALL
    assert json.loads(call["content"][0]["text"]) == {"query": "Paris"}


ESCAPABLE_BEFORE = {  # the free part of the required-call tag Chorus sent until 2026-11-28
    "type": "or",
    "elements": [
        {"type": "tag", "begin": "<|channel|>", "content": {"type": "any_text"}, "end": " to=functions."},
        {"type": "const_string", "value": " to=functions."},
    ],
}
ANSWERING = [
    (user_prompt("Hello there"), "Hello! You said: Hello there"),
    (tool_round("Weather in Oslo?", '{"city":"Oslo"}', "sunny"), "According to get_weather: sunny"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("prompt", "answer"), ANSWERING, ids=["no-tools", "after-a-tool-result"])
async def test_a_required_call_tag_whose_free_text_may_hold_a_final_answer_is_escaped(
    http: httpx.AsyncClient, protocol: str, prompt: list[int], answer: str
) -> None:
    """The hole the required-call tag had (issue 24): free text of ``<|channel|>`` + any text up
    to `` to=functions.``: a model that wants to answer writes its whole final message, cannot
    stop there, and is forced into the call syntax INSIDE its answer; it ends with <|return|>
    and no call is parsed. The simulator, obeying the grammar, escapes it as a model does."""
    tag = {
        "type": "structural_tag",
        "format": {"type": "sequence", "elements": [ESCAPABLE_BEFORE, call_format(["get_weather"])]},
    }
    ids = await generate(http, protocol, prompt, f"e-{protocol}-{len(prompt)}", tag)
    text = ENC.decode(ids)
    escaped = f"<|channel|>final<|message|>{answer} to=functions.get_weather json<|message|>{{}}<|return|>"
    assert text.endswith(escaped), text
    assert ids[-1] == RETURN
    assert not [m for m in parse_output(ids) if m.get("recipient")]  # no tool call in the output


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("prompt", "answer"), ANSWERING, ids=["no-tools", "after-a-tool-result"])
async def test_chorus_required_call_tag_gets_a_real_call(
    http: httpx.AsyncClient, protocol: str, prompt: list[int], answer: str
) -> None:
    """Chorus's tag (``tool_call_format``): before the call, analysis and commentary only, no
    final channel anywhere: the script's final header is refused and the model calls the tool
    there instead; its answer is nowhere. With the tool declared in the prompt (as Chorus always
    renders it), the call is the well-formed Harmony call the model knows."""
    tag = structural_tag(OutputConstraint(tools=["get_weather"]))
    ids = await generate(http, protocol, prompt, f"r-{protocol}-{len(prompt)}", tag)
    text = ENC.decode(ids)
    assert "<|channel|>final" not in text and answer not in text, text
    assert ids[-1] == CALL and " to=functions.get_weather" in text, text
    if "get_weather" in ENC.decode(prompt):  # declared: the model knows the call it makes
        header = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        assert header in text, text
        call = parse_output(ids)[-1]
        assert call["recipient"] == "functions.get_weather" and call["channel"] == "commentary"
        assert isinstance(json.loads(call["content"][0]["text"]), dict)


def response_format_prompt(text: str, tools: list[Any] | None = None) -> list[int]:
    """A prompt whose developer message asks for SCHEMA (as Chorus's gateway renders one)."""
    section = f"# Response Formats\n\n## trip\n\n// a trip\n{json.dumps(SCHEMA)}"
    content = DeveloperContent.new().with_instructions(section)
    if tools:
        content = content.with_function_tools(tools)
    return render(Message.from_role_and_content(Role.DEVELOPER, content), user(text))


async def completion_ids(client: httpx.AsyncClient, prompt: list[int], rid: str, **structured: Any) -> list[int]:
    body = vllm_body(prompt, rid, stream=False, structured_outputs=structured)
    ids: list[int] = (await client.post("/v1/completions", json=body)).json()["choices"][0]["token_ids"]
    return ids


async def test_vllm_before_0_27_applies_grammars_after_the_final_header_only() -> None:
    """vLLM 0.10.2-0.26 (``vllm_reasoning_gate``): nothing before ``<|channel|>final...<|message|>``
    is constrained, so a required call cannot be forced (the script's call goes out as
    written); ``enable_in_reasoning`` constrains from the first token again."""
    required = json.dumps(structural_tag(OutputConstraint(tools=["lookup"])))
    final = json.dumps(structural_tag(OutputConstraint(final_schema=SCHEMA)))
    weather = user_prompt("Weather in Paris?", [WEATHER, LOOKUP])
    gate = Settings(protocol="vllm", vllm_reasoning_gate=True)
    async with serving(gate) as gated, httpx.AsyncClient(base_url=gated.url, timeout=10) as client:
        ids = await completion_ids(client, weather, "g1", structural_tag=required)
        assert parse_output(ids)[-1]["recipient"] == "functions.get_weather"  # not the required lookup
        ids = await completion_ids(client, response_format_prompt("Plan my trip"), "g2", structural_tag=final)
        assert json.loads(final_text(ids)) == {"city": "", "days": 1}
        ids = await completion_ids(client, user_prompt("Plan my trip"), "g3", json=SCHEMA)
        assert json.loads(final_text(ids)) == {"city": "", "days": 1}  # a header first, then the JSON
    eager = gate.model_copy(update={"vllm_enable_in_reasoning": True})
    async with serving(eager) as running, httpx.AsyncClient(base_url=running.url, timeout=10) as client:
        ids = await completion_ids(client, weather, "g4", structural_tag=required)
        assert parse_output(ids)[-1]["recipient"] == "functions.lookup"


async def test_streams_carry_the_constrained_output(http: httpx.AsyncClient) -> None:
    """The stream delivers what the grammar let through, token by token, like the whole body."""
    tag = json.dumps(structural_tag(OutputConstraint(tools=["lookup"])))
    prompt = user_prompt("Weather in Paris?", [WEATHER, LOOKUP])
    chunks = await events(http, "/v1/completions", vllm_body(prompt, "s1", structured_outputs={"structural_tag": tag}))
    ids = [t for c in chunks[:-1] for t in c["choices"][0]["token_ids"]]
    assert ids == await generate(http, "vllm", prompt, "s2", json.loads(tag))
    assert chunks[-2]["choices"][0]["stop_reason"] == CALL


async def test_grammars_the_simulator_cannot_run_are_refused_clearly(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/v1/completions", json=vllm_body(user_prompt("hi"), "u1", structured_outputs={"grammar": "root ::= 'a'"})
    )
    assert resp.status_code == 400 and "simulated engine cannot run" in resp.json()["error"]["message"]
    ebnf = {"type": "structural_tag", "format": {"type": "grammar", "grammar": "root ::= 'a'"}}
    body = {**sglang_body(user_prompt("hi"), "u2", structural_tag=json.dumps(ebnf)), "stream": False}
    resp = await http.post("/generate", json=body)
    assert resp.status_code == 400 and "'grammar' format is not supported" in resp.json()["error"]["message"]
