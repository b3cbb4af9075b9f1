"""The choice of engine for a prompt: the lowest expected cost, as NVIDIA Dynamo's KV router and
SGLang's cache_aware policy do (see /work/shared/REFERENCE.md "Worker selection").

    cost = (prompt_len - cached) + queued_prefill_tokens + decode_weight * running_tokens

in prefill tokens: the prompt tokens the engine must still compute (those it holds cost ~0), the
prefill work already queued before them, and the generations it is decoding, weighed by the
context they hold (as NVIDIA Dynamo weighs active decode blocks): a long-context decode slows
every step of the engine more than a short one (``decode_weight`` converts one token held by a
running generation into prefill tokens of delay). An idle engine is therefore preferred for a
prompt nobody holds, while a prompt an engine holds stays there unless its load outweighs it.

Why a shared system prompt cannot pull every request onto one engine: the cache term can make an
engine at most ``cached`` tokens (the shared prefix) cheaper than the others. Every request it
wins adds its uncached tail to that engine's queue and its context to its running load, so its cost
rises until the queue outweighs the saving; the next request goes to another engine, which then
caches the shared prefix too, and from then on the prefix is equal everywhere and load alone
decides. A long shared prefix buys stickiness worth its own length of queued work, no more.

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


def choose(
    prompt_len: int, matches: Mapping[str, int], engines: Sequence[EngineView], *, decode_weight: float, turn: int = 0
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
        cost = (prompt_len - cached) + e.queued_prefill_tokens + decode_weight * e.running_tokens
        rows.append((cost, e.running, (i - turn) % m, e.id, cached))
    rows.sort()
    if m == 1:
        return [(rows[0][3], float(rows[0][0]), "only")]
    out: list[Choice] = []
    for r, (cost, _, _, engine, cached) in enumerate(rows):
        runner_up = rows[r + 1][0] if r + 1 < m else None
        decisive = cached > 0 and runner_up is not None and runner_up <= cost + cached
        out.append((engine, float(cost), "cache" if decisive else "load"))
    return out


def least_load(engines: Sequence[EngineView], *, decode_weight: float, turn: int = 0) -> list[Choice]:
    """``engines`` ranked by load alone (queued prefill + ``decode_weight`` x running tokens), as
    ``choose`` without a prompt: for requests whose prompt is unknown or not worth matching."""
    return choose(0, {}, engines, decode_weight=decode_weight, turn=turn)
