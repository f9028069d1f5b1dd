"""The per-session fast paths of ``chat.history`` against the full re-walk.

A session tree keeps the previous request (to hash only the messages a request adds) and a
log of every call's tokens (to assemble a prompt as one slice). Both are caches: on any
sequence of requests - resends with new messages, edits of earlier messages (including the
``1`` / ``1.0`` / ``true`` confusions that ``==`` does not see), truncations, retries, branches
from earlier calls, and a caller that mutates the messages it sent - they must give what the
uncached computation gives: the module's ``prefix_hashes`` over the whole request, a tree that
never saw an earlier request, and the concatenation of the tokens each call recorded (kept
here, independently of the tree)."""

from __future__ import annotations

import copy
import json
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.chat.history import Node, SessionTree
from turnstile.chat.history_hash import prefix_hashes, root_hash
from turnstile.chat.policy import has_reasoning

pytestmark = pytest.mark.unit

TEXTS = st.sampled_from(["", "hi", "ok", "a b", "日本", "\n", "42"])
SCALARS = st.sampled_from([1, 1.0, True, 0, 0.0, False, None, "1", "x"])


@st.composite
def message(
    draw: st.DrawFn, kinds: tuple[str, ...] = ("user", "system", "tool", "assistant", "odd")
) -> dict:
    kind = draw(st.sampled_from(kinds))
    if kind == "assistant":
        m: dict = {"role": "assistant", "content": draw(st.one_of(TEXTS, st.none()))}
        if draw(st.booleans()):
            args = draw(st.dictionaries(st.sampled_from(["x", "y"]), SCALARS, max_size=2))
            m["tool_calls"] = [
                {
                    "id": "call_0",
                    "type": "function",
                    "index": 0,
                    "function": {
                        "name": "get",
                        "arguments": (json.dumps(args) if draw(st.booleans()) else args),
                    },
                }
            ]
        if draw(st.booleans()):
            m["reasoning_content"] = draw(TEXTS)
        return m
    if kind == "odd":  # fields the key reads, holding numbers and booleans
        return {
            "role": "user",
            "name": draw(SCALARS),
            "content": draw(
                st.one_of(
                    TEXTS,
                    st.lists(
                        st.fixed_dictionaries({"type": st.just("image_url"), "detail": SCALARS}),
                        max_size=2,
                    ),
                )
            ),
        }
    m = {"role": kind, "content": draw(TEXTS)}
    if kind == "tool":
        m["tool_call_id"] = "call_0"
    return m


def _retype(v: object) -> object:
    """An equal (``==``) value of another JSON type, where there is one."""
    swaps = {1: 1.0, 0: 0.0}
    if type(v) is bool:
        return int(v)
    if type(v) in (int, float) and v in swaps:
        return True if v == 1 and type(v) is float else swaps.get(v, v)  # type: ignore[call-overload]
    if isinstance(v, dict):
        return {k: _retype(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_retype(x) for x in v]
    return v


def next_request(draw: st.DrawFn, calls: list[tuple[list[dict], dict]]) -> list[dict]:
    """A request made from the recorded calls: the last one continued (its reply echoed), an
    earlier one continued (a branch) or resent (a retry), with an edit, a retyped value or a
    truncation on the way, and new messages."""
    if not calls:
        return draw(st.lists(message(), min_size=1, max_size=4))
    req, reply = calls[-1] if draw(st.booleans()) else draw(st.sampled_from(calls))
    base = copy.deepcopy([*req, reply] if draw(st.integers(0, 3)) else req)
    op = draw(
        st.sampled_from(["extend", "extend", "extend", "retry", "edit", "retype", "truncate"])
    )
    if op == "edit":
        base[draw(st.integers(0, len(base) - 1))] = draw(message())
    elif op == "retype":
        i = draw(st.integers(0, len(base) - 1))
        base[i] = _retype(base[i])  # type: ignore[assignment]
    elif op == "truncate" and len(base) > 1:
        base = base[: draw(st.integers(1, len(base) - 1))]
    if op != "retry":
        base += draw(st.lists(message(), min_size=1, max_size=3))
    return base


def _reference(tree: SessionTree, msgs: list[dict], root: bytes) -> object:
    """The same tree's answer without its previous request or its chain cache."""
    last, seen = tree._last, dict(tree._seen)
    tree._last = None
    tree._seen.clear()
    try:
        return tree.match(msgs, root)
    finally:
        tree._last, tree._seen = last, seen


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 10), st.booleans(), st.data())
def test_fast_path_agrees_with_the_full_walk(
    n_calls: int, mutate: bool, data: st.DataObject
) -> None:
    tree = SessionTree()
    root = root_hash(None, None)
    calls: list[tuple[list[dict], dict]] = []
    for n in range(n_calls):
        msgs = next_request(data.draw, calls)
        sent = copy.deepcopy(msgs)
        want = prefix_hashes(root, msgs)
        ref = _reference(tree, msgs, root)
        got = tree.match(msgs, root)
        assert got.hashes == want
        assert (
            got.parent and got.parent.id,
            got.matched,
            got.new_messages,
            got.note,
            got.stale,
        ) == (
            ref.parent and ref.parent.id,
            ref.matched,  # type: ignore
            ref.new_messages,
            ref.note,
            ref.stale,
        )  # type: ignore
        assert got.echoed_reasoning == has_reasoning(msgs)
        reply = data.draw(message(("assistant",)))
        node = Node(f"c{n}", got.parent, array("i", [n]), array("i", [n, n]), reply, None)
        tree.add(node, got.hashes, prefix_hashes(want[-1], [reply])[1])
        calls.append((sent, reply))
        if mutate:  # a caller that edits, in place, the messages it sent, and sends them
            for m in msgs:
                if isinstance(m.get("content"), str):
                    m["content"] += "!"
            assert tree.prefix_hashes(root, msgs) == prefix_hashes(root, msgs)


