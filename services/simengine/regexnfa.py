"""A small regular-expression matcher over characters, fed one character at a time (SIMULATOR
support code for the structural-tag ``regex`` format and the engines' ``regex`` parameters).

A pattern matches the whole text (xgrammar's ``Grammar.from_regex``). Supported: literals and
escapes (``\\d \\w \\s``, their negations, ``\\n \\t \\r \\f \\v \\uXXXX \\xHH``, escaped
punctuation), ``.``, classes ``[...]`` (ranges, negation, escapes), groups ``(...)`` and
``(?:...)``, ``|``, the quantifiers ``* + ? {n} {n,} {n,m}`` (a lazy ``?`` after one changes
nothing here), and ``^``/``$`` at the ends. Backreferences and lookarounds are refused with
``UnsupportedRegex``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

_DIGIT = ((ord("0"), ord("9")),)
_WORD = ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("_"), ord("_")), (ord("a"), ord("z")))
_SPACE = tuple((ord(c), ord(c)) for c in " \t\n\r\f\v")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_CLASSES = {"d": (False, _DIGIT), "w": (False, _WORD), "s": (False, _SPACE)}
_PICKS = "a0 xA_-.,:;!?/\n"  # characters tried first when a completion must pick one


class UnsupportedRegex(ValueError):
    """A pattern the simulator cannot run (the engines may well accept it)."""


@dataclass(frozen=True)
class CharSet:
    negated: bool
    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, ch: str) -> bool:
        code = ord(ch)
        return any(lo <= code <= hi for lo, hi in self.ranges) != self.negated

    def pick(self) -> str:
        """A character of the set, a readable one if it can."""
        for ch in _PICKS:
            if ch in self:
                return ch
        return next(chr(c) for c in range(32, 0x110000) if chr(c) in self)


ANY_BUT_NEWLINE = CharSet(True, ((10, 10), (13, 13)))


@dataclass
class Nfa:
    """States 0..n-1; ``edges[s]``: (set, target); ``eps[s]``: targets; one accepting state."""

    edges: list[list[tuple[CharSet, int]]] = field(default_factory=list)
    eps: list[list[int]] = field(default_factory=list)
    start: int = 0
    accept: int = 0

    def new(self) -> int:
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def closure(self, states: frozenset[int] | set[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def initial(self) -> frozenset[int]:
        return self.closure({self.start})

    def step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        return self.closure({t for s in states for cs, t in self.edges[s] if ch in cs})

    def accepts(self, states: frozenset[int]) -> bool:
        return self.accept in states

    def shortest(self, states: frozenset[int]) -> str | None:
        """A shortest text leading from ``states`` to acceptance (BFS over state sets)."""
        queue: deque[tuple[frozenset[int], str]] = deque([(states, "")])
        seen = {states}
        while queue:
            current, text = queue.popleft()
            if self.accepts(current):
                return text
            for s in sorted(current):
                for cs, _ in self.edges[s]:
                    ch = cs.pick()
                    nxt = self.step(current, ch)
                    if nxt and nxt not in seen:
                        seen.add(nxt)
                        queue.append((nxt, text + ch))
        return None


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p, self.i, self.nfa = pattern, 0, Nfa()

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        ch = self.p[self.i]
        self.i += 1
        return ch

    def compile(self) -> Nfa:
        if self.peek() == "^":
            self.i += 1
        body = self.p
        if body.endswith("$") and not body.endswith("\\$"):
            self.p = body[:-1]
        start, end = self.alternation()
        if self.i != len(self.p):
            raise UnsupportedRegex(f"unbalanced parenthesis at {self.i} in {body!r}")
        self.nfa.start, self.nfa.accept = start, end
        return self.nfa

    def alternation(self) -> tuple[int, int]:
        branches = [self.concatenation()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.concatenation())
        if len(branches) == 1:
            return branches[0]
        start, end = self.nfa.new(), self.nfa.new()
        for s, e in branches:
            self.nfa.eps[start].append(s)
            self.nfa.eps[e].append(end)
        return start, end

    def concatenation(self) -> tuple[int, int]:
        start = end = self.nfa.new()
        while self.peek() not in (None, "|", ")"):
            s, e = self.quantified()
            self.nfa.eps[end].append(s)
            end = e
        return start, end

    def quantified(self) -> tuple[int, int]:
        mark = self.i
        piece: tuple[int, int] | None = self.atom()
        atom_text = self.p[mark : self.i]
        low, high = self.quantifier()
        if (low, high) == (1, 1) and piece is not None:
            return piece

        def copy() -> tuple[int, int]:
            nonlocal piece
            built, piece = (piece, None) if piece is not None else (self.reparse(atom_text), None)
            return built

        start = end = self.nfa.new()
        for _ in range(low):
            s, e = copy()
            self.nfa.eps[end].append(s)
            end = e
        if high is None:  # zero or more further copies, looping through a hub
            s, e = copy()
            hub = self.nfa.new()
            self.nfa.eps[end].append(hub)
            self.nfa.eps[hub].append(s)
            self.nfa.eps[e].append(hub)
            return start, hub
        final = self.nfa.new()
        self.nfa.eps[end].append(final)
        for _ in range(high - low):
            s, e = copy()
            self.nfa.eps[end].append(s)
            self.nfa.eps[e].append(final)
            end = e
        return start, final

    def reparse(self, atom_text: str) -> tuple[int, int]:
        sub = _Parser(atom_text)
        sub.nfa = self.nfa
        return sub.atom()

    def quantifier(self) -> tuple[int, int | None]:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            bounds: tuple[int, int | None] = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        elif ch == "{" and (close := self.p.find("}", self.i)) > 0 and _is_bounds(self.p[self.i + 1 : close]):
            lo_text, _, hi_text = self.p[self.i + 1 : close].partition(",")
            has_comma = "," in self.p[self.i + 1 : close]
            bounds = (int(lo_text), (int(hi_text) if hi_text else None) if has_comma else int(lo_text))
            self.i = close + 1
        else:
            return 1, 1
        if self.peek() == "?":  # lazy: the same language
            self.i += 1
        return bounds

    def atom(self) -> tuple[int, int]:
        ch = self.take()
        if ch == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise UnsupportedRegex("lookarounds and named groups are not supported")
            piece = self.alternation()
            if self.peek() != ")":
                raise UnsupportedRegex("unbalanced parenthesis")
            self.i += 1
            return piece
        if ch == "[":
            return self.edge(self.char_class())
        if ch == ".":
            return self.edge(ANY_BUT_NEWLINE)
        if ch == "\\":
            return self.edge(self.escape(in_class=False))
        if ch in "*+?":
            raise UnsupportedRegex(f"nothing to repeat at {self.i - 1}")
        return self.edge(CharSet(False, ((ord(ch), ord(ch)),)))

    def edge(self, cs: CharSet) -> tuple[int, int]:
        s, e = self.nfa.new(), self.nfa.new()
        self.nfa.edges[s].append((cs, e))
        return s, e

    def escape(self, *, in_class: bool) -> CharSet:
        ch = self.take()
        if ch.lower() in _CLASSES:
            _, ranges = _CLASSES[ch.lower()]
            return CharSet(ch.isupper(), ranges)
        if ch in "ux":
            width = 4 if ch == "u" else 2
            code = int(self.p[self.i : self.i + width], 16)
            self.i += width
            return CharSet(False, ((code, code),))
        if ch.isdigit() and ch != "0" and not in_class:
            raise UnsupportedRegex("backreferences are not supported")
        if ch in "bB" and not in_class:
            raise UnsupportedRegex("word boundaries are not supported")
        lit = ord(_ESCAPES.get(ch, ch))
        return CharSet(False, ((lit, lit),))

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.peek() is None:
                raise UnsupportedRegex("unterminated character class")
            ch = self.take()
            if ch == "]" and not first:
                return CharSet(negated, tuple(ranges))
            first = False
            if ch == "\\":
                cs = self.escape(in_class=True)
                if cs.negated:
                    raise UnsupportedRegex("negated escapes inside a class are not supported")
                ranges += cs.ranges
                continue
            lo = ord(ch)
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi_ch = self.take()
                if hi_ch == "\\":
                    hi_ch = self.take()
                    hi_ch = _ESCAPES.get(hi_ch, hi_ch)
                ranges.append((lo, ord(hi_ch)))
                continue
            ranges.append((lo, lo))


def _is_bounds(text: str) -> bool:
    lo, comma, hi = text.partition(",")
    return lo.isdigit() and (not comma or not hi or hi.isdigit())


def compile_regex(pattern: str) -> Nfa:
    """The pattern's automaton; ``UnsupportedRegex`` for what this matcher cannot run."""
    try:
        return _Parser(pattern).compile()
    except (IndexError, ValueError) as exc:
        if isinstance(exc, UnsupportedRegex):
            raise
        raise UnsupportedRegex(f"cannot read the pattern {pattern!r}: {exc}") from exc
