"""The simulated model generating THROUGH a grammar, token by token, as under an engine's
xgrammar mask (SIMULATOR support code).

The script's tokens are taken while the grammar allows them (each token's text is fed to the
matcher; a stop token, ``<|return|>`` or ``<|call|>``, only where the grammar may end). When
the next scripted token is refused, the model deviates as a constrained model would:

- inside a message header (after ``<|start|>assistant`` or the output's start, before
  ``<|message|>``), it tries the other messages it could write there: a call to each tool the
  prompt declares (the script's choice first), from just after ``<|channel|>``, then from the
  header's start (also recipient first); the first the grammar allows whole is taken;
- otherwise (or when none is allowed) it writes the shortest text the grammar allows to a place
  where it may end, then stops: ``<|call|>`` if the message is addressed (``to=`` in its
  header), else ``<|return|>``. Where the matcher finds no such text from there, it backs up
  token by token to a place it finds one (an engine never needs to: its mask refuses earlier).

Where the grammar starts is the engine's business (``Constrained.gate``): at the first output
token, or (vLLM 0.10.2-0.26 for gpt-oss) after the token that completes
``<|channel|>final...<|message|>``, the tokens before being unconstrained."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from openai_harmony import HarmonyEncoding

from services.common.harmony import CALL, CHANNEL, END, MESSAGE, RETURN, START
from services.simengine.matcher import Grammar, State
from services.simengine.script import Call, encode_harmony

log = logging.getLogger("chorus.simengine")
STOP_IDS = (RETURN, CALL)
GATE_WINDOW = 20  # vLLM's reasoning_max_num_between_tokens: "<|channel|>final" .. "<|message|>"


@dataclass(frozen=True)
class Constrained:
    """A request's grammar and where the engine starts applying it: ``output`` (the first
    output token) or ``final`` (after the gpt-oss final header, vLLM's old reasoning gate)."""

    grammar: Grammar
    gate: Literal["output", "final"] = "output"


def generate(
    script_ids: Sequence[int], calls: Sequence[Call], encoding: HarmonyEncoding, constrained: Constrained
) -> list[int]:
    """The script as generated under the grammar."""
    return _Run(encoding, constrained, calls).run(script_ids)


class _Run:
    def __init__(self, encoding: HarmonyEncoding, constrained: Constrained, calls: Sequence[Call]) -> None:
        self.encoding, self.constrained, self.calls = encoding, constrained, calls
        self.out: list[int] = []
        self.state: State | None = constrained.grammar.start() if constrained.gate == "output" else None
        self.checkpoints: list[tuple[int, State]] = []  # (tokens before, state there), per token fed
        self.pending: list[int] = []  # tokens ending inside a UTF-8 sequence, not fed yet
        self.final_id: int = encoding.encode("final", disallowed_special=())[0]

    def run(self, script_ids: Sequence[int]) -> list[int]:
        for tok in script_ids:
            if self.state is None:  # the engine does not constrain yet
                self.out.append(tok)
                if self._gate_opens():
                    self.state = self.constrained.grammar.start()
                if tok in STOP_IDS:
                    break
                continue
            if tok in STOP_IDS:
                if self.state.can_end():
                    self.out.append(tok)
                else:
                    self._deviate()
                break
            after = self._feed(self.state, tok)
            if after is None:
                self._deviate()
                break
            self.checkpoints.append((len(self.out), self.state))
            self.out.append(tok)
            self.state = after
        return self.out

    def _feed(self, state: State, tok: int) -> State | None:
        text = self.encoding.decode([*self.pending, tok])
        if text.endswith("\ufffd"):
            self.pending.append(tok)
            return state
        self.pending = []
        return state.feed(text)

    def _gate_opens(self) -> bool:
        """vLLM's GptOssReasoningParser.is_reasoning_end (0.10.2-0.26): the current message
        (since the last ``<|end|>``) has ``<|channel|>final``, then ``<|message|>`` within 20
        tokens; the grammar applies from the next token."""
        out = self.out
        if self.constrained.gate != "final" or not out or out[-1] != MESSAGE:
            return False
        for j in range(len(out) - 2, -1, -1):
            if out[j] == END:
                return False
            if out[j : j + 2] == [CHANNEL, self.final_id]:
                return len(out) - 1 - (j + 2) < GATE_WINDOW
        return False

    def _deviate(self) -> None:
        if self._alternative():
            return
        assert self.state is not None
        state, text = self.state, self.state.completion()
        while text is None and self.checkpoints:
            at, state = self.checkpoints.pop()
            del self.out[at:]
            text = state.completion()
        if text is None:  # a grammar no text can satisfy from anywhere: stop as the script would
            log.warning("the simulated model found no output the grammar allows; it stops here")
        self.out += encode_harmony(self.encoding, text or "")
        self.out.append(CALL if _addressed(self.encoding.decode(self.out)) else RETURN)

    def _alternative(self) -> bool:
        """A call the grammar allows instead of the current message's header, if any."""
        start = self._message_start()
        if start is None or not self.calls:
            return False
        anchors = []
        if start < len(self.out) and self.out[start] == CHANNEL:
            anchors.append((start + 1, [_body(c) for c in self.calls]))
        anchors.append(
            (start, [f"<|channel|>{_body(c)}" for c in self.calls] + [_recipient_first(c) for c in self.calls])
        )
        for at, texts in anchors:
            state = self._state_at(at)
            if state is None:
                continue
            for text in texts:
                after = state.feed(text)
                if after is not None and after.can_end():
                    del self.out[at:]
                    self.out += [*encode_harmony(self.encoding, text), CALL]
                    return True
        return False

    def _message_start(self) -> int | None:
        """Where the current message's header starts, if the refusal is inside one."""
        out = self.out
        start = 0
        for i in range(len(out) - 1, -1, -1):
            if out[i] == MESSAGE:
                return None
            if out[i] == START:
                start = i + 2  # after <|start|>assistant
                break
        return start if start <= len(out) else None

    def _state_at(self, at: int) -> State | None:
        if at == len(self.out):
            return self.state
        return next((state for i, state in self.checkpoints if i == at), None)


def _body(call: Call) -> str:
    """The call from its channel name on (after ``<|channel|>``), up to its stop token."""
    return f"commentary to={call.recipient} <|constrain|>json<|message|>{call.arguments}"


def _recipient_first(call: Call) -> str:
    return f" to={call.recipient}<|channel|>commentary <|constrain|>json<|message|>{call.arguments}"


def _addressed(text: str) -> bool:
    """Whether the last message's header names a recipient (``to=``): it ends with a call."""
    message = text[max(text.rfind("<|start|>"), 0) :]
    header = message.split("<|message|>", 1)[0]
    return " to=" in header
