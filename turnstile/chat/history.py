"""Which recorded call does a request continue?

Each request's messages are hashed as a chain (tools first, then one message at a time), after
normalising away the ways harnesses echo an assistant message back: ``content`` ``null`` vs
``""``, tool-call arguments re-serialised, reasoning dropped, tool-call ids renamed. A recorded
call is registered under the chain hash of *its request + the reply we returned*; a new request
continues the call whose hash equals one of its own prefix hashes (the longest wins), and its
remaining messages are the ones to render as a delta.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import orjson

from ..media import Image, MediaItem
from .history_hash import chain, message_key

_EMPTY = array("i")


class Node:
    """What the tree keeps in memory per call: its tokens (int32), its reply (for matching).
    Once the tree holds the call (:meth:`SessionTree.place`), its tokens live in the session's
    token log, and ``base`` is where its whole context starts there when that context is one
    contiguous run of the log (a session that goes on call after call)."""

    __slots__ = (
        "id",
        "parent",
        "message",
        "stop_token_id",
        "reasoning",
        "_delta",
        "_completion",
        "_log",
        "start",
        "mid",
        "end",
        "base",
        "media",
        "images",
        "media_placeholder",
    )

    def __init__(
        self,
        id: str,
        parent: Node | None,
        prompt_delta: array,
        completion_ids: array,
        message: dict | None,
        stop_token_id: int | None,
    ) -> None:
        self.id = id
        self.parent = parent
        self.message = message
        self.stop_token_id = stop_token_id
        # whether any reply on this path carried reasoning (templates treat it specially)
        self.reasoning: bool = bool(message and message.get("reasoning_content")) or (
            parent is not None and parent.reasoning
        )
        self._delta, self._completion = prompt_delta, completion_ids
        self._log: array | None = None
        self.start = self.mid = self.end = 0
        self.base: int | None = None
        # the images of this call's whole prompt (spans in the expanded context) and their
        # bytes by hash, shared with the calls that extend it (turnstile.media); () for text
        self.media: tuple[MediaItem, ...] = ()
        self.images: dict[str, Image] = {}
        self.media_placeholder = -1

    def __repr__(self) -> str:
        return f"Node({self.id!r}, parent={self.parent.id if self.parent else None!r})"

    @property
    def prompt_delta(self) -> array:
        return self._delta if self._log is None else self._log[self.start : self.mid]

    @property
    def completion_ids(self) -> array:
        return self._completion if self._log is None else self._log[self.mid : self.end]

    def has_reasoning(self) -> bool:
        return self.reasoning

    def context_ids(self) -> array:
        """Prompt + completion of this call, walking the path (``SessionTree.context_ids``
        is the fast way)."""
        parts = []
        node: Node | None = self
        while node is not None:
            parts.append(node.completion_ids)
            parts.append(node.prompt_delta)
            node = node.parent
        out = array("i")
        for p in reversed(parts):
            out.extend(p)
        return out


@dataclass
class Match:
    parent: Node | None
    new_messages: list[dict]
    hashes: list[bytes]
    matched: int  # how many leading messages match some recorded conversation
    note: str | None = None  # how an ambiguous parent was chosen
    stale: str | None = None  # a call it continues that was rendered by another template
    echoed_reasoning: bool = False  # an assistant message of the request carries reasoning


def _tool_call_ids(m: dict | None) -> list:
    return [c.get("id") for c in (m or {}).get("tool_calls") or ()]


def _reasoning(m: dict | None) -> object:
    return (m or {}).get("reasoning_content") or (m or {}).get("reasoning")


def _echoes_reasoning(m: dict) -> bool:
    return m.get("role") == "assistant" and bool(_reasoning(m))


def _plain(v: object) -> bool:
    """Only dicts, lists, strings and nulls: for these ``==`` is exact (no ``1 == 1.0 ==
    True``), so a value equal to a plain one serialises the same."""
    if v is None or type(v) is str:
        return True
    if type(v) is dict:
        return all(type(k) is str and _plain(x) for k, x in v.items())
    if type(v) is list:
        return all(_plain(x) for x in v)
    return False


def _key_plain(m: object) -> bool:
    """Whether every field ``message_key`` reads is plain: then a message ``==`` to ``m`` has
    the same key (fields outside the key, e.g. a tool call's ``index``, may be anything)."""
    if type(m) is not dict:
        return False
    if not (_plain(m.get("role")) and _plain(m.get("content")) and _plain(m.get("name"))):
        return False
    calls = m.get("tool_calls")
    if calls is None:
        return True
    return type(calls) is list and all(type(c) is dict and _plain(c.get("function")) for c in calls)


def _copy(v: object) -> object:
    """A copy of a JSON value's containers (strings are immutable and shared): what the tree
    compares the next request with must not change if the caller mutates its messages."""
    if type(v) is dict:
        return {k: _copy(x) for k, x in v.items()}
    if type(v) is list:
        return [_copy(x) for x in v]
    return v


@dataclass
class _Last:
    """The previous request of the session, as the tree saw it: its leading ``plain``
    messages (copies) with their chain hashes, and where its first echoed reasoning is."""

    root: bytes
    messages: list[dict]
    hashes: list[bytes]  # hashes[k] identifies messages[:k]
    reasoning_at: int  # index of the first assistant message with reasoning, or len


SEEN_MAX = 1 << 14  # messages whose chain hash a session remembers


@dataclass
class SessionTree:
    """The calls of one session, indexed by the conversations they answered."""

    nodes: dict[str, Node] = field(default_factory=dict)
    # request+reply hash -> ids of the calls that returned that reply, in recorded order
    replies: dict[bytes, list[str]] = field(default_factory=dict)
    requests: dict[bytes, str] = field(default_factory=dict)  # request hash -> latest call
    known: set[bytes] = field(default_factory=set)  # every conversation prefix seen
    # the call whose request first held each conversation prefix (the lineage a rewrite of
    # that conversation belongs to: ``chat.lineages``)
    prefix_owner: dict[bytes, str] = field(default_factory=dict)
    # replies recorded under another template/tokenizer fingerprint: never extended
    stale: dict[bytes, str] = field(default_factory=dict)
    n_calls: int = 0
    # the chain hash of the first request that arrived (``chat.lineages``: labels must not
    # depend on which calls have finished)
    first_request: bytes | None = None
    content_format: str = "string"  # how the template reads content (``chat.content``)
    # Every call's prompt delta + completion, appended in the order the calls were recorded:
    # a call that continues the one laid down just before it has its whole context as one
    # slice of this log, so a prompt is a copy of a slice + the delta, not a walk of the path.
    log: array = field(default_factory=lambda: array("i"), repr=False)
    copied: int = 0  # tokens of the log that repeat a context laid down again (branches)
    # Chain hash after a message already seen in this session, keyed by the hash before it and
    # the message's JSON (length + keyed 64-bit hash, not the bytes): harnesses resend the whole
    # history on every call, and normalising + hashing every old message again made matching
    # cost grow with the context. A message that serialises differently is simply hashed again.
    _seen: dict[tuple[bytes, int, int], bytes] = field(default_factory=dict, repr=False)
    # The previous request: a request that resends its messages (compared with ``==``, in C)
    # reuses their hashes, so only the new messages are serialised and hashed.
    _last: _Last | None = field(default=None, repr=False)

    def prefix_hashes(self, root: bytes, messages: list[dict]) -> list[bytes]:
        """``prefix_hashes(root, messages)``: the leading messages equal to the previous
        request's take its hashes; the others are hashed (reusing the chain of messages
        seen before in this session)."""
        return self._hashes(root, messages)[0]

    def _hashes(self, root: bytes, messages: list[dict]) -> tuple[list[bytes], bool]:
        last = self._last
        n = 0
        if last is not None and last.root == root:
            n = min(len(messages), len(last.messages))
            if messages[:n] != last.messages[:n]:
                n = next(i for i in range(n) if messages[i] != last.messages[i])
            out = last.hashes[: n + 1]
            reasoning_at = last.reasoning_at if last.reasoning_at < n else None
        else:
            out = [root]
            reasoning_at = None
        keep = last.messages[:n] if last is not None else []
        plain = True
        prev = out[-1]
        seen = self._seen
        for i in range(n, len(messages)):
            m = messages[i]
            if reasoning_at is None and _echoes_reasoning(m):
                reasoning_at = i
            try:
                raw = orjson.dumps(m)
            except orjson.JSONEncodeError:
                key = None
                nxt = None
            else:
                key = (prev, len(raw), hash(raw))
                nxt = seen.get(key)
            if nxt is None:
                nxt = chain(prev, message_key(m, self.content_format))
                if key is not None:
                    if len(seen) >= SEEN_MAX:  # a cache: bounded, whatever requests arrive
                        seen.clear()
                    seen[key] = nxt
            out.append(nxt)
            prev = nxt
            if plain and _key_plain(m):
                # an echo equal to a reply we recorded keeps that reply, not a second copy
                ids = self.replies.get(nxt)
                reply = self.nodes[ids[-1]].message if ids else None
                keep.append(reply if reply == m else _copy(m))  # type: ignore[arg-type]
            else:
                plain = False
        n_keep = len(keep)
        self._last = _Last(
            root,
            keep,
            out[: n_keep + 1],
            reasoning_at if reasoning_at is not None and reasoning_at < n_keep else n_keep,
        )
        return out, reasoning_at is not None

    def match(self, messages: list[dict], root: bytes) -> Match:
        hashes, reasoning = self._hashes(root, messages)
        for k in range(len(messages) - 1, 0, -1):
            ids = self.replies.get(hashes[k])
            if ids:
                parent, note = self._choose(ids, messages[k - 1])
                return Match(parent, messages[k:], hashes, k, note, echoed_reasoning=reasoning)
        matched = max((k for k, h in enumerate(hashes) if h in self.known), default=0)
        stale = next(
            (
                self.stale[hashes[k]]
                for k in range(len(messages) - 1, 0, -1)
                if hashes[k] in self.stale
            ),
            None,
        )
        return Match(None, messages, hashes, matched, stale=stale, echoed_reasoning=reasoning)

    def _choose(self, ids: list[str], echoed: dict) -> tuple[Node, str | None]:
        """The call whose reply the harness echoed. Several calls can have returned the same
        visible reply (retries, siblings); the echo's tool-call IDs and reasoning, where it
        carries them, pick the one that returned exactly that; among calls that still tie
        (the same text), the most recently recorded wins."""
        if len(ids) == 1:
            return self.nodes[ids[0]], None
        nodes = [self.nodes[i] for i in ids]
        picked = nodes
        if _tool_call_ids(echoed) and any(_tool_call_ids(echoed)):
            picked = [n for n in picked if _tool_call_ids(n.message) == _tool_call_ids(echoed)]
        if _reasoning(echoed):
            picked = [n for n in picked or nodes if _reasoning(n.message) == _reasoning(echoed)]
        chosen = (picked or nodes)[-1]
        how = (
            "its tool-call IDs or reasoning"
            if 0 < len(picked) < len(nodes) and len(picked) == 1
            else "the most recent of those that fit the echo"
        )
        return chosen, (
            f"{len(nodes)} recorded calls returned this reply; chose {chosen.id} by {how}"
        )

    def place(self, node: Node) -> None:
        """Hold ``node``: its tokens move to the end of the session's log. Its context is one
        slice of the log when its parent's is and ends just where the node starts."""
        if node._log is not None:
            return
        log = self.log
        start = len(log)
        parent = node.parent
        if parent is None:
            base: int | None = start
        elif parent.base is not None and parent._log is log and parent.end == start:
            base = parent.base
        else:
            base = None
        log.extend(node._delta)
        mid = len(log)
        log.extend(node._completion)
        node.start, node.mid, node.end, node.base = start, mid, len(log), base
        node._delta = node._completion = _EMPTY
        node._log = log
        self.nodes[node.id] = node

    def context_ids(self, node: Node) -> array:
        """Prompt + completion of ``node`` (a new array): a slice of the log when its context
        is contiguous there. Otherwise (it continues a call that was not the last one laid
        down: a retry, a branch) the path is walked once and laid down again as one run, so
        the calls that continue it are slices too, while the copies stay within as many
        tokens as the log holds once (at most 4 more bytes per recorded token)."""
        if node._log is not self.log:
            return node.context_ids()
        if node.base is not None:
            return self.log[node.base : node.end]
        ctx = node.context_ids()
        if self.copied + len(ctx) <= len(self.log) - self.copied:
            n_delta, n_done = node.mid - node.start, node.end - node.mid
            base = len(self.log)
            self.log.extend(ctx)
            self.copied += len(ctx)
            node.base, node.end = base, len(self.log)
            node.mid = node.end - n_done
            node.start = node.mid - n_delta
        return ctx

    def add(
        self,
        node: Node,
        request_hashes: list[bytes],
        reply_hash: bytes | None,
        echo_hash: bytes | None = None,
    ) -> list[bytes]:
        """Register a finished call; returns the hashes that were new (to persist).
        ``echo_hash``: another echo of the reply that continues it (the stop string put back)."""
        if echo_hash is not None:
            self.replies.setdefault(echo_hash, []).append(node.id)
            self.known.add(echo_hash)
        self.place(node)
        self.n_calls += 1
        self.requests[request_hashes[-1]] = node.id
        new = [h for h in request_hashes if h not in self.known]
        self.known.update(new)
        for h in new:
            self.prefix_owner[h] = node.id
        if reply_hash is not None:
            self.replies.setdefault(reply_hash, []).append(node.id)
            if reply_hash not in self.known:
                self.known.add(reply_hash)
                new.append(reply_hash)
        return new
