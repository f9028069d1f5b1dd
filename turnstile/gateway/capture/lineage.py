"""A session's recorded calls indexed by token prefix, for engine-rendered capture.

When the engine renders the prompt, the only safe way to link a call to its parent is by
tokens: a call whose prompt IDs start with a recorded call's prompt + completion is that
call's child. :class:`LineageIndex` finds that parent with one hashing pass over the prompt,
and, when there is none, the recorded conversation the prompt left and where.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...chat.lineages import root_reason

if TYPE_CHECKING:
    from ...store.records import CallRecord

WINDOW = 6  # tokens shown on each side of a divergence
Detokenize = Callable[[list[int]], Awaitable["str | None"]]  # the engine's text for IDs


@dataclass(eq=False)
class Node:
    """A recorded ``ok`` call: its tokens as a delta against its parent (memory grows with
    new tokens only) and a digest of its whole prompt + completion."""

    id: str
    parent: Node | None
    delta: array
    completion: array
    seq: int
    full_len: int
    digest: bytes

    def path(self) -> list[Node]:
        out: list[Node] = []
        node: Node | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def full(self) -> array:
        """Prompt + completion: the prefix a child call extends."""
        out = array("i")
        for node in self.path():
            out.extend(node.delta)
            out.extend(node.completion)
        return out


def digest(*parts: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p)
    return h.digest()


def new_node(
    call_id: str,
    parent: Node | None,
    delta: array,
    completion: array,
    seq: int,
    prompt: array | None = None,
) -> Node:
    """The node of a call whose prompt is ``parent``'s prompt + completion + ``delta``
    (``prompt``, when the caller has it whole already)."""
    if prompt is None:
        prompt = parent.full() if parent else array("i")
        prompt.extend(delta)
    return Node(
        call_id,
        parent,
        delta,
        completion,
        seq,
        len(prompt) + len(completion),
        digest(prompt.tobytes(), completion.tobytes()),
    )


def extends(node: Node, prompt: array) -> bool:
    """Whether ``prompt`` starts with ``node``'s prompt + completion."""
    return (
        node.full_len <= len(prompt)
        and node.full().tobytes() == memoryview(prompt.tobytes())[: node.full_len * 4]
    )


def common_prefix(prompt: array, other: array) -> int:
    """How many leading tokens the two sequences share."""
    p = np.frombuffer(prompt, dtype=np.int32)
    q = np.frombuffer(other, dtype=np.int32)
    n = min(len(p), len(q))
    diff = np.flatnonzero(p[:n] != q[:n])
    return int(diff[0]) if diff.size else n


@dataclass
class LineageIndex:
    nodes: dict[str, Node] = field(default_factory=dict)
    by_len: dict[int, list[Node]] = field(default_factory=dict)
    leaves: dict[str, Node] = field(default_factory=dict)
    replies: dict[bytes, str] = field(default_factory=dict)  # request+reply hash -> call id
    n_calls: int = 0
    created: float | None = None  # the session's creation time (a re-created id differs)
    # every recorded conversation prefix -> the call whose request first held it
    known: dict[bytes, str] = field(default_factory=dict)
    first_request: bytes | None = None  # the first request to arrive (``chat.lineages``)

    @classmethod
    def from_calls(cls, calls: Iterable[CallRecord]) -> LineageIndex:
        """The index of a session's recorded calls (after a restart): ``ok`` calls only, but
        every call counts for the next ``seq``."""
        idx = cls()
        for c in calls:
            idx.n_calls = max(idx.n_calls, c.seq + 1)
            if c.status != "ok":
                continue
            parent = idx.nodes.get(c.parent_id) if c.parent_id else None
            idx.add(new_node(c.id, parent, c.prompt_delta, c.completion_ids, c.seq))
            for h in c.prefix_hashes:
                idx.known.setdefault(h, c.id)
            if c.history_hash is not None:
                idx.replies[c.history_hash] = c.id
        return idx

    def add(self, node: Node) -> None:
        self.nodes[node.id] = node
        self.by_len.setdefault(node.full_len, []).append(node)
        self.leaves[node.id] = node
        if node.parent is not None:
            self.leaves.pop(node.parent.id, None)

    def parent_of(self, prompt: array) -> Node | None:
        """The recorded call whose prompt + completion is the longest prefix of ``prompt``
        (the latest one when several are equal). One pass of hashing over the prompt finds
        candidates at every recorded length; the winner is then compared token for token."""
        lengths = sorted(n for n in self.by_len if 0 < n <= len(prompt))
        raw = memoryview(prompt.tobytes())
        h = hashlib.blake2b(digest_size=16)
        pos, found = 0, []
        for n in lengths:
            h.update(raw[pos * 4 : n * 4])
            pos = n
            d = h.digest()
            found += [c for c in self.by_len[n] if c.digest == d]
        for cand in sorted(found, key=lambda c: (c.full_len, c.seq), reverse=True):
            if cand.full().tobytes() == raw[: cand.full_len * 4]:
                return cand
        return None

    def closest(self, prompt: array) -> tuple[Node, int] | None:
        """The recorded conversation sharing the longest token prefix with ``prompt`` (a leaf:
        every call's tokens are a prefix of its descendants') and that prefix's length."""
        best: tuple[Node, int] | None = None
        for leaf in self.leaves.values():
            common = common_prefix(prompt, leaf.full())
            if best is None or (common, leaf.seq) > (best[1], best[0].seq):
                best = (leaf, common)
        return best


