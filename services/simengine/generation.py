"""One SIMULATED generation, protocol-neutral: the scripted token ids, generated through the
request's grammar if it has one, cut by max_tokens and stop ids, paced into chunks. The vLLM
and SGLang front ends only format what this yields."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from openai_harmony import HarmonyEncoding

from services.simengine.constrained import Constrained, generate
from services.simengine.matcher import Grammar, GrammarUnsupported
from services.simengine.script import Outcome, Script, limit, plan
from services.simengine.settings import Settings
from services.simengine.state import Recorder, RequestRecord

# What ends generation on its own (ignore_eos=False): <|return|>, reported by vLLM with a null
# stop_reason. <|call|> stops when the client lists it in stop_token_ids (then it is the
# stop_reason). <|endoftext|> does not stop the simulator, so [[sim:raw]] text can carry it.
EOS_TOKEN_IDS = (200002,)
SPECIAL_TOKEN_START = 199998


class SimRequestError(Exception):
    """A request the engine refuses before generating (how it says so is the protocol's)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class GrammarRefused(SimRequestError):
    """A grammar parameter the engine cannot compile."""


class Unsupported(SimRequestError):
    """A grammar the engines take that the simulator cannot run (say an EBNF grammar)."""


def runnable(build: Callable[[], Grammar]) -> Grammar:
    """The grammar ``build`` makes, or ``Unsupported`` (400) if the simulator cannot run it."""
    try:
        return build()
    except GrammarUnsupported as exc:
        raise Unsupported(400, f"The simulated engine cannot run this grammar: {exc} is not supported.") from exc


class StatusDirective(SimRequestError):
    """``[[sim:status=N]]``: an HTTP error the test asked for (a proxy's or the server's)."""


# the protocol's own checks of a request (context length, sampling and grammar parameters):
# raise ``SimRequestError``; return the request's grammar and where it starts, if it has one
Check = Callable[[list[int]], Constrained | None]


@dataclass(frozen=True)
class Piece:
    """A chunk of output as the engine would deliver it."""

    token_ids: list[int]
    sent: int  # tokens delivered so far, this chunk included
    last: bool  # the chunk that finishes the generation (carries finish_reason)
    error: str | None = None  # a mid-stream failure after the tokens so far


class Generation:
    def __init__(
        self,
        record: RequestRecord,
        script: Script,
        outcome: Outcome,
        settings: Settings,
        recorder: Recorder,
        cached_tokens: int,
    ) -> None:
        self.record, self.script, self.outcome = record, script, outcome
        self.settings, self.recorder = settings, recorder
        self.cached_tokens = cached_tokens
        said = script.directives
        delay_ms = said.delay_ms
        self.chunk_size = max(1, settings.tokens_per_chunk)
        self.delay_s = delay_ms / 1000 if delay_ms is not None else settings.token_delay_ms * self.chunk_size / 1000
        self.error_after = said.error_after

    @property
    def prompt_tokens(self) -> int:
        return len(self.record.prompt_token_ids)

    async def pieces(self) -> AsyncIterator[Piece]:
        """The output in chunks, paced; stops early when the request is aborted. With
        ``error_after``, the tokens before the failure, then a piece carrying the error."""
        ids = self.outcome.token_ids
        failing = self.error_after is not None and self.error_after < len(ids)
        total = min(len(ids), max(0, self.error_after or 0)) if failing else len(ids)
        if self.settings.prefill_delay_ms > 0:
            await asyncio.sleep(self.settings.prefill_delay_ms / 1000)
        await self._prefill()
        self.recorder.running += 1
        try:
            sent = 0
            # at least one piece, even for an empty output: it carries the finish
            while sent < total or (sent == 0 and not failing):
                if self.record.aborted:
                    return
                chunk = ids[sent : min(sent + self.chunk_size, total)]
                sent += len(chunk)
                last = not failing and sent == total
                yield Piece(chunk, sent, last)
                if last:
                    return
                await self._pause()
            if not self.record.aborted:
                yield Piece([], sent, True, error=f"simulated engine failure after {sent} tokens")
        finally:
            self.recorder.running -= 1

    async def _prefill(self) -> None:
        """The prompt tokens its prefix cache did not hold cost ``prefill_us_per_token`` each,
        one prefill at a time (the next request's prefill waits for this one)."""
        uncached = self.prompt_tokens - self.cached_tokens
        cost = self.settings.prefill_us_per_token
        if cost <= 0 or uncached <= 0:
            return
        async with self.recorder.prefill_lock:
            if not self.record.aborted:
                await asyncio.sleep(uncached * cost / 1_000_000)

    async def _pause(self) -> None:
        """The pause between chunks; wakes early on an abort. Zero delay still yields to the
        loop, for fairness across streams and to notice disconnects."""
        if self.delay_s <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.record.aborted_event.wait(), self.delay_s)


