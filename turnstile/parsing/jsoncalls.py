"""JSON helpers for tool-call formats whose calls are ``{"name": ..., "arguments": {...}}`` objects.

Hand-rolled rather than ``json.loads`` alone because streaming needs to know *where* in the
model's text a value starts and ends, so that the exact characters the model sampled can be
forwarded as ``arguments`` instead of a re-serialisation. Shared by Hermes today and meant for
Llama-3 JSON / Mistral-style formats later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ..families.shapes import ARGS_KEYS

JSON_WS = " \t\n\r"
_DECODER = json.JSONDecoder()
_STRUCTURE = re.compile(r'["{}\[\]]')  # outside a string: a string opens, or the depth changes
_IN_STRING = re.compile(r'["\\]')  # inside one: it closes, or an escape


def skip_ws(text: str, i: int) -> int:
    """Index of the first non-JSON-whitespace character at or after ``i``."""
    n = len(text)
    while i < n and text[i] in JSON_WS:
        i += 1
    return i


@dataclass(frozen=True, slots=True)
class Member:
    """One ``"key": value`` of an object, with the span of the raw value text."""

    key: str
    value: Any
    start: int
    end: int


def object_members(text: str) -> list[Member] | None:
    """The members of the one JSON object that ``text`` consists of, or None if it is not that.

    Whitespace around the object is allowed; anything else (a second value, a trailing comma,
    invalid JSON) gives None.
    """
    try:
        i = skip_ws(text, 0)
        if text[i : i + 1] != "{":
            return None
        members: list[Member] = []
        i = skip_ws(text, i + 1)
        if text[i : i + 1] == "}":
            return members if skip_ws(text, i + 1) == len(text) else None
        while True:
            if text[i : i + 1] != '"':
                return None
            key, i = _DECODER.raw_decode(text, i)
            i = skip_ws(text, i)
            if text[i : i + 1] != ":":
                return None
            start = skip_ws(text, i + 1)
            value, end = _DECODER.raw_decode(text, start)
            members.append(Member(key, value, start, end))
            i = skip_ws(text, end)
            sep = text[i : i + 1]
            if sep == "}":
                return members if skip_ws(text, i + 1) == len(text) else None
            if sep != ",":
                return None
            i = skip_ws(text, i + 1)
    except ValueError:  # json.JSONDecodeError is a ValueError
        return None


def parse_call_object(
    text: str, args_keys: tuple[str, ...] = ARGS_KEYS, name_keys: tuple[str, ...] = ("name",)
) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a complete call object, or None if it is not a valid call.

    The arguments text is the model's own substring when it wrote an object; a string that
    holds a JSON object is accepted as is (some models stringify); missing or null gives "{}".
    """
    members = object_members(text)
    if members is None:
        return None
    by_key = {m.key: m for m in members}  # last duplicate wins, like json.loads
    name = next((by_key[k] for k in name_keys if k in by_key), None)
    if name is None or not isinstance(name.value, str) or not name.value:
        return None
    args = next((by_key[k] for k in args_keys if k in by_key), None)
    if args is None or args.value is None:
        return name.value, "{}"
    if isinstance(args.value, dict):
        return name.value, text[args.start : args.end]
    if isinstance(args.value, str):
        try:
            decoded = json.loads(args.value)
        except ValueError:
            return None
        return (name.value, args.value) if isinstance(decoded, dict) else None
    return None


HeadStatus = Literal["match", "partial", "fail"]


@dataclass(frozen=True, slots=True)
class CallHead:
    """Result of ``match_call_head``; ``end`` is just past the ``{`` opening the arguments."""

    status: HeadStatus
    name: str = ""
    end: int = 0


class _Partial(Exception):
    pass


class _Fail(Exception):
    pass


