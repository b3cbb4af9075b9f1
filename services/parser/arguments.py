"""A tool call's arguments as JSON text: streamed while they can still be valid JSON, repaired
at the end when that is unambiguous, and what clients were sent always a prefix of the result.

The rule (``ArgumentStream``): a piece of the arguments goes out as soon as the text so far is a
strict JSON prefix (some valid JSON document starts with it), except what a repair could still
remove: trailing whitespace and a comma that no value has followed yet. From the first character
at which the text stops being a JSON prefix, the rest is held until the message ends (valid
arguments, the common case, stream as they come). ``repair_json`` edits only from that character on (it converts single-quoted strings, escapes raw control characters in
strings, drops trailing commas, closes what is still open), so the repaired text starts with
everything already sent; if it ever did not, the text is kept verbatim. Either way the deltas
joined are the final ``arguments``, in both APIs and in every batching. Nothing here raises on
model output."""

from __future__ import annotations

import enum
import json
import re

_WS = re.compile(r"[ \t\n\r]*")
# a run of string content: characters a JSON string holds as they are, and whole escapes
_STR_BODY = re.compile(r'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
_NUM_CHARS = re.compile(r"[0-9eE+\-.]*")
_NUM = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUM_PREFIX = re.compile(r"-?(?:(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d*)?|(?:0|[1-9]\d*)\.)?")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_CLOSER = {"{": "}", "[": "]"}


class _Expect(enum.Enum):
    """What the scanner expects next (outside strings)."""

    VALUE = "a value"
    ARR0 = "a value or ] (just after [)"
    KEY = "a key"
    OBJ0 = "a key or } (just after {)"
    COLON = "a colon"
    AFTER = ", or a closer (after a value)"
    END = "nothing (the top-level value is complete)"


# module names for the members: the per-character loop compares against globals
_VALUE, _ARR0, _KEY, _OBJ0, _COLON, _AFTER, _END = _Expect


def _loads_ok(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class ArgumentStream:
    """One call's arguments, fed as they arrive: ``feed`` returns what may be sent now,
    ``finish`` the final arguments and the name of the repair, if any."""

    __slots__ = (
        "_comma",
        "_esc",
        "_held",
        "_key",
        "_parts",
        "_stack",
        "_started",
        "_state",
        "_str",
        "_tok",
        "ok",
        "sent",
    )

    def __init__(self) -> None:
        self.ok = True  # the text so far is a strict JSON prefix
        self.sent = 0  # how many of its characters feed handed out
        self._parts: list[str] = []  # the text (without leading whitespace)
        self._held = ""  # valid text not sent yet: trailing whitespace, a trailing comma
        self._started = False  # leading whitespace is dropped
        self._stack: list[str] = []
        self._state = _VALUE
        self._str = False  # inside a string
        self._key = False  # ... that is an object key
        self._esc = 0  # inside a string: -1 after a backslash, 1..4 hex digits of \u still to come
        self._tok = ""  # a number or literal that the last piece ended inside
        self._comma = False  # the last structural character is a comma

    def feed(self, text: str) -> str:
        if not self.ok:
            self._parts.append(text)
            return ""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        self._parts.append(text)
        if self._str and not self._esc and _STR_BODY.fullmatch(text) is not None:
            # the common case: more characters of a string
            if not text[-1].isspace():
                if self._held:
                    text, self._held = self._held + text, ""
                self.sent += len(text)
                return text
            valid = text
        else:
            k = self._scan(text)
            valid = text
            if k < len(text):
                self.ok = False
                valid = text[:k]
        pending = self._held + valid if self._held else valid
        end = len(pending.rstrip())
        if self._comma and not self._str and end and pending[end - 1] == ",":
            end = len(pending[: end - 1].rstrip())  # hold the comma: a repair may drop it
        if end == len(pending):
            self._held = ""
        else:
            self._held = pending[end:]
            pending = pending[:end]
        self.sent += len(pending)
        return pending

    def finish(self, incomplete: bool = False) -> tuple[str, str | None]:
        """The final arguments (what was sent plus what is returned beyond it) and the kind of
        repair: ``arguments_repaired``, ``arguments_not_json`` or None."""
        text = "".join(self._parts)
        sent = text[: self.sent]
        if incomplete:  # cut off: as written
            return text, None
        text = text.rstrip()
        if self.ok and self._state == _END and not self._str:
            return text, None  # valid JSON, checked as it streamed
        fixed, ok = repair_json(text)
        if ok and fixed.startswith(sent):
            return fixed, ("arguments_repaired" if fixed != text else None)
        return text, "arguments_not_json"

    def _after(self) -> _Expect:
        return _AFTER if self._stack else _END

    def _scan(self, text: str) -> int:
        """Consume ``text``; the number of its leading characters that keep the whole a strict
        JSON prefix (less than ``len(text)`` means invalid from there on)."""
        i, n = 0, len(text)
        if self._tok:  # finish the number or literal the last piece ended inside
            tok = self._tok
            word = _LITERALS.get(tok[0])
            if word is not None:
                need = word[len(tok) :]
                if not (text.startswith(need) if n >= len(need) else need.startswith(text)):
                    return 0
                if n < len(need):
                    self._tok = tok + text
                    return n
                i = len(need)
            else:
                i = _NUM_CHARS.match(text).end()  # type: ignore[union-attr]
                tok += text[:i]
                if i == n:
                    if _NUM_PREFIX.fullmatch(tok) is None:
                        return 0
                    self._tok = tok
                    return n
                if _NUM.fullmatch(tok) is None:
                    return 0
            self._tok = ""
            self._state = self._after()
        state = self._state
        stack = self._stack
        while i < n:
            if self._str:
                esc = self._esc
                if esc:
                    c = text[i]
                    if esc < 0:
                        if c not in _ESCAPES:
                            return i
                        self._esc = 4 if c == "u" else 0
                    elif c in _HEX:
                        self._esc = esc - 1
                    else:
                        return i
                    i += 1
                    continue
                i = _STR_BODY.match(text, i).end()  # type: ignore[union-attr]
                if i == n:
                    break
                c = text[i]
                if c == '"':
                    self._str = False
                    state = _COLON if self._key else (_AFTER if stack else _END)
                elif c == "\\":
                    self._esc = -1
                else:
                    return i  # a raw control character
                i += 1
                continue
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if i == n:
                break
            c = text[i]
            if state == _AFTER:
                if c == ",":
                    state = _VALUE if stack[-1] == "[" else _KEY
                    self._comma = True
                elif c == _CLOSER[stack[-1]]:
                    stack.pop()
                    state = _AFTER if stack else _END
                else:
                    return i
                i += 1
            elif state == _COLON:
                if c != ":":
                    return i
                state = _VALUE
                i += 1
            elif state in (_KEY, _OBJ0):
                if c == '"':
                    self._str, self._key, self._comma = True, True, False
                elif c == "}" and state == _OBJ0:
                    stack.pop()
                    state = _AFTER if stack else _END
                else:
                    return i
                i += 1
            elif state == _END:
                return i
            else:  # a value (or, right after "[", the "]")
                if c == '"':
                    self._str, self._key = True, False
                    i += 1
                elif c in "{[":
                    stack.append(c)
                    state = _OBJ0 if c == "{" else _ARR0
                    i += 1
                elif c == "]" and state == _ARR0:
                    stack.pop()
                    state = _AFTER if stack else _END
                    i += 1
                elif c in _LITERALS:
                    word = _LITERALS[c]
                    piece = text[i : i + len(word)]
                    if piece == word:
                        state = _AFTER if stack else _END
                        i += len(word)
                    elif i + len(piece) == n and word.startswith(piece):
                        self._tok = piece
                        i = n
                    else:
                        return i
                elif c == "-" or "0" <= c <= "9":
                    j = _NUM_CHARS.match(text, i).end()  # type: ignore[union-attr]
                    tok = text[i:j]
                    if j == n and _NUM_PREFIX.fullmatch(tok) is not None:
                        self._tok = tok
                    elif _NUM.fullmatch(tok) is None:
                        return i
                    else:
                        state = _AFTER if stack else _END
                    i = j
                else:
                    return i
                self._comma = False
        self._state = state
        return n


# --- repair -----------------------------------------------------------------------------

_DQ_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_SQ_RUN = re.compile(r"[^'\"\\\x00-\x1f]+")
_LITERAL = re.compile(r"true|false|null")
_CONTROL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _string(text: str, i: int) -> tuple[int, str | None]:
    """The string starting at ``text[i]`` (a ``"`` or ``'``) as JSON text, and where it ends;
    None when it never ends."""
    quote, run = text[i], (_DQ_RUN if text[i] == '"' else _SQ_RUN)
    parts, j, n = ['"'], i + 1, len(text)
    while j < n:
        m = run.match(text, j)
        if m is not None:
            parts.append(m.group())
            j = m.end()
            if j == n:
                break
        c = text[j]
        if c == quote:
            parts.append('"')
            return j + 1, "".join(parts)
        if c == "\\":
            if j + 1 == n:
                break
            e = text[j + 1]
            parts.append("'" if e == "'" else "\\" + e)  # \' is no JSON escape
            j += 2
            continue
        parts.append('\\"' if c == '"' else _CONTROL_ESCAPES.get(c) or f"\\u{ord(c):04x}")  # " in '...', a control
        j += 1
    return n, None


def _tolerant(text: str) -> str | None:
    """``text`` (stripped, not valid JSON) as JSON by the unambiguous edits, or None."""
    out: list[str] = []
    stack: list[str] = []
    state, comma = _VALUE, -1  # comma: where in ``out`` a comma waits for its next value
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\n\r":
            out.append(c)
            i += 1
            continue
        if state == _END:
            return None
        if state == _COLON:
            if c != ":":
                return None
            out.append(c)
            state = _VALUE
            i += 1
            continue
        if state == _AFTER:
            if c == ",":
                comma = len(out)
                state = _VALUE if stack[-1] == "[" else _KEY
            elif c == _CLOSER[stack[-1]]:
                stack.pop()
                state = _AFTER if stack else _END
            else:
                return None
            out.append(c)
            i += 1
            continue
        if stack and c == _CLOSER[stack[-1]] and (state in (_ARR0, _OBJ0) or comma >= 0):
            if comma >= 0:
                out[comma] = ""  # a trailing comma
            stack.pop()
            out.append(c)
            state, comma = (_AFTER if stack else _END), -1
            i += 1
            continue
        key = state in (_KEY, _OBJ0)
        if c in "\"'":
            i, piece = _string(text, i)
            if piece is None:
                return None
            out.append(piece)
            state = _COLON if key else (_AFTER if stack else _END)
        elif key:
            return None
        elif c in "{[":
            stack.append(c)
            out.append(c)
            state = _OBJ0 if c == "{" else _ARR0
            i += 1
        else:
            m = _NUM.match(text, i) or _LITERAL.match(text, i)
            if m is None:
                return None
            out.append(m.group())
            state = _AFTER if stack else _END
            i = m.end()
        comma = -1
    if state == _COLON or state in (_KEY, _VALUE) and comma < 0:
        return None  # a key without its value, or nothing at all
    if comma >= 0:
        out[comma] = ""
    out += [_CLOSER[b] for b in reversed(stack)]
    return "".join(out)


def repair_json(text: str) -> tuple[str, bool]:
    """Arguments as JSON text: stripped when valid; repaired when unambiguous (single-quoted
    strings, raw control characters in strings, trailing commas, missing closing brackets), by
    editing the text only where it stops being valid; else returned verbatim (False)."""
    candidate = text.strip() or "{}"
    if _loads_ok(candidate):
        return candidate, True
    fixed = _tolerant(candidate)
    if fixed is not None and _loads_ok(fixed):
        return fixed, True
    return text, False
