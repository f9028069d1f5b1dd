"""The call trees of recent sessions: kept in memory, least recently used first, and rebuilt
from the store when one is needed again (after a restart, an eviction or a close)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ...chat.history import Node, SessionTree
from ...chat.render import Renderer
from ...store.store import Store


@dataclass
class Tree(SessionTree):
    """A session's tree with the creation time of the session it was built for: a call that
    began in it is recorded only into that incarnation of the id."""

    created: float | None = None
    next_seq: int = 0  # the ``seq`` of the session's next call record
    # the distinct images (sha256) the session's calls sent, over all its branches: what
    # serve --max-images-per-session bounds (a screenshot re-sent every turn counts once)
    image_hashes: set[str] = field(default_factory=set)

    def take_seq(self) -> int:
        """A call record's ``seq``, taken when the record is built: calls of one session that
        end together (their commits all still queued) get distinct, increasing ones. (A call
        the store then refuses leaves a gap; ``seq`` orders, it does not count.)"""
        seq = self.next_seq
        self.next_seq += 1
        return seq


@dataclass
class Entry:
    """A cached call tree: the session incarnation it belongs to, and its running calls."""

    tree: Tree
    created: float | None
    busy: int = 0
    evict: bool = False  # closed while a call ran: dropped when the last one ends


class SessionTrees:
    """Which session's tree is in memory, which is busy, and which to drop."""

    def __init__(
        self, store: Store, renderer: Renderer, max_trees: int = 1024, shared: bool = False
    ):
        """``shared``: other processes record calls into this store too (turnstile.app.ray's
        replicas, a PostgreSQL store): a cached tree is checked against the store's call
        count before each use."""
        self.store = store
        self.renderer = renderer
        self.max_trees = max_trees
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.shared = shared

    def drop(self, session_id: str) -> None:
        """Forget a deleted session's tree (a reused id starts empty)."""
        self.entries.pop(session_id, None)

    def closed(self, session_id: str) -> None:
        """A closed session takes no more calls: free its tree (now, or when its last running
        call ends). It is rebuilt from the store if it is ever read again."""
        entry = self.entries.get(session_id)
        if entry is not None:
            if entry.busy:
                entry.evict = True
            else:
                del self.entries[session_id]

    def hold(self, session_id: str) -> Entry:
        """The session's entry, counted busy until :meth:`release` (a busy tree stays)."""
        self.get(session_id)
        entry = self.entries[session_id]
        entry.busy += 1
        return entry

    def release(self, session_id: str, entry: Entry) -> None:
        entry.busy -= 1
        if entry.busy <= 0 and entry.evict and self.entries.get(session_id) is entry:
            del self.entries[session_id]
        self._trim()

    def _trim(self) -> None:
        """Keep at most ``max_trees`` cached trees, dropping the least recently used idle
        ones (a tree with a running call stays: its call adds to it when it commits)."""
        over = len(self.entries) - self.max_trees
        if over <= 0:
            return
        newest = next(reversed(self.entries))  # just fetched: its call is about to hold it
        idle = []
        for sid, e in self.entries.items():  # oldest first; stops at the first ``over`` idle
            if not e.busy and sid != newest:
                idle.append(sid)
                if len(idle) == over:
                    break
        for sid in idle:
            del self.entries[sid]

    def _with_images(self, node: Node, session_id: str, media: tuple) -> None:
        node.media = media
        for m in media:
            got = self.store.image(session_id, m.sha256)
            if got is not None:
                node.images[m.sha256] = got
        expander = self.renderer.images
        node.media_placeholder = expander.placeholder_id if expander is not None else -1

    def get(self, session_id: str) -> Tree:
        """The session's call tree, rebuilt from the store the first time after a restart.
        Calls rendered under another template/tokenizer fingerprint stay in the tree but are
        never extended: their tokens are not what this renderer would produce."""
        entry = self.entries.get(session_id)
        if (
            entry is not None
            and self.shared
            and not entry.busy
            and self.store.call_count(session_id) != entry.tree.n_calls
        ):
            del self.entries[session_id]  # recorded elsewhere meanwhile: rebuild it
            entry = None
        if entry is not None:
            self.entries.move_to_end(session_id)
            return entry.tree
        created = self.store.session_created(session_id)
        tree = Tree(content_format=self.renderer.template.content_format, created=created)
        for c in self.store.calls(session_id):
            parent = tree.nodes.get(c.parent_id) if c.parent_id else None
            node = Node(c.id, parent, c.prompt_delta, c.completion_ids, c.message, c.stop_token_id)
            if c.media:  # its images go on with the calls that extend it (bytes: blobs)
                self._with_images(node, session_id, c.media)
                tree.image_hashes.update(m.sha256 for m in c.media)
            tree.place(node)
            tree.n_calls += 1
            tree.next_seq = max(tree.next_seq, c.seq + 1)
            tree.known.update(c.prefix_hashes)
            for h in c.prefix_hashes:
                tree.prefix_owner.setdefault(h, c.id)
            if c.status == "ok" and c.history_hash is not None:
                if c.info.get("fingerprint") == self.renderer.fingerprint:
                    tree.replies.setdefault(c.history_hash, []).append(c.id)
                    if c.info.get("stop_echo_hash"):
                        echo = bytes.fromhex(c.info["stop_echo_hash"])
                        tree.replies.setdefault(echo, []).append(c.id)
                        tree.known.add(echo)
                else:
                    tree.stale[c.history_hash] = c.id
        self.entries[session_id] = Entry(tree, created)
        self._trim()
        return tree
