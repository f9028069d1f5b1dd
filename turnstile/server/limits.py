"""Size limits on a chat request, checked on the parsed JSON before anything is built from it:
a body within ``--max-body-mb`` can still hold a million empty messages or JSON nested
thousands deep, and rendering that first would cost far more than refusing it.

Each limit is a ``turnstile serve`` flag; a request over one is a 400 naming the field.
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


def check(body: object, limits: Limits) -> None:
    """Raise a 400 naming the first field over a limit (the body is walked once, without
    recursion)."""
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
