"""History matching (``chat.history``) against a brute-force reference.

A session records calls (request messages + the reply it returned); a new request must continue
the recorded call whose request + reply is the longest prefix of it, where "the same message"
ignores only what harnesses are known to change when they echo a message back (null vs ""
content, re-serialised arguments, renamed call IDs, dropped reasoning). The reference below
compares messages field by field, written from that rule and not from ``message_key``;
hypothesis builds the sessions and the requests, including echoes that differ in exactly one
field that matters."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.chat.history import Node, SessionTree
from turnstile.chat.history_hash import prefix_hashes, root_hash

pytestmark = pytest.mark.unit

TEXTS = st.sampled_from(["", "hi", "ok", "a b", "日本", "\n", "42"])
NAMES = st.sampled_from(["get", "put"])


def _args() -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 3), max_size=2)


@st.composite
def assistant(draw: st.DrawFn) -> dict:
    m: dict = {"role": "assistant", "content": draw(TEXTS)}
    calls = draw(st.lists(st.tuples(NAMES, _args()), max_size=2))
    if calls:
        m["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a)},
            }
            for i, (n, a) in enumerate(calls)
        ]
    if draw(st.booleans()):
        m["reasoning_content"] = draw(TEXTS)
    return m


def other() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda t: {"role": "user", "content": t}, TEXTS),
        st.builds(lambda t: {"role": "system", "content": t}, TEXTS),
        st.builds(
            lambda t, i: {"role": "tool", "content": t, "tool_call_id": f"call_{i}"},
            TEXTS,
            st.integers(0, 1),
        ),
    )


def _canon_args(a: object) -> object:
    if isinstance(a, str):
        try:
            return json.loads(a)
        except ValueError:
            return a
    return a


def same(a: dict, b: dict) -> bool:
    """The reference: equal role, content (None == ""), name, and for assistant turns the
    called functions with their parsed arguments; call IDs and reasoning do not count."""
    if a.get("role") != b.get("role") or a.get("name") != b.get("name"):
        return False
    if (a.get("content") or "") != (b.get("content") or ""):
        return False
    if a.get("role") == "assistant":
        calls = [
            [
                (c["function"]["name"], _canon_args(c["function"]["arguments"]))
                for c in m.get("tool_calls") or ()
            ]
            for m in (a, b)
        ]
        return calls[0] == calls[1]
    return True


def echo(m: dict, draw: st.DrawFn) -> dict:
    """How a harness may send a recorded reply back: every change here must still match."""
    e = dict(m)
    if not e.get("content") and draw(st.booleans()):
        e["content"] = None
    if "reasoning_content" in e and draw(st.booleans()):
        del e["reasoning_content"]
    if e.get("tool_calls"):
        e["tool_calls"] = [
            {
                **c,
                "id": f"renamed_{i}" if draw(st.booleans()) else c["id"],
                "function": {
                    **c["function"],
                    "arguments": json.dumps(
                        json.loads(c["function"]["arguments"]),
                        indent=draw(st.sampled_from([None, 1])),
                        sort_keys=draw(st.booleans()),
                    ),
                },
            }
            for i, c in enumerate(e["tool_calls"])
        ]
    return e


@st.composite
def session(draw: st.DrawFn) -> tuple[list[tuple[list[dict], dict]], list[dict]]:
    """Recorded calls (each continuing an earlier one or starting anew) and a new request."""
    calls: list[tuple[list[dict], dict]] = []
    for _ in range(draw(st.integers(1, 6))):
        if calls and draw(st.booleans()):
            req, reply = draw(st.sampled_from(calls))
            base = [*req, echo(reply, draw)]
        else:
            base = []
        new = draw(st.lists(other(), min_size=1, max_size=3))
        calls.append(([*base, *new], draw(assistant())))
    req, reply = draw(st.sampled_from(calls))
    cut = draw(st.integers(0, len(req)))
    request = [*req[:cut]]
    if cut == len(req):
        request.append(echo(reply, draw) if draw(st.booleans()) else draw(assistant()))
    request += draw(st.lists(other(), min_size=1, max_size=3))
    return calls, request


def _record(tree: SessionTree, root: bytes, calls: list[tuple[list[dict], dict]]) -> list[str]:
    ids = []
    for n, (req, reply) in enumerate(calls):
        m = tree.match(req, root)
        node = Node(f"c{n}", m.parent, array("i"), array("i"), reply, None)
        hashes = tree.prefix_hashes(root, req)
        tree.add(node, hashes, prefix_hashes(hashes[-1], [reply], tree.content_format)[1])
        ids.append(node.id)
    return ids


def _continues(request: list[dict], req: list[dict], reply: dict) -> bool:
    full = [*req, reply]
    return len(full) < len(request) and all(same(a, b) for a, b in zip(full, request, strict=False))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session())
def test_match_is_the_longest_recorded_reply_prefix(case: tuple) -> None:
    calls, request = case
    tree = SessionTree()
    root = root_hash(None, None)
    ids = _record(tree, root, calls)
    m = tree.match(request, root)
    fits = [
        (len(req) + 1, i) for i, (req, reply) in enumerate(calls) if _continues(request, req, reply)
    ]
    if not fits:
        assert m.parent is None
        assert m.new_messages == request
        return
    k = max(f[0] for f in fits)
    assert m.parent is not None, (k, request)
    assert m.matched == k, (k, request, calls)
    assert m.new_messages == request[k:]
    # the chosen call is one of those that fit at that length
    assert m.parent.id in {ids[i] for n, i in fits if n == k}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(other(), assistant()), max_size=8), st.data())
def test_cached_chain_equals_the_plain_chain(messages: list[dict], data: st.DataObject) -> None:
    """The per-session cache of chain hashes never changes a hash: the same messages (and
    echoes of them) hash as the uncached function does, call after call."""
    tree = SessionTree()
    root = root_hash([{"type": "function", "function": {"name": "get"}}], None)
    for _ in range(3):
        msgs = [echo(m, data.draw) if m["role"] == "assistant" else m for m in messages]
        assert tree.prefix_hashes(root, msgs) == prefix_hashes(root, msgs)


@given(st.lists(other(), min_size=1, max_size=4), st.lists(other(), min_size=1, max_size=4))
def test_hash_equality_is_message_sameness(a: list[dict], b: list[dict]) -> None:
    """Two message lists hash alike exactly when the reference calls them the same."""
    root = root_hash(None, None)
    equal = len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    assert (prefix_hashes(root, a)[-1] == prefix_hashes(root, b)[-1]) == equal


def test_tools_and_template_kwargs_start_another_chain() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    a = prefix_hashes(root_hash(None, None), msgs)[-1]
    b = prefix_hashes(root_hash([{"type": "function", "function": {"name": "f"}}], None), msgs)[-1]
    c = prefix_hashes(root_hash(None, {"enable_thinking": False}), msgs)[-1]
    assert len({a, b, c}) == 3