class _Cursor:
    """Sequential matcher over a possibly incomplete text: running out of text is 'partial'."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def ws(self) -> None:
        self.i = skip_ws(self.text, self.i)

    def literal(self, *options: str) -> None:
        rest = self.text[self.i :]
        for option in options:
            if rest.startswith(option):
                self.i += len(option)
                return
        if any(option.startswith(rest) for option in options):
            raise _Partial
        raise _Fail

    def string(self) -> str:
        text, i = self.text, self.i
        if i >= len(text):
            raise _Partial
        if text[i] != '"':
            raise _Fail
        j = i + 1
        while j < len(text):
            ch = text[j]
            if ch == "\\":
                j += 2
                continue
            if ch == '"':
                try:
                    value = json.loads(text[i : j + 1])
                except ValueError:
                    raise _Fail from None
                self.i = j + 1
                return value
            j += 1
        raise _Partial


def match_call_head(text: str, args_keys: tuple[str, ...] = ARGS_KEYS) -> CallHead:
    """Match ``{"name": "<str>", "arguments": {`` at the start of ``text`` (JSON whitespace ok).

    Why: this is the point from which a streamed call can be announced safely (the name is
    known and the arguments are an object whose text can be forwarded as it arrives). The
    result for a longer text never contradicts a "match" or "fail" for its prefix, so the
    decision does not depend on how the stream was chunked.
    """
    cur = _Cursor(text)
    try:
        cur.ws()
        cur.literal("{")
        cur.ws()
        cur.literal('"name"')
        cur.ws()
        cur.literal(":")
        cur.ws()
        name = cur.string()
        cur.ws()
        cur.literal(",")
        cur.ws()
        cur.literal(*(f'"{k}"' for k in args_keys))
        cur.ws()
        cur.literal(":")
        cur.ws()
        cur.literal("{")
    except _Partial:
        return CallHead("partial")
    except _Fail:
        return CallHead("fail")
    if not name:
        return CallHead("fail")
    return CallHead("match", name, cur.i)


def parse_keyed_call(text: str) -> tuple[str, str] | None:
    """(name, arguments) of a ``{"<name>": {...arguments}}`` object (Apertus), or None."""
    members = object_members(text)
    if members is None or len(members) != 1 or not members[0].key:
        return None
    member = members[0]
    if not isinstance(member.value, dict):
        return None
    return member.key, text[member.start : member.end]


def match_head(
    text: str,
    name_keys: tuple[str, ...] = ("name",),
    args_keys: tuple[str, ...] = ARGS_KEYS,
    keyed: bool = False,
) -> CallHead:
    """Like ``match_call_head`` for other key spellings, skipping leading scalar members.

    Matches ``{"tool_call_id": "0", "tool_name": "f", "parameters": {`` (Cohere) as well as
    ``{"name": "f", "arguments": {``; with ``keyed``, ``{"f": {`` (the name is the key).
    Members before the name must have string/number/literal values, so that the match stays
    a pure function of the prefix (the same guarantee as ``match_call_head``).
    """
    cur = _Cursor(text)
    try:
        cur.ws()
        cur.literal("{")
        cur.ws()
        if keyed:
            name = cur.string()
            cur.ws()
            cur.literal(":")
            cur.ws()
            cur.literal("{")
            return CallHead("match", name, cur.i) if name else CallHead("fail")
        name = ""
        while True:
            key = cur.string()
            cur.ws()
            cur.literal(":")
            cur.ws()
            if key in name_keys and not name:
                name = cur.string()
                if not name:
                    return CallHead("fail")
            elif key in args_keys and name:
                cur.literal("{")
                return CallHead("match", name, cur.i)
            elif key in args_keys or key in name_keys:
                return CallHead("fail")
            else:
                _skip_scalar(cur)
            cur.ws()
            cur.literal(",")
            cur.ws()
    except _Partial:
        return CallHead("partial")
    except _Fail:
        return CallHead("fail")


def _skip_scalar(cur: _Cursor) -> None:
    """Skip a string, number or literal; objects and arrays fail (they need a scanner)."""
    text = cur.text
    if cur.i >= len(text):
        raise _Partial
    if text[cur.i] == '"':
        cur.string()
        return
    j = cur.i
    while j < len(text) and (text[j].isalnum() or text[j] in "+-."):
        j += 1
    if j == len(text):
        raise _Partial
    if j == cur.i:
        raise _Fail
    try:
        json.loads(text[cur.i : j])
    except ValueError:
        raise _Fail from None
    cur.i = j


class ValueScanner:
    """Finds where a streamed JSON object/array ends by tracking brackets and strings.

    It does not validate (that happens once the call is complete); it only needs to know which
    characters belong to the value, whatever the chunking. It jumps from one character that
    matters to the next (a regex search, in C): a coding agent's tool call carries whole
    files in its arguments, and a loop over every character cost ~50 ns each.
    """

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth
        self._in_string = False
        self._escaped = False

    @property
    def done(self) -> bool:
        return self.depth == 0

    def feed(self, text: str) -> int | None:
        """Consume ``text``; return the index just past the closing bracket, or None."""
        i, n = 0, len(text)
        if self._escaped and n:  # the last chunk ended inside a string on a backslash
            self._escaped = False
            i = 1
        while i < n:
            if self._in_string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    return None
                j = m.start()
                if text[j] == "\\":
                    if j + 1 == n:
                        self._escaped = True
                        return None
                    i = j + 2
                    continue
                self._in_string = False
                i = j + 1
                continue
            m = _STRUCTURE.search(text, i)
            if m is None:
                return None
            j = m.start()
            ch = text[j]
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    return j + 1
            i = j + 1
        return None
