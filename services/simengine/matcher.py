"""An incremental matcher for xgrammar structural tags, over decoded text (SIMULATOR support
code): the simulated model generates through it as an engine's grammar would let it.

``compile_format(fmt)`` (the ``format`` of ``{"type": "structural_tag", ...}``, already checked
by ``grammar.check_structural_tag``) gives a ``Grammar``; ``Grammar.start()`` a ``State``;
``State.feed(text)`` the state after the text, or None where the grammar refuses it;
``can_end()`` whether a stop token is allowed there; ``completion()`` a shortest text that
leads to such a place. Special tokens are matched as their text (``<|channel|>``, ...).

It follows xgrammar 0.2.8 (cpp/structural_tag.cc ``StructuralTagGrammarConverter``): a
``tag`` is its begin, content and one of its ends; an ``any_text`` never contains the end
strings of the nearest tag around it nor its ``excludes``, and may stop anywhere; a
``triggered_tags`` is free text in which a trigger, once written, must go on as one of its tags
(``begin`` minus the trigger, content, end), then free text again, or nothing more with
``stop_after_first``; with ``at_least_one`` the output starts with a whole tag; the free text
never contains ``excludes`` nor the enclosing tag's ends. ``dispatch`` is the same with
formats for tags; ``optional``/``plus``/``star``/``repeat`` repeat their content. Not run by
the simulator (``GrammarUnsupported``): ``grammar`` (EBNF), the token formats, JSON in an XML
``style`` and JSON ``excludes``/``any_order``/``max_whitespace_cnt``, ``max_tokens`` budgets.

The matcher is nondeterministic: a state is the set of live threads, each a leaf being read
and the continuation after it (frames of sequences, repetitions, dispatches)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.simengine import jsonscan
from services.simengine.grammar import legacy_format
from services.simengine.jsoncomplete import completion as json_completion
from services.simengine.regexnfa import UnsupportedRegex, compile_regex
from services.simengine.tagcheck import format_kind
from services.simengine.threads import (
    ACCEPT,
    Alt,
    Closure,
    Cont,
    Dispatch,
    Json,
    Lit,
    Node,
    Rep,
    Rx,
    Seq,
    Text,
    Thread,
    step,
)


class GrammarUnsupported(ValueError):
    """A grammar the engines take that the simulator cannot run."""


@dataclass(frozen=True, eq=False)
class State:
    grammar: Grammar
    threads: dict[Thread, None]

    def feed(self, text: str) -> State | None:
        threads = self.threads
        for ch in text:
            threads = step(threads, ch)
            if not threads:
                return None
        return State(self.grammar, threads)

    def can_end(self) -> bool:
        return ACCEPT in self.threads

    def completion(self) -> str | None:
        """A shortest text after which the grammar may end (None if it finds none)."""
        candidates = {self.grammar.rest(leaf, cont) for leaf, cont in self.threads}
        for text in sorted((t for t in candidates if t is not None), key=len):
            after = self.feed(text)
            if after is not None and after.can_end():
                return text
        return None


@dataclass(eq=False)
class Grammar:
    root: Node
    _shortest: dict[int, str | None] = field(default_factory=dict)

    def start(self) -> State:
        c = Closure()
        c.expand(self.root, None)
        return State(self, c.out)

    def shortest(self, node: Node) -> str | None:
        """A shortest text of ``node`` alone (None: none found)."""
        if id(node) not in self._shortest:
            self._shortest[id(node)] = self._compute(node)
        return self._shortest[id(node)]

    def _compute(self, node: Node) -> str | None:
        if isinstance(node, Lit):
            return node.text
        if isinstance(node, Text | Dispatch):
            return ""
        if isinstance(node, Json):
            return json_completion(node.schema.start())
        if isinstance(node, Rx):
            return node.nfa.shortest(node.nfa.initial())
        if isinstance(node, Rep):
            item = self.shortest(node.item) if node.low else ""
            return None if item is None else item * node.low
        parts = [self.shortest(n) for n in (node.items if isinstance(node, Seq) else ())]
        if isinstance(node, Seq):
            return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
        found = [t for t in map(self.shortest, node.options if isinstance(node, Alt) else ()) if t is not None]
        return min(found, key=len) if found else None

    def rest(self, leaf: tuple[Any, ...], cont: Cont) -> str | None:
        """A short text completing a thread: its leaf, then what follows."""
        kind = leaf[0]
        if kind == "lit":
            text: str | None = leaf[1].text[leaf[2] :]
        elif kind == "json":
            text = json_completion(leaf[2])
        elif kind == "rx":
            text = leaf[1].nfa.shortest(leaf[2])
        else:  # accept, free text
            text = ""
        while text is not None and cont is not None:
            frame, cont = cont
            if frame[0] == "seq":
                parts = [self.shortest(n) for n in frame[1].items[frame[2] :]]
                text = None if any(p is None for p in parts) else text + "".join(p or "" for p in parts)
            elif frame[0] == "rep" and frame[2] < frame[1].low:
                item = self.shortest(frame[1].item)
                text = None if item is None else text + item * (frame[1].low - frame[2])
        return text


def compile_tag(tag: dict[str, Any]) -> Grammar:
    """A checked structural tag (the new form or the legacy one) as a grammar."""
    return compile_format(legacy_format(tag) if "structures" in tag else tag["format"])


def compile_format(fmt: dict[str, Any]) -> Grammar:
    return Grammar(_compile(fmt, ()))


def compile_json(schema: Any) -> Grammar:
    """A JSON grammar (vLLM's ``json``/``json_object``, SGLang's ``json_schema``)."""
    return Grammar(Json(jsonscan.JsonSchema(schema)))


def compile_pattern(pattern: str) -> Grammar:
    try:
        return Grammar(Rx(compile_regex(pattern)))
    except UnsupportedRegex as exc:
        raise GrammarUnsupported(f"regex {pattern!r}: {exc}") from exc


def compile_choice(choices: list[str]) -> Grammar:
    return Grammar(Alt(tuple(Lit(c) for c in choices)))


def _tag_parts(fmt: dict[str, Any]) -> tuple[str, Node, Node]:
    """A tag's begin, content (its any_text stops at this tag's ends) and ends."""
    begin, end = fmt["begin"], fmt["end"]
    if not isinstance(begin, str) or isinstance(end, dict):
        raise GrammarUnsupported("token formats in a tag's begin or end")
    own = tuple(end) if isinstance(end, list) else (end,)
    return begin, _compile(fmt["content"], own), Alt(tuple(Lit(e) for e in own))


def _tag(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    begin, content, closing = _tag_parts(fmt)
    return Seq((Lit(begin), content, closing))


def _compile(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    """``ends``: the end strings of the nearest tag around ``fmt`` (xgrammar's detected ends)."""
    kind = format_kind(fmt)
    handler = _HANDLERS.get(kind)
    if handler is None:
        raise GrammarUnsupported(f"the {kind!r} format")
    return handler(fmt, ends)


def _json(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    if fmt.get("style", "json") != "json" or fmt.get("excludes") or fmt.get("any_order"):
        raise GrammarUnsupported("json_schema with an XML style, excludes or any_order")
    if fmt.get("max_whitespace_cnt") is not None:
        raise GrammarUnsupported("json_schema with max_whitespace_cnt")
    return Json(jsonscan.JsonSchema(fmt["json_schema"]))


def _any_text(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    if fmt.get("max_tokens") is not None:
        raise GrammarUnsupported("any_text with max_tokens")
    excludes = tuple(e for e in (*fmt.get("excludes", ()), *ends) if e)
    return Text(excludes, fmt.get("max_chars"))


def _triggered(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    triggers = tuple(fmt["triggers"])
    parts = [_tag_parts(t) for t in fmt["tags"]]
    whole = Alt(tuple(Seq((Lit(begin), content, closing)) for begin, content, closing in parts))
    if fmt.get("at_least_one") and fmt.get("stop_after_first"):
        return whole
    groups = tuple(Alt(tuple(Seq((Lit(b[len(t) :]), c, e)) for b, c, e in parts if b.startswith(t))) for t in triggers)
    excludes = tuple(e for e in (*fmt.get("excludes", ()), *ends) if e)
    free = Dispatch(triggers, groups, not fmt.get("stop_after_first"), excludes)
    return Seq((whole, free)) if fmt.get("at_least_one") else free


def _separated(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    tags: Node = Alt(tuple(_tag(t, ends) for t in fmt["tags"]))
    if not fmt.get("stop_after_first"):
        tags = Seq((tags, Rep(Seq((Lit(fmt["separator"]), tags)), 0, None)))
    return tags if fmt.get("at_least_one") else Alt((tags, Lit("")))


def _repeat(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    item = _compile(fmt["content"], ends)
    kind = format_kind(fmt)
    if kind == "repeat":
        high = int(fmt["max"])
        return Rep(item, int(fmt["min"]), None if high == -1 or high > 2**31 - 1 else high)
    return Rep(item, 1 if kind == "plus" else 0, 1 if kind == "optional" else None)


def _dispatch(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    rules = fmt["rules"]
    groups = tuple(_compile(r[1], ends) for r in rules)
    excludes = tuple(fmt.get("excludes", ()))
    return Dispatch(tuple(r[0] for r in rules), groups, bool(fmt.get("loop", True)), excludes)


def _regex(fmt: dict[str, Any], ends: tuple[str, ...]) -> Node:
    return compile_pattern(fmt["pattern"]).root


_HANDLERS: dict[str, Callable[[dict[str, Any], tuple[str, ...]], Node]] = {
    "const_string": lambda fmt, ends: Lit(fmt["value"]),
    "json_schema": _json,
    "any_text": _any_text,
    "regex": _regex,
    "sequence": lambda fmt, ends: Seq(tuple(_compile(e, ends) for e in fmt["elements"])),
    "or": lambda fmt, ends: Alt(tuple(_compile(e, ends) for e in fmt["elements"])),
    "tag": _tag,
    "triggered_tags": _triggered,
    "tags_with_separator": _separated,
    "optional": _repeat,
    "plus": _repeat,
    "star": _repeat,
    "repeat": _repeat,
    "dispatch": _dispatch,
}
