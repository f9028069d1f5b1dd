"""The token-prefix lineage index of engine-rendered capture, against brute force.

Sessions are generated as random call trees over a tiny vocabulary (so prefixes collide and
equal-length candidates abound); every answer of :class:`LineageIndex` is checked against a
plain list comparison over all recorded calls.
"""

from __future__ import annotations

import asyncio
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.gateway.capture.lineage import (
    LineageIndex,
    Node,
    common_prefix,
    extends,
    link,
    new_node,
)
from turnstile.store.records import CallRecord

pytestmark = pytest.mark.unit

tokens = st.lists(st.integers(0, 3), max_size=6)


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[int | None, list[int], list[int]]]:
    """Calls as (parent index or None, prompt delta, completion), in recording order."""
    calls: list[tuple[int | None, list[int], list[int]]] = []
    for _ in range(draw(st.integers(0, 12))):
        parent = draw(st.none() | st.integers(0, len(calls) - 1)) if calls else None
        calls.append((parent, draw(tokens), draw(tokens)))
    return calls


def build(
    calls: list[tuple[int | None, list[int], list[int]]],
) -> tuple[LineageIndex, list[Node], list[list[int]]]:
    idx = LineageIndex()
    nodes: list[Node] = []
    fulls: list[list[int]] = []
    for seq, (p, delta, completion) in enumerate(calls):
        parent = nodes[p] if p is not None else None
        node = new_node(f"c{seq}", parent, array("i", delta), array("i", completion), seq)
        idx.add(node)
        nodes.append(node)
        fulls.append((fulls[p] if p is not None else []) + delta + completion)
    return idx, nodes, fulls


@st.composite
def session_and_prompt(draw: st.DrawFn):
    calls = draw(sessions())
    idx, nodes, fulls = build(calls)
    if fulls and draw(st.booleans()):  # near a recorded conversation: cut, extended, changed
        base = list(draw(st.sampled_from(fulls)))
        base = base[: draw(st.integers(0, len(base)))] if draw(st.booleans()) else base
        base += draw(tokens)
        if base and draw(st.booleans()):
            i = draw(st.integers(0, len(base) - 1))
            base[i] = draw(st.integers(0, 3))
        prompt = base
    else:
        prompt = draw(st.lists(st.integers(0, 3), max_size=20))
    return idx, nodes, fulls, prompt


def is_prefix(a: list[int], b: list[int]) -> bool:
    return b[: len(a)] == a


def ref_common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=400, deadline=None)
@given(session_and_prompt())
def test_parent_is_the_longest_latest_recorded_prefix(case):
    idx, nodes, fulls, prompt = case
    cands = [
        (len(f), n.seq, n) for n, f in zip(nodes, fulls, strict=True) if f and is_prefix(f, prompt)
    ]
    want = max(cands, key=lambda c: (c[0], c[1]))[2] if cands else None
    assert idx.parent_of(array("i", prompt)) is want


@settings(max_examples=400, deadline=None)
@given(session_and_prompt())
def test_extends_is_a_prefix_test(case):
    _, nodes, fulls, prompt = case
    for node, full in zip(nodes, fulls, strict=True):
        assert node.full().tolist() == full and node.full_len == len(full)
        assert extends(node, array("i", prompt)) == is_prefix(full, prompt)


@settings(max_examples=400, deadline=None)
@given(session_and_prompt())
def test_closest_is_the_leaf_sharing_the_longest_prefix(case):
    idx, nodes, fulls, prompt = case
    parents = {n.parent.id for n in nodes if n.parent is not None}
    leaves = [
        (ref_common(f, prompt), n.seq, n)
        for n, f in zip(nodes, fulls, strict=True)
        if n.id not in parents
    ]
    got = idx.closest(array("i", prompt))
    if not leaves:
        assert got is None
        return
    common, _, node = max(leaves, key=lambda c: (c[0], c[1]))
    assert got == (node, common)
    assert common_prefix(array("i", prompt), node.full()) == common


@settings(max_examples=100, deadline=None)
@given(sessions(), st.lists(st.booleans(), max_size=12))
def test_an_index_rebuilt_from_records_is_the_same(calls, failed):
    """After a restart: failed calls are skipped but still count for the next seq."""
    idx, nodes, _ = build(calls)
    records, kept = [], LineageIndex()
    kept_nodes: dict[str, Node] = {}
    for seq, (node, (p, delta, completion)) in enumerate(zip(nodes, calls, strict=True)):
        ok = not (seq < len(failed) and failed[seq])
        parent_ok = p is None or f"c{p}" in kept_nodes
        status = "ok" if ok and parent_ok else "error"
        records.append(
            CallRecord(
                id=node.id,
                session_id="s",
                seq=seq,
                parent_id=f"c{p}" if p is not None else None,
                segment_reason=None,
                reused_prefix_len=0,
                prompt_delta=array("i", delta),
                completion_ids=array("i", completion),
                completion_logprobs=array("f"),
                finish_reason="stop",
                stop_token_id=None,
                seam=None,
                status=status,
            )
        )
        if status == "ok":
            kept_nodes[node.id] = node
            kept.add(node)
    rebuilt = LineageIndex.from_calls(records)
    assert rebuilt.n_calls == len(calls)
    assert set(rebuilt.nodes) == set(kept.nodes) and set(rebuilt.leaves) == set(kept.leaves)
    for cid, node in rebuilt.nodes.items():
        assert (node.full_len, node.digest) == (kept.nodes[cid].full_len, kept.nodes[cid].digest)