def _ctx(calls: dict[str, tuple[str | None, list[int], list[int]]], cid: str) -> list[int]:
    parent, delta, done = calls[cid]
    return (_ctx(calls, parent) if parent else []) + delta + done


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-1, 30),
            st.lists(st.integers(0, 9), max_size=4),
            st.lists(st.integers(0, 9), max_size=3),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_context_slices_equal_the_recorded_tokens(steps: list[tuple]) -> None:
    """Calls continue the last one, an earlier one (retries, branches) or start anew; every
    call's context from the log equals its path's recorded tokens, and the log holds at most
    twice the tokens recorded."""
    tree = SessionTree()
    calls: dict[str, tuple[str | None, list[int], list[int]]] = {}
    order: list[str] = []
    for i, (pick, delta, done) in enumerate(steps):
        parent = None
        if order and pick >= 0:
            parent = order[-1] if pick == 0 else order[pick % len(order)]
        if parent is not None:  # a prompt is built on the parent first, as the gateway does
            assert tree.context_ids(tree.nodes[parent]).tolist() == _ctx(calls, parent)
        cid = f"c{i}"
        calls[cid] = (parent, delta, done)
        order.append(cid)
        tree.place(
            Node(
                cid,
                tree.nodes[parent] if parent else None,
                array("i", delta),
                array("i", done),
                None,
                None,
            )
        )
        recorded = sum(len(d) + len(c) for _, d, c in calls.values())
        assert len(tree.log) <= 2 * recorded
    for cid in order:
        node = tree.nodes[cid]
        assert tree.context_ids(node).tolist() == _ctx(calls, cid)
        assert node.context_ids().tolist() == _ctx(calls, cid)
        assert (node.prompt_delta.tolist(), node.completion_ids.tolist()) == calls[cid][1:]


def test_a_long_linear_session_lays_every_context_down_once() -> None:
    """The common case: each call continues the last; the log is every token once, and each
    context is one slice of it."""
    tree = SessionTree()
    parent = None
    for i in range(50):
        node = Node(f"c{i}", parent, array("i", [i] * 3), array("i", [i]), None, None)
        tree.place(node)
        assert node.base == 0
        parent = node
    assert len(tree.log) == 200 and tree.copied == 0


def test_interleaved_branches_stay_within_twice_the_tokens() -> None:
    """Two agents taking turns in one session: each call continues a call that was not the
    last one laid down, so each context would be copied again; the copies stop at the budget
    (the walk takes over) and every context is still exact."""
    tree = SessionTree()
    calls: dict[str, tuple[str | None, list[int], list[int]]] = {}
    tips: list[str | None] = [None, None]
    for i in range(80):
        parent = tips[i % 2]
        if parent is not None:
            assert tree.context_ids(tree.nodes[parent]).tolist() == _ctx(calls, parent)
        cid = f"c{i}"
        calls[cid] = (parent, [i] * 5, [i])
        tree.place(
            Node(
                cid,
                tree.nodes[parent] if parent else None,
                array("i", [i] * 5),
                array("i", [i]),
                None,
                None,
            )
        )
        tips[i % 2] = cid
        assert len(tree.log) <= 2 * sum(len(d) + len(c) for _, d, c in calls.values())
