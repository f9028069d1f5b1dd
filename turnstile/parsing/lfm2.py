"""Liquid LFM2 tool calls: Python call syntax in a list.

``<|tool_call_start|>[get_weather(city='Paris', days=2), search(q="x")]<|tool_call_end|>``.
Each call is announced at ``name(`` and its keyword arguments are read with Python's own parser
(literals only; JSON's ``true``/``false``/``null`` are accepted too) when its ``)`` arrives.
"""

from __future__ import annotations

import ast
import json

from .base import Region, RegionParser, find_first, literal_node, malformed, parse_expression
from .markers import split_safe
from .types import STATUS_MALFORMED_TOOL_CALL, ArgsDelta, CallEnd, CallStart, Event, Issue

OPEN = "<|tool_call_start|>"
CLOSE = "<|tool_call_end|>"


class PyScanner:
    """Finds the end of a bracketed Python expression, skipping strings (chunking-independent)."""

    def __init__(self) -> None:
        self.depth = 0
        self._quote = ""
        self._escaped = False

    def feed(self, text: str) -> int | None:
        """Consume ``text``; index just past the bracket closing depth 1, or None."""
        for i, ch in enumerate(text):
            if self._quote:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == self._quote:
                    self._quote = ""
            elif ch in "'\"":
                self._quote = ch
            elif ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


def python_call(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON) for ``name(k=v, …)`` with literal values, or None."""
    node = parse_expression(text)
    if not isinstance(node, ast.Call) or node.args:
        return None
    parts = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    name = ".".join([func.id, *reversed(parts)])
    try:
        args = {kw.arg: literal_node(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    if len(args) != len(node.keywords):
        return None
    return name, json.dumps(args, ensure_ascii=False)


_START, _BETWEEN, _HEAD, _ARGS, _AFTER = "start", "between", "head", "args", "after"


class _CallList(Region):
    def __init__(self, opener: str) -> None:
        self._opener = opener
        self._state = _START
        self._call = ""  # text of the current call
        self._scanner = PyScanner()
        self._calls = 0

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        i = 0
        if self._state not in (_HEAD, _ARGS):
            while i < len(buf) and buf[i].isspace():
                i += 1
        rest = buf[i:]
        if self._state in (_START, _BETWEEN, _AFTER):
            if rest.startswith(CLOSE):
                if self._state != _AFTER:
                    out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
                return i + len(CLOSE), True
            if not rest or (CLOSE.startswith(rest) and not final):
                if final:
                    if self._state == _START:
                        malformed(out, self._opener + buf)
                    elif self._state == _BETWEEN:
                        out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
                    return len(buf), True
                return 0, False
            ch = rest[0]
            if self._state == _START and ch == "[":
                self._state = _BETWEEN
                return i + 1, False
            if self._state == _BETWEEN and ch == "," and self._calls:
                return i + 1, False
            if self._state == _BETWEEN and ch == "]":
                self._state = _AFTER
                return i + 1, False
            if self._state == _BETWEEN and (ch.isalpha() or ch == "_"):
                self._state, self._call = _HEAD, ""
                return i, False
            # junk: keep it as content up to the close marker
            if self._state == _START:
                malformed(out, self._opener)
                return 0, True
            at, _ = find_first(rest, (CLOSE,))
            if at < 0 and not final:
                return 0, False
            end = len(rest) if at < 0 else at + len(CLOSE)
            malformed(out, rest[: at if at >= 0 else len(rest)])
            return i + end, True
        stop, _ = find_first(buf, (CLOSE,))
        avail = buf[:stop] if stop >= 0 else (buf if final else split_safe(buf, (CLOSE,))[0])
        if self._state == _HEAD:
            paren = avail.find("(")
            if paren >= 0:
                name = (self._call + avail[:paren]).strip()
                if not name.replace(".", "_").isidentifier():
                    malformed(out, self._call + avail[:paren])
                    self._state = _AFTER
                    return paren, False
                out.append(CallStart(name))
                self._call += avail[: paren + 1]
                self._scanner = PyScanner()
                self._scanner.feed("(")
                self._state = _ARGS
                return paren + 1, False
            self._call += avail
            if stop >= 0 or final:
                malformed(out, self._call)
                self._state = _AFTER
            return len(avail), False
        closed = self._scanner.feed(avail)
        piece = avail if closed is None else avail[:closed]
        self._call += piece
        if closed is not None:
            parsed = python_call(self._call)
            out.append(ArgsDelta(parsed[1] if parsed else "{}"))
            if parsed is None:
                out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            out.append(CallEnd())
            self._calls += 1
            self._state = _BETWEEN
            return closed, False
        if stop >= 0 or final:
            out += [ArgsDelta("{}"), Issue(STATUS_MALFORMED_TOOL_CALL), CallEnd()]
            self._state = _AFTER
        return len(piece), False


class Lfm2ToolParser(RegionParser):
    """``<|tool_call_start|>[f(a=1), …]<|tool_call_end|>`` lists."""

    openers = (OPEN,)
    markers = (OPEN, CLOSE)

    def open_region(self, marker: str) -> Region:
        return _CallList(marker)
