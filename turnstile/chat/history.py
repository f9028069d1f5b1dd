"""Which recorded call does a request continue?

Each request's messages are hashed as a chain (tools first, then one message at a time), after
normalising away the ways harnesses echo an assistant message back: ``content`` ``null`` vs
``""``, tool-call arguments re-serialised, reasoning dropped, tool-call ids renamed. A recorded
call is registered under the chain hash of *its request + the reply we returned*; a new request
continues the call whose hash equals one of its own prefix hashes (the longest wins), and its
remaining messages are the ones to render as a delta.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field

import orjson

from .content import text_parts


def _content_key(content: object, content_format: str) -> object:
    """Content as the template will see it (``chat.content``): text parts joined with
    ``"\n"`` for a string template, the list of texts for one that reads parts. Two messages
    with the same key render the same."""
    if isinstance(content, list) and not all(
            isinstance(p, dict) and p.get("type") == "text" for p in content):
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()
    if content is not None and not isinstance(content, (str, list)):
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()
    texts = text_parts(content)
    return "\n".join(texts) if content_format == "string" else texts


def _arguments(args: object) -> object:
    if isinstance(args, str):
        try:
            return orjson.loads(args)
        except orjson.JSONDecodeError:
            return args
    return args


def message_key(m: dict, content_format: str = "string") -> bytes:
    """The parts of a message that must match for it to be 'the same message'."""
    role = m.get("role")
    key: list = [role, _content_key(m.get("content"), content_format), m.get("name")]
    if role == "assistant":
        key.append([
            [(c.get("function") or {}).get("name"), _arguments((c.get("function") or {})
                                                               .get("arguments"))]
            for c in m.get("tool_calls") or ()
        ])
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)


def _chain(prev: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(prev + data, digest_size=8).digest()


def root_hash(tools: list[dict] | None, template_kwargs: dict | None) -> bytes:
    seed = orjson.dumps([tools or [], template_kwargs or {}], option=orjson.OPT_SORT_KEYS)
    return _chain(b"", seed)


def prefix_hashes(root: bytes, messages: list[dict], content_format: str = "string"
                  ) -> list[bytes]:
    """``out[k]`` identifies ``messages[:k]`` (``out[0]`` is the root)."""
    out = [root]
    for m in messages:
        out.append(_chain(out[-1], message_key(m, content_format)))
    return out


@dataclass
class Node:
    """What the tree keeps in memory per call: its tokens, as compact int32 arrays."""

    id: str
    parent: Node | None
    prompt_delta: array
    completion_ids: array
    message: dict | None
    stop_token_id: int | None

    def has_reasoning(self) -> bool:
        """Whether any reply on this path carried reasoning (templates treat it specially)."""
        node: Node | None = self
        while node is not None:
            if node.message and node.message.get("reasoning_content"):
                return True
            node = node.parent
        return False

    def context_ids(self) -> array:
        """Prompt + completion of this call: the prefix a child call reuses."""
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


@dataclass
class SessionTree:
    """The calls of one session, indexed by the conversations they answered."""

    nodes: dict[str, Node] = field(default_factory=dict)
    replies: dict[bytes, str] = field(default_factory=dict)  # request+reply hash -> call id
    known: set[bytes] = field(default_factory=set)  # every conversation prefix seen
    n_calls: int = 0
    content_format: str = "string"  # how the template reads content (``chat.content``)
    # Chain hash after a message already seen in this session, keyed by the hash before it and
    # the message's JSON (length + keyed 64-bit hash, not the bytes): harnesses resend the whole
    # history on every call, and normalising + hashing every old message again made matching
    # cost grow with the context. A message that serialises differently is simply hashed again.
    _seen: dict[tuple[bytes, int, int], bytes] = field(default_factory=dict, repr=False)

    def prefix_hashes(self, root: bytes, messages: list[dict]) -> list[bytes]:
        """``prefix_hashes(root, messages)``, reusing the chain of messages seen before."""
        out = [root]
        prev = root
        seen = self._seen
        for m in messages:
            try:
                raw = orjson.dumps(m)
            except orjson.JSONEncodeError:
                key = None
                nxt = None
            else:
                key = (prev, len(raw), hash(raw))
                nxt = seen.get(key)
            if nxt is None:
                nxt = _chain(prev, message_key(m, self.content_format))
                if key is not None:
                    seen[key] = nxt
            out.append(nxt)
            prev = nxt
        return out

    def match(self, messages: list[dict], root: bytes) -> Match:
        hashes = self.prefix_hashes(root, messages)
        for k in range(len(messages) - 1, 0, -1):
            call_id = self.replies.get(hashes[k])
            if call_id is not None:
                return Match(self.nodes[call_id], messages[k:], hashes, k)
        matched = max((k for k, h in enumerate(hashes) if h in self.known), default=0)
        return Match(None, messages, hashes, matched)

    def add(self, node: Node, request_hashes: list[bytes], reply_hash: bytes | None) -> list[bytes]:
        """Register a finished call; returns the hashes that were new (to persist)."""
        self.nodes[node.id] = node
        self.n_calls += 1
        new = [h for h in request_hashes if h not in self.known]
        self.known.update(new)
        if reply_hash is not None:
            self.replies[reply_hash] = node.id
            if reply_hash not in self.known:
                self.known.add(reply_hash)
                new.append(reply_hash)
        return new