def prepare(
    recorder: Recorder,
    encoding: HarmonyEncoding,
    settings: Settings,
    *,
    request_id: str,
    protocol: str,
    prompt_ids: Sequence[int],
    max_tokens: int | None,
    stop_token_ids: Sequence[int],
    ignore_eos: bool,
    params: dict[str, object],
    stop: Sequence[str] = (),
    skip_special: bool = True,
    stream: bool,
    check: Check,
) -> Generation:
    """Validate (``check``: the protocol's rules), script and record a request. Raises
    ``SimRequestError`` (the request is recorded all the same). ``max_tokens``: the budget the
    engine settled on (``None``: the room left in the context)."""
    prompt = list(prompt_ids)
    record = RequestRecord(request_id, protocol, prompt, params, stream)
    recorder.add(record)
    if not prompt:
        raise SimRequestError(400, "The prompt is empty: at least one token id is required.")
    constrained = check(prompt)
    try:
        script = plan(prompt, encoding)
    except Exception as exc:  # undecodable prompt
        raise SimRequestError(400, f"Invalid prompt: {exc}") from exc
    if script.directives.status is not None:
        status = script.directives.status
        raise StatusDirective(
            status,
            f"simulated engine error (status {status}) requested by [[sim:status]]",
            "ServiceUnavailableError" if status >= 500 else "BadRequestError",
        )
    room = settings.max_model_len - len(prompt)
    cap = min(max_tokens, room) if max_tokens is not None else room
    output = script.output_ids
    if constrained is not None and script.directives.raw is None:  # [[sim:raw]] is emitted as written
        output = generate(output, script.calls, encoding, constrained)
    outcome = limit(output, cap, stop_token_ids, () if ignore_eos else EOS_TOKEN_IDS)
    outcome = cut_at_stop_string(outcome, stop, encoding, skip_special)
    aborting = script.directives.abort_after
    if aborting is not None and 0 <= aborting < len(outcome.token_ids):
        outcome = Outcome(outcome.token_ids[:aborting], "abort", None)
    cached = recorder.prefix_cache.lookup_and_insert(prompt)
    return Generation(record, script, outcome, settings, recorder, cached)


def stop_strings(stop: str | Sequence[str] | None) -> list[str]:
    """A request's ``stop`` (one string or a list, in both protocols) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])


def cut_at_stop_string(
    outcome: Outcome, stop: Sequence[str], encoding: HarmonyEncoding, skip_special: bool = True
) -> Outcome:
    """Stop strings as vLLM and SGLang match them: in the output's text as it is detokenized
    (special tokens written out unless ``skip_special``: Chorus asks for them), token by token;
    generation ends with the token that completes the first match, that token included in the
    ids (the engines trim only the text), reported as the stop string matched. A stop token, EOS
    or max_tokens that came first has already cut ``outcome``: a match in what is left is
    earlier."""
    if not stop:
        return outcome
    longest = max(map(len, stop))
    text = IncrementalText(encoding, skip_special)
    seen = ""
    for i, token in enumerate(outcome.token_ids):
        new = text.feed([token])
        if not new:
            continue
        start = max(0, len(seen) - longest + 1)  # a match must end in the new text
        seen += new
        window = seen[start:]
        found = [(at, s) for s in stop if (at := window.find(s)) >= 0]
        if found:
            return Outcome(outcome.token_ids[: i + 1], "stop", None, stop_text=min(found)[1])
    return outcome


def decode_text(encoding: HarmonyEncoding, ids: Sequence[int], skip_special: bool) -> str:
    """Text for ids (lossy at split UTF-8 sequences, as a detokenizer would be mid-stream)."""
    if skip_special:
        ids = [t for t in ids if t < SPECIAL_TOKEN_START]
    return encoding.decode(list(ids)) if ids else ""


class IncrementalText:
    """Delta text per chunk, holding back ids that end inside a UTF-8 sequence."""

    def __init__(self, encoding: HarmonyEncoding, skip_special: bool) -> None:
        self.encoding, self.skip_special = encoding, skip_special
        self.pending: list[int] = []

    def feed(self, ids: Sequence[int], final: bool = False) -> str:
        self.pending.extend(ids)
        text = decode_text(self.encoding, self.pending, self.skip_special)
        if text.endswith("\ufffd") and not final:
            return ""
        self.pending = []
        return text
