"""Gemma 4 tool calls: ``<|tool_call>call:NAME{key:VALUE,…}<tool_call|>``.

Arguments use Gemma's own notation, not JSON: bare keys, strings between ``<|"|>`` markers,
``true``/``false``, Python-style numbers and ``None``, nested ``{}``/``[]``. The call is announced
at its name and its arguments converted when the object closes. Reasoning is
``<|channel>thought\\n…<channel|>`` (see ``families``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import Region, RegionParser, malformed
from .types import STATUS_MALFORMED_TOOL_CALL, ArgsDelta, CallEnd, CallStart, Event, Issue

OPEN = "<|tool_call>"
CLOSE = "<tool_call|>"
QUOTE = '<|"|>'
_NAME = re.compile(r"\s*call:(?P<name>[^\s{}<>]+)\s*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class GemmaSyntaxError(ValueError):
    """The arguments are not valid Gemma notation."""


class _Reader:
    """Recursive-descent reader of Gemma argument notation."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def value(self) -> Any:
        self.ws()
        text = self.text
        if text.startswith(QUOTE, self.i):
            end = text.find(QUOTE, self.i + len(QUOTE))
            if end < 0:
                raise GemmaSyntaxError("unterminated string")
            out = text[self.i + len(QUOTE) : end]
            self.i = end + len(QUOTE)
            return out
        if text.startswith("{", self.i):
            return self.mapping()
        if text.startswith("[", self.i):
            self.i += 1
            items: list[Any] = []
            self.ws()
            if text.startswith("]", self.i):
                self.i += 1
                return items
            while True:
                items.append(self.value())
                self.ws()
                if text.startswith(",", self.i):
                    self.i += 1
                elif text.startswith("]", self.i):
                    self.i += 1
                    return items
                else:
                    raise GemmaSyntaxError("bad list")
        for word, val in (("true", True), ("false", False), ("None", None), ("null", None)):
            if text.startswith(word, self.i):
                self.i += len(word)
                return val
        m = _NUMBER.match(text, self.i)
        if m:
            self.i = m.end()
            return json.loads(m.group())
        raise GemmaSyntaxError(f"unexpected {text[self.i : self.i + 10]!r}")

    def mapping(self) -> dict[str, Any]:
        text = self.text
        self.i += 1  # "{"
        out: dict[str, Any] = {}
        self.ws()
        if text.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            self.ws()
            if text.startswith(QUOTE, self.i):
                key = self.value()
            else:
                end = text.find(":", self.i)
                if end < 0:
                    raise GemmaSyntaxError("missing ':'")
                key = text[self.i : end].strip()
                self.i = end
            self.ws()
            if not text.startswith(":", self.i) or not key:
                raise GemmaSyntaxError("bad key")
            self.i += 1
            out[key] = self.value()
            self.ws()
            if text.startswith(",", self.i):
                self.i += 1
            elif text.startswith("}", self.i):
                self.i += 1
                return out
            else:
                raise GemmaSyntaxError("bad object")


def gemma_to_json(text: str) -> str:
    """JSON text for a Gemma argument object ``{…}``; raises ``GemmaSyntaxError``."""
    reader = _Reader(text)
    reader.ws()
    if not text.startswith("{", reader.i):
        raise GemmaSyntaxError("not an object")
    value = reader.mapping()
    reader.ws()
    if reader.i != len(text):
        raise GemmaSyntaxError("trailing text")
    return json.dumps(value, ensure_ascii=False)


def _object_end(text: str) -> int | None:
    """Index just past the ``}`` closing the object at ``text[0]``, or None if not yet closed."""
    depth, i = 0, 0
    while i < len(text):
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            if end < 0:
                return None
            i = end + len(QUOTE)
            continue
        ch = text[i]
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


class _GemmaCall(Region):
    def __init__(self, opener: str) -> None:
        self._opener = opener
        self._name: str | None = None

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._name is None:
            brace, _ = self.find(buf, ("{",))
            stop, _ = self.find(buf, (CLOSE, OPEN))
            if brace < 0 or (0 <= stop < brace):
                if final or stop >= 0:
                    end = stop if stop >= 0 else len(buf)
                    malformed(out, self._opener + buf[:end])
                    return end, True
                return 0, False
            m = _NAME.fullmatch(buf[:brace])
            if m is None:
                malformed(out, self._opener + buf[:brace])
                return brace, True
            self._name = m.group("name")
            out.append(CallStart(self._name))
            return brace, False
        at, marker = self.find(buf, (CLOSE, OPEN))
        if at < 0 and not final:
            return 0, False
        body = buf if at < 0 else buf[:at]
        obj_end = _object_end(body)
        ok = marker == CLOSE and obj_end is not None and not body[obj_end:].strip()
        try:
            args = gemma_to_json(body[:obj_end] if obj_end is not None else body)
        except (GemmaSyntaxError, RecursionError):
            args, ok = "{}", False
        out.append(ArgsDelta(args))
        if not ok:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
        out.append(CallEnd())
        used = at + len(marker) if marker == CLOSE else len(body)
        return used, True


class Gemma4ToolParser(RegionParser):
    """``<|tool_call>call:name{…}<tool_call|>`` calls."""

    openers = (OPEN,)
    drops = ("<|tool_response>",)
    markers = (OPEN, CLOSE, QUOTE, "<|tool_response>", "<|channel>", "<channel|>")

    def open_region(self, marker: str) -> Region:
        return _GemmaCall(marker)
