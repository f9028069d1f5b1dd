"""Size limits on a chat request, checked on the parsed JSON before anything is built from it:
a body within ``--max-body-mb`` can still hold a million empty messages or JSON nested
thousands deep, and rendering that first would cost far more than refusing it.

Each limit is a ``turnstile serve`` flag; a request over one is a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import APIError


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
    for name, cap, flag in (("messages", limits.max_messages, "--max-messages"),
                            ("tools", limits.max_tools, "--max-tools")):
        v = body.get(name)
        if isinstance(v, list) and len(v) > cap:
            raise APIError(400, f"Too many {name}: {len(v)}; the limit is {cap} (start "
                                f"turnstile with a larger {flag}).", name,
                           code="limit_exceeded")
    # (value, path, depth); the path is built lazily from the parent's
    stack: list[tuple[object, tuple, int]] = [(v, (k,), 1) for k, v in body.items()]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if len(v) > limits.max_string:
                raise APIError(400, f"{_name(path)} is {len(v)} characters; the limit is "
                                    f"{limits.max_string} (start turnstile with a larger "
                                    "--max-string-kb).", _name(path), code="limit_exceeded")
        elif isinstance(v, dict | list):
            if depth > limits.max_depth:
                raise APIError(400, f"{_name(path)} is nested deeper than {limits.max_depth} "
                                    "levels (start turnstile with a larger --max-depth).",
                               _name(path), code="limit_exceeded")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            stack.extend((x, (*path, k), depth + 1) for k, x in items)


def _name(path: tuple) -> str:
    out = str(path[0])
    for k in path[1:]:
        out += f"[{k}]" if isinstance(k, int) else f".{k}"
    return out
