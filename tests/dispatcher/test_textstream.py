"""Text mode converter: any split of an upstream's text gives the same Harmony stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.harmony import harmony_encoding
from services.dispatcher.textstream import TextToHarmonyTokens

ENC = harmony_encoding()
TEXTS = [
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi 👋 there.<|return|>",
    "  <think>Let me think about <b>tags</b>.</think>The answer is 4.",
    "Plain text with a < sign and <| half marker.",
]


def convert(text: str, cuts: list[int]) -> list[int]:
    tk = TextToHarmonyTokens(ENC)
    ids: list[int] = []
    last = 0
    for cut in sorted(set(c % (len(text) + 1) for c in cuts)):
        ids += tk.text(text[last:cut])
        last = cut
    ids += tk.text(text[last:])
    return ids + tk.finish("stop")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 500), max_size=40))
def test_any_chunking_gives_the_same_harmony(text: str, cuts: list[int]) -> None:
    """Token boundaries inside ordinary text may differ with the split; the Harmony stream the
    parser sees (every special token, every character) may not."""
    chunked, whole = convert(text, cuts), convert(text, [])
    assert ENC.decode(chunked) == ENC.decode(whole)
    assert [t for t in chunked if t >= 199998] == [t for t in whole if t >= 199998]


def test_shapes() -> None:
    assert ENC.decode(convert(TEXTS[1], [])) == (
        "<|channel|>analysis<|message|>Let me think about <b>tags</b>.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>"
    )
    assert ENC.decode(convert(TEXTS[2], [])) == f"<|channel|>final<|message|>{TEXTS[2]}<|return|>"
    tk = TextToHarmonyTokens(ENC)
    ids = tk.reasoning("Why.") + tk.content("Because.") + tk.finish("stop")
    assert ENC.decode(ids) == (
        "<|channel|>analysis<|message|>Why.<|end|><|start|>assistant<|channel|>final<|message|>Because.<|return|>"
    )
