"""The choice of engine for a prompt: the lowest expected cost, as NVIDIA Dynamo's KV router and
SGLang's cache_aware policy do (see /work/shared/REFERENCE.md "Worker selection").

    cost = (1 + work_weight) * (prompt_len - cached) + queued_prefill_tokens
           + decode_weight * running_tokens

in prefill tokens: the prompt tokens the engine must still compute (those it holds cost ~0), the
prefill work already queued before them, and the generations it is decoding, weighed by the
context they hold (as NVIDIA Dynamo weighs active decode blocks): a long-context decode slows
every step of the engine more than a short one (``decode_weight`` converts one token held by a
running generation into prefill tokens of delay). An idle engine is therefore preferred for a
prompt nobody holds, while a prompt an engine holds stays there unless its load outweighs it.

The uncached tokens count twice over: once as this request's own wait, and ``work_weight`` more
as the work it adds to the engine, which every request queued behind it pays for (one engine
prefills at a time), and so do the next turns of the conversations it serves, due back any
moment. Counting the wait alone, a conversation whose engine has a long prompt queued goes
elsewhere when its own prefill there would take about as long: no faster for it, but the other
engine's queue grows by a whole prompt, its cache takes a copy it did not need, and the
conversation's next turn finds its history in two half-homes (the fleet benchmark: 1 to 8 of its
64 later turns moved so, each delaying the turns behind it by a whole prefill, ~130 ms; with the
weight, none did). The extra weight applies to an engine with work in hand or used lately
(``recent``), not to one nobody has used for a while: no one pays there, and a new or restarted
engine takes its share of a shared prefix at once.

Why a shared system prompt cannot pull every request onto one engine: the cache term can make an
engine at most ``(1 + work_weight) * cached`` cheaper than the others. Every request it wins adds
its uncached tail to that engine's queue and its context to its running load, so its cost rises
until the queue outweighs the saving; the next request goes to another engine, which then caches
the shared prefix too, and from then on the prefix is equal everywhere and load alone decides. A
long shared prefix buys stickiness worth a bounded multiple of its length in queued work, no more.

Ties (equal cost) go to the engine running fewer generations, then rotate with ``turn`` (a
counter the caller advances per request), so equal engines share the load yet the ranking is a
pure function of its arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# (engine id, expected cost in prefill tokens, reason)
Choice = tuple[str, float, str]


@dataclass(frozen=True, slots=True)
class EngineView:
    """What the choice needs to know of one engine now."""

    id: str
    healthy: bool = True
    block_size: int = 16
    queued_prefill_tokens: int = 0  # prompt tokens sent to it and not prefilled yet
    running: int = 0  # generations it is decoding
    running_tokens: int = 0  # the context (prompt) tokens those generations hold
    recent: bool = False  # it served a generation lately (its conversations are likely to return)


def choose(
    prompt_len: int,
    matches: Mapping[str, int],
    engines: Sequence[EngineView],
    *,
    decode_weight: float,
    work_weight: float = 0.0,
    turn: int = 0,
) -> list[Choice]:
    """``engines`` ranked by expected cost, best first, each with its cost and a reason.

    ``matches`` are cached prompt TOKENS per engine id (absent: none; more than ``prompt_len``
    counts as ``prompt_len``). Unhealthy engines are left out unless all are (the health poll may
    lag behind a restart). The reason is "only" for a single candidate; otherwise "cache" when the
    engine's cached tokens decided its place over the next one (without them it would not be
    cheaper), else "load". Empty when ``engines`` is."""
    candidates = [e for e in engines if e.healthy] or list(engines)
    if not candidates:
        return []
    m = len(candidates)
    rows = []
    for i, e in enumerate(candidates):
        cached = min(max(matches.get(e.id, 0), 0), prompt_len)
        # the work this prompt adds is paid by the requests on the engine and those about to come
        # back to it (its conversations' next turns): none on an engine nobody has used lately
        weight = 1 + (work_weight if e.queued_prefill_tokens or e.running or e.recent else 0.0)
        cost = weight * (prompt_len - cached) + e.queued_prefill_tokens + decode_weight * e.running_tokens
        rows.append((cost, e.running, (i - turn) % m, e.id, weight * cached))
    rows.sort()
    if m == 1:
        return [(rows[0][3], float(rows[0][0]), "only")]
    out: list[Choice] = []
    for r, (cost, _, _, engine, saved) in enumerate(rows):
        runner_up = rows[r + 1][0] if r + 1 < m else None
        decisive = saved > 0 and runner_up is not None and runner_up <= cost + saved
        out.append((engine, float(cost), "cache" if decisive else "load"))
    return out


def least_load(engines: Sequence[EngineView], *, decode_weight: float, turn: int = 0) -> list[Choice]:
    """``engines`` ranked by load alone (queued prefill + ``decode_weight`` x running tokens), as
    ``choose`` without a prompt: for requests whose prompt is unknown or not worth matching."""
    return choose(0, {}, engines, decode_weight=decode_weight, turn=turn)
