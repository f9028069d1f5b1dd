"""Why a request did not continue a recorded call: the first message that differs from what the
session recorded, named with the field and short excerpts (``segment_detail``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from .history_hash import arguments_key, content_key

if TYPE_CHECKING:
    from .history import SessionTree


def _excerpt(a: str, b: str, width: int = 40) -> tuple[str, str]:
    """Both texts around their first difference."""
    n = min(len(a), len(b))
    at = next((i for i in range(n) if a[i] != b[i]), n)
    lo = max(0, at - width // 2)

    def cut(t: str) -> str:
        return ("…" if lo else "") + t[lo : lo + width] + ("…" if len(t) > lo + width else "")

    return cut(a), cut(b)


def describe_divergence(
    tree: SessionTree, messages: list[dict], hashes: list[bytes], matched: int
) -> str:
    """Which message stopped the request from continuing a recorded call, and how: the field
    that differs with a short excerpt of both sides, where the recorded side is known."""
    if matched >= len(messages):  # every message matches: nothing new after a recorded turn
        return (
            f"all {len(messages)} messages match a recorded conversation, which continues "
            "past them; the request adds no new message"
        )
    m = messages[matched]
    role = m.get("role")
    head = f"messages[{matched}] ({role})"
    prev = tree.requests.get(hashes[matched])
    if prev is None:
        return (
            f"{head} differs from the recorded conversation at that position (the first "
            f"{matched} messages match a recorded conversation)"
        )
    reply = tree.nodes[prev].message or {}
    if role != "assistant":
        return (
            f"{head}: the recorded conversation continues here with the assistant reply "
            f"of {prev}, which this request leaves out"
        )
    diffs = []
    fmt = tree.content_format
    got, want = content_key(m.get("content"), fmt), content_key(reply.get("content"), fmt)
    if got != want:
        a, b = _excerpt(str(want), str(got))
        diffs.append(f"content: recorded {a!r}, sent {b!r}")
    sent = [
        [
            (c.get("function") or {}).get("name"),
            arguments_key((c.get("function") or {}).get("arguments")),
        ]
        for c in m.get("tool_calls") or ()
    ]
    rec = [
        [
            (c.get("function") or {}).get("name"),
            arguments_key((c.get("function") or {}).get("arguments")),
        ]
        for c in reply.get("tool_calls") or ()
    ]
    if sent != rec:
        a, b = _excerpt(orjson.dumps(rec).decode(), orjson.dumps(sent).decode())
        diffs.append(f"tool_calls: recorded {a}, sent {b}")
    if m.get("name") != reply.get("name"):
        diffs.append(f"name: recorded {reply.get('name')!r}, sent {m.get('name')!r}")
    what = "; ".join(diffs) or "a field the history key compares"
    return f"{head} is not the reply {prev} returned: {what}"
