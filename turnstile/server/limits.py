"""Size limits on a chat request, checked on the parsed JSON before anything is built from it:
a body within ``--max-body-mb`` can still hold a million empty messages or JSON nested
thousands deep, and rendering that first would cost far more than refusing it.

Each limit is a ``turnstile serve`` flag; a request over one is a 400 naming the field.

A harness resends its whole history on every call, so :class:`Checked` keeps, per session, the
top-level lists of the last body that passed: a leading run of elements equal (``==``, in C)
to that body's is within the limits already (equal JSON values have equal strings and equal
nesting, at the same depth), and only the elements after it are walked. Anything that differs
is walked in full, so no oversized element can ride in on an old prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import APIError


@dataclass(frozen=True)
class Limits:
    max_messages: int = 4096  # --max-messages
    max_tools: int = 512  # --max-tools
    max_string: int = 8 << 20  # --max-string-kb: characters in any one JSON string
    max_depth: int = 64  # --max-depth: nesting of objects/arrays anywhere in the body


class Checked:
    """The top-level lists of each session's last body that passed :func:`check` (at most
    ``size`` sessions, the least recently checked dropped first)."""

    def __init__(self, limits: Limits, size: int = 1024):
        self.limits = limits
        self.size = size
        self._last: dict[str, dict[str, list]] = {}

    def check(self, session: str, body: object) -> None:
        """:func:`check` with the session's last passed body as ``seen``; this one is kept
        if it passes."""
        seen = self._last.pop(session, None)
        check(body, self.limits, seen)
        if isinstance(body, dict):
            if len(self._last) >= self.size:
                del self._last[next(iter(self._last))]
            self._last[session] = {k: v for k, v in body.items() if type(v) is list}

    def forget(self, session: str) -> None:
        self._last.pop(session, None)


def check(body: object, limits: Limits, seen: dict[str, list] | None = None) -> None:
    """Raise a 400 naming the first field over a limit (the body is walked once, without
    recursion). ``seen``: top-level lists of a body that passed these limits; the leading
    elements of a list equal to the same field's there are not walked again."""
    if not isinstance(body, dict):
        return
    for name, cap, flag in (
        ("messages", limits.max_messages, "--max-messages"),
        ("tools", limits.max_tools, "--max-tools"),
    ):
        v = body.get(name)
        if isinstance(v, list) and len(v) > cap:
            raise APIError(
                400,
                f"Too many {name}: {len(v)}; the limit is {cap} (start "
                f"turnstile with a larger {flag}).",
                name,
                code="limit_exceeded",
            )
    # Containers only go on the stack (with their path and depth); strings are checked where
    # they are met. A resent history is thousands of strings: a tuple per value made this walk
    # cost more than parsing the body.
    cap, max_depth = limits.max_string, limits.max_depth
    stack: list[tuple[dict | list, tuple, int]] = [(body, (), 0)]
    if seen:
        stack = _unseen(body, seen, stack, cap)
    while stack:
        v, path, depth = stack.pop()
        if depth > max_depth:
            raise APIError(
                400,
                f"{_name(path)} is nested deeper than {max_depth} levels "
                "(start turnstile with a larger --max-depth).",
                _name(path),
                code="limit_exceeded",
            )
        for k, x in v.items() if isinstance(v, dict) else enumerate(v):
            if type(x) is str:  # the common case first: exact types, no isinstance
                if len(x) > cap:
                    raise _too_long(path, k, len(x), cap)
            elif type(x) is dict or type(x) is list:
                stack.append((x, (*path, k), depth + 1))
            elif isinstance(x, str):
                if len(x) > cap:
                    raise _too_long(path, k, len(x), cap)
            elif isinstance(x, dict | list):
                stack.append((x, (*path, k), depth + 1))


def _unseen(
    body: dict, seen: dict[str, list], stack: list[tuple[dict | list, tuple, int]], cap: int
) -> list[tuple[dict | list, tuple, int]]:
    """The walk's start: ``body`` itself unless one of its lists has a leading run equal to the
    same field's in ``seen``; then the body's other fields plus that list's elements after the
    run, at the depth and path the whole walk gives them. (The list itself held the depth limit
    in the body that passed, at the same depth.)"""
    rest: dict = {}
    out: list[tuple[dict | list, tuple, int]] = []
    for k, v in body.items():
        old = seen.get(k)
        if type(v) is not list or old is None:
            rest[k] = v
            continue
        n = min(len(v), len(old))
        if v[:n] != old[:n]:
            n = next(i for i in range(n) if v[i] != old[i])
        if n == 0:
            rest[k] = v
            continue
        for i in range(n, len(v)):
            x = v[i]
            if isinstance(x, dict | list):
                out.append((x, (k, i), 2))
            elif isinstance(x, str) and len(x) > cap:
                raise _too_long((k,), i, len(x), cap)
    if len(rest) == len(body):
        return stack
    return [(rest, (), 0), *out]


def _too_long(path: tuple, key: object, n: int, cap: int) -> APIError:
    at = _name((*path, key))
    return APIError(
        400,
        f"{at} is {n} characters; the limit is {cap} (start turnstile with a "
        "larger --max-string-kb).",
        at,
        code="limit_exceeded",
    )


def _name(path: tuple) -> str:
    out = str(path[0])
    for k in path[1:]:
        out += f"[{k}]" if isinstance(k, int) else f".{k}"
    return out
