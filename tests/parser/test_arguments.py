"""Tool-call arguments: what is streamed is always a prefix of the final ``arguments`` and the
deltas joined are exactly them (the rule in services/parser/arguments.py), for valid JSON, for
JSON that needs one of the unambiguous repairs, and for any text at all; in any split, and
through a whole parse session in any token batching."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.messages.items import FunctionCallItem
from contracts.messages.parse import ItemAdded, ItemDelta, ItemDone
from services.common.harmony import harmony_encoding
from services.parser.arguments import ArgumentStream, repair_json
from services.parser.session import ParseSession

ENC = harmony_encoding()
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
SPLITS = st.lists(st.integers(1, 7), max_size=40)
# characters JSON is made of, and a few it is not: anything the model could write
JUNK = st.text(alphabet=st.sampled_from(list("{}[]\",:' \n\t0123456789.-+eEtrufalsn\\ab/u")), max_size=40)


def pieces(text: str, sizes: list[int]) -> list[str]:
    out, i = [], 0
    for n in sizes:
        if i >= len(text):
            break
        out.append(text[i : i + n])
        i += n
    return [*out, text[i:]] if i < len(text) else out


def stream(text: str, sizes: list[int]) -> tuple[str, str, str | None]:
    """(what feed handed out, the final arguments, the repair) for ``text`` fed in pieces."""
    args = ArgumentStream()
    sent = "".join(args.feed(p) for p in pieces(text, sizes))
    final, kind = args.finish()
    assert len(sent) == args.sent
    return sent, final, kind


@SETTINGS
@given(VALUES, st.sampled_from([None, 0, 2]), st.booleans(), st.sampled_from(["", " ", "\n "]), SPLITS)
def test_valid_json_streams_as_it_comes(
    value: Any, indent: int | None, compact: bool, pad: str, sizes: list[int]
) -> None:
    text = pad + json.dumps(value, indent=indent, separators=(",", ":") if compact else None) + pad
    args = ArgumentStream()
    for p in pieces(text, sizes):
        args.feed(p)
        assert args.ok, "a valid document is a valid prefix all along"
    sent = text.strip()
    assert args.sent == len(sent), "everything but surrounding whitespace went out before the end"
    assert args.finish() == (sent, None)


def _single_quoted(encoded: str) -> str:
    body = re.sub(r"\\.|'", lambda m: {'\\"': '"', "'": "\\'"}.get(m.group(), m.group()), encoded[1:-1])
    return f"'{body}'"


@st.composite
def broken(draw: st.DrawFn) -> tuple[Any, str]:
    """A value and a rendering with the faults the repair undoes: trailing commas, single
    quotes, raw newlines and tabs in strings, closing brackets left off at the end."""
    value = draw(VALUES)

    def render(v: Any) -> str:
        if isinstance(v, dict):
            body = ", ".join(f"{render(k)}: {render(x)}" for k, x in v.items())
            return "{" + body + ("," if bool(v) and draw(st.booleans()) else "") + "}"
        if isinstance(v, list):
            return "[" + ", ".join(render(x) for x in v) + ("," if bool(v) and draw(st.booleans()) else "") + "]"
        encoded = json.dumps(v, ensure_ascii=False)
        if isinstance(v, str):
            if draw(st.booleans()):
                encoded = re.sub(
                    r"\\[nt]|\\\\", lambda m: {"\\n": "\n", "\\t": "\t"}.get(m.group(), m.group()), encoded
                )
            if draw(st.booleans()):
                encoded = _single_quoted(encoded)
        return encoded

    text = render(value)
    cut = draw(st.integers(0, len(text) - len(text.rstrip("}]"))))
    return value, text[: len(text) - cut] if cut else text


@SETTINGS
@given(broken(), SPLITS)
def test_repairs_keep_what_was_sent(case: tuple[Any, str], sizes: list[int]) -> None:
    value, text = case
    sent, final, kind = stream(text, sizes)
    assert final.startswith(sent)
    assert json.loads(final) == value, (text, final)
    valid = True
    try:
        json.loads(text)
    except ValueError:
        valid = False
    assert kind == (None if valid else "arguments_repaired")
    assert stream(text, [])[1:] == (final, kind), "the result does not depend on how the text arrived"


@SETTINGS
@given(JUNK, SPLITS)
def test_any_text_deltas_are_the_arguments(text: str, sizes: list[int]) -> None:
    sent, final, kind = stream(text, sizes)
    assert final.startswith(sent)
    assert stream(text, [])[1:] == (final, kind)
    if kind == "arguments_not_json":
        assert final == text.strip()
    else:
        json.loads(final)
    try:
        json.loads(text)
    except ValueError:
        return
    assert (final, kind) == (text.strip(), None)


@pytest.mark.parametrize(
    ("text", "fixed"),
    [
        ('{"city": "Pune",}', '{"city": "Pune"}'),
        ('{"a":1 ,\n}', '{"a":1 \n}'),
        ("[1, [2,], 3,]", "[1, [2], 3]"),
        ("{'city': 'Pune'}", '{"city": "Pune"}'),
        ("""{'q': 'say "hi"', "n": "it's"}""", '{"q": "say \\"hi\\"", "n": "it\'s"}'),
        ("{'q': 'it\\'s'}", '{"q": "it\'s"}'),
        ('{"code": "a\n\tb"}', '{"code": "a\\n\\tb"}'),
        ('{"data":{"x":[1,2', '{"data":{"x":[1,2]}}'),
        ('{"a": "x, }"', '{"a": "x, }"}'),
        ('{"a": 1,', '{"a": 1}'),
        ("", "{}"),
    ],
)
def test_repairs_edit_only_where_the_text_breaks(text: str, fixed: str) -> None:
    assert repair_json(text) == (fixed, True)


@pytest.mark.parametrize(
    "text", ['{"a": }', '{"a"', '{"a": 1} extra', "city: Paris", '{"a": "open', '{"a": 0123}', "[1 2]", '{"a": 1.}']
)
def test_ambiguous_text_is_not_repaired(text: str) -> None:
    assert repair_json(text) == (text, False)


def _call_events(arguments: str, chunks: list[int]) -> tuple[str, str]:
    """(the arguments deltas joined, ItemDone's arguments) for a call whose body is ``arguments``."""
    text = f"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{arguments}<|call|>"
    ids = ENC.encode(text, allowed_special="all")
    session = ParseSession(ENC, "args", ["f"])
    events, i = [], 0
    for n in chunks:
        events += session.feed(ids[i : i + n])
        i += n
    events += session.feed(ids[i:]) + session.finish("stop")
    index = next(e.output_index for e in events if isinstance(e, ItemAdded) and isinstance(e.item, FunctionCallItem))
    streamed = "".join(e.delta for e in events if isinstance(e, ItemDelta) and e.output_index == index)
    done = next(e.item for e in events if isinstance(e, ItemDone) and e.output_index == index)
    assert isinstance(done, FunctionCallItem)
    return streamed, done.arguments


@SETTINGS
@given(
    st.one_of(broken().map(lambda case: case[1]), JUNK, VALUES.map(lambda v: json.dumps(v, ensure_ascii=False))),
    st.lists(st.integers(1, 6), max_size=30),
)
def test_session_streams_the_final_arguments(arguments: str, chunks: list[int]) -> None:
    streamed, done = _call_events(arguments, chunks)
    assert streamed == done
    assert (streamed, done) == _call_events(arguments, [1] * 200)
    # what the stream gives for the decoded text (the session adds nothing of its own)
    assert done == stream(ENC.decode(ENC.encode(arguments, disallowed_special=())), [])[1]
