"""The choice of engine by expected cost: cached prompt tokens against queued work."""

from __future__ import annotations

from collections import Counter

import pytest

from services.dispatcher.routing import EngineView, choose, least_load

W = 0.5  # decode weight: a token held by a running generation weighs half a prefill token


def test_cache_wins_when_load_is_equal() -> None:
    engines = [EngineView("a", queued_prefill_tokens=500), EngineView("b", queued_prefill_tokens=500)]
    ranked = choose(2000, {"b": 1500}, engines, decode_weight=W)
    assert ranked == [("b", 1000.0, "cache"), ("a", 2500.0, "load")]


def test_load_wins_when_the_queue_exceeds_the_saving() -> None:
    engines = [EngineView("a", queued_prefill_tokens=1800), EngineView("b", running=2, running_tokens=400)]
    ranked = choose(2000, {"a": 1500}, engines, decode_weight=W)
    assert [(e, reason) for e, _, reason in ranked] == [("b", "load"), ("a", "load")]
    assert ranked[0][1] == 2000 + 400 * W and ranked[1][1] == 500 + 1800
    # a lighter queue and the cache wins again, because of the cache
    engines[0] = EngineView("a", queued_prefill_tokens=600)
    assert choose(2000, {"a": 1500}, engines, decode_weight=W)[0] == ("a", 1100.0, "cache")


def test_a_winner_by_load_alone_says_load() -> None:
    engines = [EngineView("a"), EngineView("b", queued_prefill_tokens=5000)]
    assert choose(2000, {"a": 10, "b": 20}, engines, decode_weight=W)[0] == ("a", 1990.0, "load")


def test_unhealthy_engines_are_excluded_unless_all_are() -> None:
    engines = [EngineView("a", healthy=False), EngineView("b", queued_prefill_tokens=9000)]
    assert choose(100, {"a": 100}, engines, decode_weight=W) == [("b", 9100.0, "only")]
    down = [EngineView("a", healthy=False), EngineView("b", healthy=False)]
    assert [e for e, _, _ in choose(100, {"b": 100}, down, decode_weight=W)] == ["b", "a"]
    assert choose(100, {}, [], decode_weight=W) == []


def test_cached_tokens_are_clamped_to_the_prompt() -> None:
    assert choose(100, {"a": 500}, [EngineView("a")], decode_weight=W) == [("a", 0.0, "only")]


def test_ties_are_spread_across_equal_engines() -> None:
    engines = [EngineView(e, queued_prefill_tokens=10) for e in "abcd"]
    firsts = [choose(100, {}, engines, decode_weight=W, turn=t)[0][0] for t in range(8)]
    assert Counter(firsts) == {"a": 2, "b": 2, "c": 2, "d": 2}
    # deterministic for a given turn
    assert choose(100, {}, engines, decode_weight=W, turn=5) == choose(100, {}, engines, decode_weight=W, turn=5)
    # at equal cost, the engine running fewer generations first
    busy = [EngineView("a", running=3, running_tokens=400), EngineView("b", running=1, queued_prefill_tokens=200)]
    assert [e for e, _, _ in choose(100, {}, busy, decode_weight=W)] == ["b", "a"]
    assert [e for e, _, _ in least_load(busy, decode_weight=W, turn=1)] == ["b", "a"]


def test_least_load_ignores_prompts() -> None:
    engines = [EngineView("a", running=4, running_tokens=800), EngineView("b", queued_prefill_tokens=300)]
    assert least_load(engines, decode_weight=W) == [("b", 300.0, "load"), ("a", 400.0, "load")]


def test_an_idle_engine_takes_a_prompt_nobody_holds() -> None:
    """Decodes weigh by the context they hold: a new long prompt goes to the idle engine even
    though the busy one holds its shared system prompt."""
    engines = [EngineView("busy", running=4, running_tokens=20_000), EngineView("idle")]
    assert choose(5000, {"busy": 1400}, engines, decode_weight=0.15)[0][0] == "idle"
    # the conversation's own history outweighs that load: it stays
    assert choose(5000, {"busy": 4900}, engines, decode_weight=0.15)[0][0] == "busy"


def test_a_conversation_stays_where_moving_would_not_make_it_faster() -> None:
    """Its home has a whole prompt queued; prefilling its history on the other engine takes as
    long as the wait. Counting its wait alone it moves, and adds 5000 tokens to an engine whose
    own conversations are due back; counting the work it adds, it stays. A queue well past the
    saving still moves it, and so does an engine nobody has used lately (no one pays there)."""
    home = EngineView("home", queued_prefill_tokens=5000)
    engines = [home, EngineView("other", recent=True)]
    assert choose(5000, {"home": 4900}, engines, decode_weight=W)[0][0] == "other"
    assert choose(5000, {"home": 4900}, engines, decode_weight=W, work_weight=1.0)[0][:3:2] == ("home", "cache")
    swamped = [EngineView("home", queued_prefill_tokens=12_000), EngineView("other", recent=True)]
    assert choose(5000, {"home": 4900}, swamped, decode_weight=W, work_weight=1.0)[0][0] == "other"
    unused = [home, EngineView("other")]
    assert choose(5000, {"home": 4900}, unused, decode_weight=W, work_weight=1.0)[0][0] == "other"


@pytest.mark.parametrize("work_weight", [0.0, 1.0])
def test_a_shared_system_prompt_does_not_pull_everything_onto_one_engine(work_weight: float) -> None:
    shared, prompt = 1000, 1200  # every request: the same 1000-token system prompt + 200 of its own
    queued = dict.fromkeys("abc", 0)
    holds: dict[str, int] = {"a": shared}  # only a has seen the system prompt yet
    served: Counter[str] = Counter()
    for turn in range(60):
        engines = [EngineView(e, queued_prefill_tokens=q) for e, q in queued.items()]
        engine, _, _ = choose(prompt, holds, engines, decode_weight=W, work_weight=work_weight, turn=turn)[0]
        served[engine] += 1
        queued[engine] += prompt - holds.get(engine, 0)
        holds[engine] = shared
        for e in queued:  # each engine prefills 100 tokens between two requests
            queued[e] = max(0, queued[e] - 100)
    assert set(served) == {"a", "b", "c"} and max(served.values()) < 40
