"""What the fleet benchmark (bench_fleet.py) runs: the fleet's shape (simulated engines with
prefix caches) and its workload, the same for every routing mode: agent-like conversations
over shared instructions and a document of their own, built from seeded prose."""

from __future__ import annotations

import random
from dataclasses import dataclass

ENGINES = 4
BLOCK = 16
ENGINE_SETTINGS = {
    "CHORUS_SIM_KV_CACHE_TOKENS": "18000",
    "CHORUS_SIM_KV_BLOCK_SIZE": str(BLOCK),
    "CHORUS_SIM_PREFILL_US_PER_TOKEN": "40",
    "CHORUS_SIM_TOKEN_DELAY_MS": "0",
}


VOCABULARY = """
    the of and to in is that for it as with was on be by this are from at or an which have not
    has but were all their can more one its also other into new these than time some two only
    may such first most over used many any well when would each both between through system
    data model value point state case work part place year group number order process result
    level form rate report record field table policy market record service method design plan
    power energy water light sound heat force signal network engine cache block token request
    answer question document section chapter figure source river mountain forest city road
    bridge garden window market harbor island valley station library museum letter account
    budget contract survey sample measure pattern surface volume weight length width depth
    early late large small long short high low open close strong weak clear simple common
    general special local global public private direct final total average major minor
"""
WORDS = tuple(VOCABULARY.split())


@dataclass(frozen=True)
class Workload:
    conversations: int = 16
    turns: int = 5
    responses: int = 4  # of the conversations, through the Responses API
    concurrency: int = 8
    instruction_words: int = 1200
    document_words: int = 3000
    answer_tokens: int = 40
    seed: int = 20261128


QUICK = Workload(conversations=4, turns=2, responses=1, concurrency=2, instruction_words=200, document_words=500)


def prose(rng: random.Random, words: int) -> str:
    """``words`` words of seeded prose: sentences of 6-18 words, paragraphs of 5 sentences."""
    sentences, n = [], 0
    while n < words:
        k = min(rng.randint(6, 18), words - n)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5))


@dataclass(frozen=True)
class Conversation:
    index: int
    api: str  # chat | responses
    first_message: str  # the document and the first question
    questions: tuple[str, ...]  # the later turns'


def build(wl: Workload) -> tuple[str, list[Conversation]]:
    """The shared instructions and the conversations, the same for every mode."""
    rng = random.Random(wl.seed)
    instructions = "You are a careful analyst. Follow these instructions.\n\n" + prose(rng, wl.instruction_words)
    n, r = wl.conversations, wl.responses
    via_responses = {round((k + 1) * n / r) - 1 for k in range(r)} if r else set()
    conversations = []
    for i in range(n):
        doc = prose(random.Random(wl.seed * 1000 + i), wl.document_words)
        qs = [
            f"Question {t + 1}: what does the document say about {rng.choice(WORDS)} and {rng.choice(WORDS)}, "
            f"and how does it bear on {rng.choice(WORDS)}? Answer briefly. [[sim:tokens={wl.answer_tokens}]]"
            for t in range(wl.turns)
        ]
        first = f"Here is document {i}.\n\n{doc}\n\n{qs[0]}"
        conversations.append(Conversation(i, "responses" if i in via_responses else "chat", first, tuple(qs[1:])))
    return instructions, conversations
