"""A harness resends its whole history on every call: parse each session's body only where it
is new.

Of a session's last body, :class:`ResentBodies` keeps the parsed history list (``messages``,
or ``input`` in the Responses dialect), where each of its elements ends in the raw bytes, and a
hash of the bytes up to each end (not the bytes: they would add ~40% to a session's memory). A
new body whose bytes up to element ``k``'s end hash the same holds the same ``k + 1`` elements,
already parsed: only the bytes after them are parsed (the new elements, and the members after
the list unless those bytes hash the same as well).

Why this is exact. JSON is read left to right with no look-ahead: equal leading bytes leave
the reader in the same place (inside the history list, after element ``k``) with the same
values read. The new bytes are accepted only if ``[`` + them + ``]`` parses as a list (a run
of whole values, so the reader is again after an element), and what follows is either the
last body's own bytes from its closing ``]`` (hash-equal) or parsed as the rest of the
object. A body whose top level names a member twice, or anything else this reader does not
follow, is parsed whole, as is every body the shortcut cannot vouch for. The result equals
``orjson.loads(raw)`` (tests/test_resent.py checks it on generated bodies and edits).

The elements are shared with the last body's parse, so nothing downstream may change a body's
elements in place (the dialects build new objects; tests/test_resent_served.py would see a
changed element in the next call's prompt). The body and its list are new on every call.
"""

from __future__ import annotations

import os
import re
from array import array
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from ..errors import APIError

MIN_BYTES = 16 << 10  # smaller bodies are parsed whole (reading them again costs as little)
# The most bytes of new elements read bracket by bracket (~3 us per KB) before the body is
# parsed whole instead: a body that changed near its start and after its list.
WALK_MAX = 64 << 10
_WS = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_BRACKETS = re.compile(rb'["{}\[\]]')
# The hash of the bytes up to each element's end: XXH3-128, keyed per process. Not a
# cryptographic hash: what a crafted collision could do is make a session's body read as that
# same session's earlier bytes would (what the engine is sent and what is recorded still agree).
_SEED = int.from_bytes(os.urandom(8), "little")
_MARK = 16  # bytes per hash (XXH3-128)


def _hash(data: memoryview) -> Any:
    return xxhash.xxh3_128(data, seed=_SEED)


