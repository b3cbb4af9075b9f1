"""The matcher's machinery (SIMULATOR support code for ``matcher``): compiled formats as nodes,
and threads through them. A thread is the leaf being read (a literal, free text, a JSON value, a
regex, a dispatch's free text) and its continuation: frames of the sequences, repetitions and
dispatches it is inside. Reading a character moves every thread; a thread whose leaf is complete
also goes on with its continuation, and one with no continuation left is ``ACCEPT``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.simengine import jsonscan
from services.simengine.regexnfa import Nfa


@dataclass(eq=False)
class Node:
    """A compiled format (compared and hashed by identity)."""


@dataclass(eq=False)
class Lit(Node):
    text: str


@dataclass(eq=False)
class Text(Node):
    excludes: tuple[str, ...] = ()
    max_chars: int | None = None

    @property
    def keep(self) -> int:
        return max((len(e) for e in self.excludes), default=1) - 1


@dataclass(eq=False)
class Json(Node):
    schema: jsonscan.JsonSchema


@dataclass(eq=False)
class Rx(Node):
    nfa: Nfa


@dataclass(eq=False)
class Seq(Node):
    items: tuple[Node, ...]


@dataclass(eq=False)
class Alt(Node):
    options: tuple[Node, ...]


@dataclass(eq=False)
class Rep(Node):
    item: Node
    low: int
    high: int | None


@dataclass(eq=False)
class Dispatch(Node):
    """Free text; a trigger written goes on as its group; ``loop``: free text again after."""

    triggers: tuple[str, ...]
    groups: tuple[Node, ...]
    loop: bool
    excludes: tuple[str, ...] = ()

    @property
    def keep(self) -> int:
        return max(len(s) for s in (*self.triggers, *self.excludes, "x")) - 1


Cont = tuple[tuple[Any, ...], "Cont"] | None
Thread = tuple[tuple[Any, ...], Cont]
ACCEPT: Thread = (("accept",), None)


class Closure:
    """The threads reached from some starting points without reading a character."""

    def __init__(self) -> None:
        self.out: dict[Thread, None] = {}
        self.seen: set[Any] = set()

    def add(self, leaf: tuple[Any, ...], cont: Cont) -> None:
        self.out[(leaf, cont)] = None

    def expand(self, node: Node, cont: Cont) -> None:
        if isinstance(node, Lit):
            self.add(("lit", node, 0), cont) if node.text else self.advance(cont)
        elif isinstance(node, Text):
            self.add(("text", node, "", 0), cont)
            self.advance(cont)
        elif isinstance(node, Json):
            self.add(("json", node, node.schema.start()), cont)
        elif isinstance(node, Rx):
            states = node.nfa.initial()
            self.add(("rx", node, states), cont)
            if node.nfa.accepts(states):
                self.advance(cont)
        elif isinstance(node, Seq):
            self.expand(node.items[0], (("seq", node, 1), cont)) if node.items else self.advance(cont)
        elif isinstance(node, Alt):
            for option in node.options:
                self.expand(option, cont)
        elif isinstance(node, Rep):
            self.repeat(node, 0, cont)
        elif isinstance(node, Dispatch):
            self.add(("dtext", node, ""), cont)
            self.advance(cont)

    def repeat(self, node: Rep, count: int, cont: Cont) -> None:
        key = ("rep", node, count, cont)
        if key in self.seen:  # a content that can be empty, repeated: once is enough
            return
        self.seen.add(key)
        if count >= node.low:
            self.advance(cont)
        if node.high is None or count < node.high:
            after = min(count + 1, node.low) if node.high is None else count + 1
            self.expand(node.item, (("rep", node, after), cont))

    def advance(self, cont: Cont) -> None:
        """The node before ``cont`` is complete: go on with what follows it."""
        if cont is None:
            self.out[ACCEPT] = None
            return
        frame, parent = cont
        if frame[0] == "seq":
            seq, i = frame[1], frame[2]
            if i == len(seq.items):
                self.advance(parent)
            else:
                self.expand(seq.items[i], (("seq", seq, i + 1), parent))
        elif frame[0] == "rep":
            self.repeat(frame[1], frame[2], parent)
        else:  # "disp": a dispatched group is complete
            if frame[1].loop:
                self.add(("dtext", frame[1], ""), parent)
            self.advance(parent)


def step(threads: dict[Thread, None], ch: str) -> dict[Thread, None]:
    c = Closure()
    for leaf, cont in threads:
        kind = leaf[0]
        if kind == "lit":
            node, pos = leaf[1], leaf[2]
            if node.text[pos] == ch:
                c.advance(cont) if pos + 1 == len(node.text) else c.add(("lit", node, pos + 1), cont)
        elif kind == "text":
            node, tail = leaf[1], leaf[2] + ch
            if any(tail.endswith(e) for e in node.excludes if e):
                continue
            if node.max_chars is not None and leaf[3] + 1 > node.max_chars:
                continue
            c.add(("text", node, tail[-node.keep :] if node.keep else "", leaf[3] + 1), cont)
            c.advance(cont)
        elif kind == "json":
            scan = jsonscan.feed(leaf[2], ch)
            if scan is None:
                continue
            if scan.mode != "D":
                c.add(("json", leaf[1], scan), cont)
            if jsonscan.done(scan):
                c.advance(cont)
        elif kind == "rx":
            states = leaf[1].nfa.step(leaf[2], ch)
            if states:
                c.add(("rx", leaf[1], states), cont)
                if leaf[1].nfa.accepts(states):
                    c.advance(cont)
        elif kind == "dtext":
            node, tail = leaf[1], leaf[2] + ch
            if any(tail.endswith(e) for e in node.excludes):
                continue
            fired = [i for i, trigger in enumerate(node.triggers) if tail.endswith(trigger)]
            for i in fired:  # a trigger written: its group must follow
                c.expand(node.groups[i], (("disp", node), cont))
            if not fired:
                c.add(("dtext", node, tail[-node.keep :] if node.keep else ""), cont)
                c.advance(cont)
    return c.out