@dataclass
class Link:
    """Where a prompt joins the session's tree."""

    prompt: array
    hashes: list[bytes]
    parent: Node | None = None
    reason: str | None = None
    detail: str | None = None
    drift: dict | None = None
    lineage: str | None = None  # a new segment's: the call whose conversation it rewrites

    @property
    def delta(self) -> array:
        return self.prompt[self.parent.full_len :] if self.parent else self.prompt


async def link(
    idx: LineageIndex,
    messages: list[dict],
    hashes: list[bytes],
    prompt: array,
    detokenize: Detokenize,
) -> Link:
    """Parent by exact token prefix; otherwise a new segment, with where it diverged.

    ``hashes``: the request's message prefix hashes (``idx.replies`` maps the hash of a
    recorded call's request + reply to it). When the messages continue a recorded call, the
    prompt must extend *that* call's prompt + completion: extending only an ancestor (the
    engine re-tokenized the reply) is drift, not a branch."""
    out = Link(prompt, hashes)
    continued = None  # the call the messages continue
    for k in range(len(messages) - 1, 0, -1):
        cid = idx.replies.get(hashes[k])
        if cid is not None and cid in idx.nodes:
            continued = idx.nodes[cid]
            break
    parent = idx.parent_of(prompt)
    if parent is not None and (continued is None or extends(continued, prompt)):
        out.parent = parent
        return out
    if continued is not None:
        compared = continued
        common = common_prefix(prompt, continued.full())
        out.reason, out.lineage = "drift", continued.id
    else:
        matched = max((k for k, h in enumerate(hashes) if h in idx.known), default=0)
        out.reason = root_reason(
            request_hash=hashes[-1],
            first_request=idx.first_request,
            recorded_calls=len(idx.nodes),
            matched=matched,
            has_assistant=any(m.get("role") == "assistant" for m in messages),
        )
        if out.reason == "history_diverged":
            out.lineage = idx.known.get(hashes[matched]) if hashes else None
        if out.reason == "first_call":
            return out
        if not idx.nodes:  # the calls that came first are still running
            out.detail = (
                "a new lineage: another conversation of this session arrived first and has "
                "not been recorded yet"
            )
            return out
        compared, common = idx.closest(prompt)  # type: ignore[misc]
    out.drift = await _located(compared, common, prompt, detokenize)
    out.detail = describe(out.reason, out.drift)
    return out


async def _located(compared: Node, i: int, prompt: array, detokenize: Detokenize) -> dict:
    """:func:`divergence`, with the text of the tokens on both sides (the engine's)."""
    d = divergence(compared, i, prompt)
    recorded, received = d["recorded"]["ids"], d["received"]["ids"]
    k = i - d["window_start"]
    texts = await asyncio.gather(
        *(detokenize(ids) for ids in (recorded, received, recorded[k:], received[k:]))
    )
    same = None
    a, b = texts[2], texts[3]
    if a is not None and b is not None:
        short, long_ = sorted((a, b), key=len)
        same = bool(short) and long_.startswith(short)
    d["recorded"].update(text=texts[0], text_from_index=a)
    d["received"].update(text=texts[1], text_from_index=b)
    # the text goes on the same from the divergence: a retokenization, not an edit
    d["same_text"] = same
    return d


def divergence(compared: Node, i: int, prompt: array) -> dict:
    """Where ``prompt`` leaves ``compared``'s prompt + completion: the call and the part of
    it holding token ``i``, and the token IDs on both sides around it (the caller adds their
    text, as the engine detokenizes them)."""
    full = compared.full()
    at, region, offset, start = compared, "completion", 0, 0
    for node in compared.path():
        end_delta = start + len(node.delta)
        end = end_delta + len(node.completion)
        if i < end or node is compared:
            at = node
            region, offset = (
                ("prompt_delta", i - start) if i < end_delta else ("completion", i - end_delta)
            )
            break
        start = end
    lo = max(0, i - WINDOW)
    return {
        "call_id": compared.id,
        "call_seq": compared.seq,
        "index": i,
        "matched": i,
        "recorded_len": len(full),
        "received_len": len(prompt),
        "at_call_id": at.id,
        "at_call_seq": at.seq,
        "region": region,
        "offset": offset,
        "window_start": lo,
        "recorded": {"ids": full[lo : i + WINDOW].tolist()},
        "received": {"ids": prompt[lo : i + WINDOW].tolist()},
    }


def describe(reason: str, d: dict) -> str:
    """A divergence (with its texts) in one line, for ``segment_detail``."""
    i = d["index"]
    what = {
        "drift": "the messages continue call {c}, but the engine's prompt does not "
        "extend its prompt + completion",
        "history_diverged": "the messages continue no recorded call; the closest "
        "recorded conversation is call {c}",
        "new_conversation": "a new lineage: its first message (under its tools) is that of "
        "no recorded conversation; the closest recorded one is call {c}",
    }[reason].format(c=d["call_id"])
    if i >= d["received_len"]:
        where = (
            f"the prompt ({i} tokens) is a prefix of call {d['call_id']}'s prompt + "
            f"completion ({d['recorded_len']} tokens)"
        )
    else:
        where = f"prompt token {i} is the first that differs ({i} tokens match)"
    part = "completion" if d["region"] == "completion" else "prompt delta"
    out = (
        f"{what}: {where}, at token {d['offset']} of call {d['at_call_id']}'s {part}; "
        f"from token {d['window_start']} recorded {d['recorded']['ids']} vs received "
        f"{d['received']['ids']}"
    )
    if d["recorded"]["text"] is not None and d["received"]["text"] is not None:
        out += f", text {d['recorded']['text']!r} vs {d['received']['text']!r}"
        if d["same_text"]:
            out += " (same text, different tokens: retokenization)"
    return out