def parse_json(raw: bytes | bytearray) -> object:
    """The body as JSON, or a 400 saying it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise APIError(
            400, f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc


class _Unusual(Exception):
    """Bytes this reader does not follow (the body is then parsed whole)."""


def _ws(b: bytes | bytearray, pos: int) -> int:
    m = _WS.match(b, pos)
    assert m is not None  # matches the empty string
    return m.end()


def _at(b: bytes | bytearray, pos: int) -> int:
    if pos >= len(b):
        raise _Unusual
    return b[pos]


def _after(b: bytes | bytearray, end: int, close: int) -> int | None:
    """After a list element or object member ending at ``end``: where the next one starts,
    or None at the ``close`` bracket (anything else is not JSON this reader follows)."""
    pos = _ws(b, end)
    c = _at(b, pos)
    if c == close:
        return None
    if c != 0x2C:
        raise _Unusual
    return _ws(b, pos + 1)


def _string_end(b: bytes | bytearray, pos: int) -> int:
    """The offset after the string starting at ``pos`` (a quote)."""
    i = pos + 1
    while True:
        q = b.find(b'"', i)
        if q < 0:
            raise _Unusual
        j = q - 1
        while b[j] == 0x5C:  # backslashes before the quote: an odd run escapes it
            j -= 1
        if (q - 1 - j) % 2 == 0:
            return q + 1
        i = q + 1


def _value_end(b: bytes | bytearray, pos: int) -> int:
    """The offset after the JSON value starting at ``pos`` (read bracket by bracket)."""
    c = _at(b, pos)
    if c == 0x22:
        return _string_end(b, pos)
    if c not in (0x7B, 0x5B):
        m = _SCALAR.match(b, pos)
        if m is None:
            raise _Unusual
        return m.end()
    depth, i = 0, pos
    while m := _BRACKETS.search(b, i):
        c = b[m.start()]
        if c == 0x22:
            i = _string_end(b, m.start())
            continue
        depth += 1 if c in (0x7B, 0x5B) else -1
        i = m.end()
        if depth == 0:
            return i
    raise _Unusual


def _skip(b: bytes | bytearray, pos: int, value: object) -> int:
    """The offset after ``value``, known to start at ``pos``: where the sender wrote it as
    orjson would (compact JSON: the SDKs on httpx 0.28+, Node, Rust), one comparison; else
    bracket by bracket (Python's ``json`` defaults, as ``requests`` sends: ~3 us per KB, about
    as fast as ``json.dumps`` would write it to compare). Only objects, lists and strings end
    where their own bytes say."""
    if type(value) in (dict, list, str):
        text = orjson.dumps(value)
        if b.startswith(text, pos):
            return pos + len(text)
    return _value_end(b, pos)


def _elements(
    b: bytes | bytearray, pos: int, items: list | None, stop: int | None = None
) -> tuple[list[int], int]:
    """The ends of the list elements starting at ``pos`` (after ``[``, or after a comma that
    separates them from earlier ones) and the offset of the list's ``]``. ``items``: the
    parsed elements, when known (faster); ``stop``: give up (``_Unusual``) past it."""
    ends: list[int] = []
    pos = _ws(b, pos)
    if _at(b, pos) == 0x5D:
        return ends, pos
    while True:
        if stop is not None and pos > stop:
            raise _Unusual
        if items is None:
            end = _value_end(b, pos)
        elif len(ends) < len(items):
            end = _skip(b, pos, items[len(ends)])
        else:
            raise _Unusual
        ends.append(end)
        nxt = _after(b, end, 0x5D)
        if nxt is None:
            return ends, _ws(b, end)
        pos = nxt


def _members(
    b: bytes | bytearray, pos: int, body: dict, field: str
) -> tuple[list[str], tuple[int, list[int], int] | None]:
    """The names of the object's members from ``pos`` (after ``{``), in order, and where the
    list named ``field`` lies: (the offset after its ``[``, its elements' ends, its ``]``)."""
    names: list[str] = []
    found = None
    pos = _ws(b, pos)
    if _at(b, pos) == 0x7D:
        return names, found
    while True:
        if _at(b, pos) != 0x22:
            raise _Unusual
        key_end = _string_end(b, pos)
        key = b[pos + 1 : key_end - 1]
        name = orjson.loads(b[pos:key_end]) if 0x5C in key else key.decode()
        pos = _ws(b, key_end)
        if _at(b, pos) != 0x3A:
            raise _Unusual
        start = _ws(b, pos + 1)
        if name == field and found is None and _at(b, start) == 0x5B:
            ends, close = _elements(b, start + 1, body[field])
            found, end = (start + 1, ends, close), close + 1
        else:
            end = _skip(b, start, body.get(name))
        names.append(name)
        nxt = _after(b, end, 0x7D)
        if nxt is None:
            return names, found
        pos = nxt


@dataclass
class _Seen:
    """What a session's last body left to compare the next one with."""

    field: str
    size: int  # bytes of the body
    lead: dict  # the top-level members before the history list
    open: int  # the offset after the list's ``[``
    ends: array  # the offset after each element
    marks: bytearray  # the hash of raw[:open], then of raw[:end] per end
    items: list  # the parsed elements
    close: int  # the offset of the list's ``]``
    tail_mark: bytes  # the hash of raw[close:]
    trailing: dict  # the top-level members after the list

    def mark(self, i: int) -> bytes:
        return bytes(self.marks[i * _MARK : (i + 1) * _MARK])


class ResentBodies:
    """Per session (at most ``size``, the least recently used dropped first), what its last
    body left for the next one: see the module's docstring."""

    def __init__(self, size: int = 1024, min_bytes: int = MIN_BYTES):
        self.size = size
        self.min_bytes = min_bytes
        self._seen: dict[str, _Seen] = {}
        self.reused = 0  # elements taken from an earlier parse (for tests and benchmarks)

    def forget(self, session: str) -> None:
        self._seen.pop(session, None)

    def parse(self, session: str, field: str, raw: bytes | bytearray) -> object:
        """``orjson.loads(raw)`` (a 400 if it is not JSON), reusing what the session's last
        body held where the bytes are the same; ``field``: the dialect's history list."""
        seen = self._seen.pop(session, None)
        if len(raw) < self.min_bytes:
            return parse_json(raw)
        spliced = None
        if seen is not None and seen.field == field:
            try:
                spliced = _splice(seen, raw)
            except (_Unusual, orjson.JSONDecodeError):
                pass
        body: object
        if spliced is not None:
            body, seen, k = spliced
            self.reused += k
        else:
            body = parse_json(raw)
            try:
                seen = _layout(raw, body, field)
            except (_Unusual, orjson.JSONDecodeError):
                seen = None
        if seen is not None:
            if len(self._seen) >= self.size:
                del self._seen[next(iter(self._seen))]
            self._seen[session] = seen
        return body


def _layout(b: bytes | bytearray, body: object, field: str) -> _Seen | None:
    """Where the history list and its elements lie in a body parsed whole (None: no list to
    keep, or a member named twice)."""
    if type(body) is not dict or type(body.get(field)) is not list:
        return None
    start = _ws(b, 0)
    if _at(b, start) != 0x7B:
        raise _Unusual
    names, found = _members(b, start + 1, body, field)
    if found is None or len(set(names)) != len(names):
        return None
    at = names.index(field)
    open_, ends, close = found
    items = body[field]
    if len(ends) != len(items):
        raise _Unusual
    view = memoryview(b)
    h = _hash(view[:open_])
    marks = bytearray(h.digest())
    prev = open_
    for end in ends:
        h.update(view[prev:end])
        marks += h.digest()
        prev = end
    return _Seen(
        field,
        len(b),
        {name: body[name] for name in names[:at]},
        open_,
        array("q", ends),
        marks,
        list(items),
        close,
        _hash(view[close:]).digest(),
        {name: body[name] for name in names[at + 1 :]},
    )


def _splice(s: _Seen, b: bytes | bytearray) -> tuple[dict, _Seen, int] | None:
    """The body made of the last one's leading elements where ``b`` holds the same bytes and
    of what it parses after them, what it leaves for the next, and how many elements it
    reused; None when not even the bytes before the list are the same."""
    view = memoryview(b)
    n = len(s.ends)
    # the most elements whose bytes are the same: all of them (the usual call), else walk
    k = -1
    if n and len(b) > s.ends[n - 1]:
        h = _hash(view[: s.ends[n - 1]])
        if h.digest() == s.mark(n):
            k = n
    if k < 0:
        if len(b) <= s.open:
            return None
        h = _hash(view[: s.open])
        if h.digest() != s.mark(0):
            return None
        k, prev = 0, s.open
        for i in range(n):
            end = s.ends[i]
            if end >= len(b):
                break
            nxt = h.copy()
            nxt.update(view[prev:end])
            if nxt.digest() != s.mark(i + 1):
                break
            h, prev, k = nxt, end, i + 1
    pos = s.ends[k - 1] if k else s.open
    # the elements after them: ``first`` is where the first new one starts (None: none)
    p = _ws(b, pos)
    c = _at(b, p)
    if c == 0x5D:
        first = None
    elif k == 0:
        first = p
    elif c == 0x2C:
        first = _ws(b, p + 1)
    else:
        raise _Unusual
    if first is not None and _at(b, first) == 0x5D:
        raise _Unusual  # "[,]" or "x,]": not JSON; the whole parse says so
    tail = len(b) - (s.size - s.close)
    if p <= tail < len(b) and _hash(view[tail:]).digest() == s.tail_mark:
        close, trailing, tail_mark = tail, s.trailing, s.tail_mark
        if first is None:
            if p != close:
                raise _Unusual
            new: list = []
        else:
            new = orjson.loads(b"[" + b[first:close] + b"]")
            if type(new) is not list:
                raise _Unusual
        new_ends, at = _elements(b, first, new) if first is not None else ([], close)
        if at != close or len(new_ends) != len(new):
            raise _Unusual
    else:
        # the members after the list changed too: find its end, parse both parts
        walked = _elements(b, first, None, first + WALK_MAX) if first is not None else None
        new_ends, close = walked or ([], p)
        new = orjson.loads(b"[" + b[first:close] + b"]") if first is not None else []
        if type(new) is not list or len(new) != len(new_ends):
            raise _Unusual
        after = _ws(b, close + 1)
        c = _at(b, after)
        if c == 0x2C:
            if _at(b, _ws(b, after + 1)) != 0x22:
                raise _Unusual
            trailing = orjson.loads(b"{" + b[after + 1 :])
        elif c == 0x7D:
            if b[after + 1 :].strip(b" \t\n\r"):
                raise _Unusual
            trailing = {}
        else:
            raise _Unusual
        if type(trailing) is not dict or s.field in trailing:
            raise _Unusual
        tail_mark = _hash(view[close:]).digest()
    items = s.items[:k] + new
    marks = s.marks[: (k + 1) * _MARK]
    prev = pos
    for end in new_ends:
        h.update(view[prev:end])
        marks += h.digest()
        prev = end
    ends = s.ends[:k]
    ends.extend(new_ends)
    body = dict(s.lead)
    body[s.field] = list(items)
    body.update(trailing)
    kept = _Seen(s.field, len(b), s.lead, s.open, ends, marks, items, close, tail_mark, trailing)
    return body, kept, k