async def _text(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def _chain() -> LineageIndex:
    """c0: prompt [1 2] + completion [3 4]; c1 (its child): + [5] + completion [6 7]."""
    idx = LineageIndex()
    c0 = new_node("c0", None, array("i", [1, 2]), array("i", [3, 4]), 0)
    idx.add(c0)
    idx.add(new_node("c1", c0, array("i", [5]), array("i", [6, 7]), 1))
    idx.replies[b"after-c1"] = "c1"
    idx.known.update({b"r": "c0", b"u": "c0", b"x": "c1", b"after-c1": "c1"})
    idx.n_calls = 2
    return idx


def test_link_names_why_a_call_starts_a_new_segment():
    user = {"role": "user", "content": "q"}
    reply = {"role": "assistant", "content": "a"}

    async def go(idx: LineageIndex, msgs: list[dict], hashes: list[bytes], prompt: list[int]):
        return await link(idx, msgs, hashes, array("i", prompt), _text)

    first = asyncio.run(go(LineageIndex(), [user], [b"r", b"u"], [1, 2]))
    assert first.reason == "first_call" and first.parent is None
    child = asyncio.run(
        go(_chain(), [user, reply, user], [b"r", b"u", b"x", b"y"], [1, 2, 3, 4, 5, 6, 7, 8])
    )
    assert child.parent.id == "c1" and child.reason is None and child.delta.tolist() == [8]
    # the messages continue c1, but the engine re-tokenized its completion: [6 9], not [6 7]
    drift = asyncio.run(
        go(_chain(), [user, reply, user], [b"r", b"u", b"after-c1", b"y"], [1, 2, 3, 4, 5, 6, 9, 8])
    )
    assert drift.reason == "drift" and drift.parent is None
    d = drift.drift
    assert (d["call_id"], d["index"], d["at_call_id"], d["region"], d["offset"]) == (
        "c1",
        6,
        "c1",
        "completion",
        1,
    )
    assert (
        d["recorded"]["ids"] == [1, 2, 3, 4, 5, 6, 7]
        and d["received"]["text_from_index"] == "<9><8>"
    )
    assert "prompt token 6 is the first that differs" in drift.detail
    # another first message (a title request, a sub-agent): a new lineage
    other = asyncio.run(go(_chain(), [user], [b"r", b"v"], [1, 9]))
    assert other.reason == "new_conversation" and "new lineage" in other.detail
    # the first message edited, the assistant turns kept: a rewrite, not a new conversation
    edited = asyncio.run(go(_chain(), [user, reply, user], [b"r", b"v", b"w", b"y"], [1, 9]))
    assert (edited.reason, edited.lineage) == ("history_diverged", "c0")
    # a recorded conversation's first message, then other turns: its history rewritten
    assert (
        asyncio.run(go(_chain(), [user, reply, user], [b"r", b"u", b"z", b"y"], [1, 9])).reason
        == "history_diverged"
    )


def test_lineage_labels_follow_arrival_not_completion():
    """The title request arrived first: the agent's first call is a new lineage whether
    the title call is still running (nothing recorded) or done, never ``first_call``."""
    agent = [{"role": "system", "content": "agent"}]

    async def go(idx: LineageIndex, hashes: list[bytes], prompt: list[int]):
        return await link(idx, agent, hashes, array("i", prompt), _text)

    running = LineageIndex(first_request=b"title")
    assert asyncio.run(go(running, [b"r", b"a"], [1, 2])).reason == "new_conversation"
    done = LineageIndex(first_request=b"title")
    done.add(new_node("t", None, array("i", [1, 5]), array("i", [6]), 0))
    done.known.update({b"r": "t", b"title": "t"})
    assert asyncio.run(go(done, [b"r", b"a"], [1, 2])).reason == "new_conversation"
    # the first arrival itself, and a retry of it while nothing is recorded
    assert asyncio.run(go(LineageIndex(first_request=b"a"), [b"r", b"a"], [1])).reason == (
        "first_call"
    )
    # rebuilt from the store after a restart: the arrival order is gone, the records decide
    rebuilt = LineageIndex()
    rebuilt.add(new_node("t", None, array("i", [1, 5]), array("i", [6]), 0))
    assert asyncio.run(go(rebuilt, [b"r", b"a"], [1, 2])).reason == "new_conversation"
