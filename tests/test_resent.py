"""A session's resent body parsed only where it is new (server/resent.py): checked against
``orjson.loads`` of the same bytes, on generated histories written by the serializers harnesses
use (compact, Python's default with spaces and ASCII escapes, indented) and generated edits:
appends, changed elements, changed members before and after the list, names given twice, bytes
that are not JSON."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.errors import APIError
from turnstile.server.resent import WALK_MAX, ResentBodies

pytestmark = pytest.mark.unit

text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('"\\\n\t/{}[],:'),
    max_size=12,
)
scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text
value = st.recursive(
    scalar | st.floats(allow_nan=False, allow_infinity=False),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
    max_leaves=8,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": text},
    optional={"tool_calls": st.lists(st.dictionaries(text, value, max_size=2), max_size=2)},
)
element = message | value

WRITERS = {
    "orjson": orjson.dumps,
    "python": lambda v: json.dumps(v).encode(),
    "python-compact": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode(),
    "indented": lambda v: json.dumps(v, indent=2).encode(),
}


@st.composite
def conversation(draw):
    """A first body, then edits of it: each body as the harness would send it."""
    field = draw(st.sampled_from(["messages", "input"]))
    lead = draw(st.dictionaries(st.sampled_from(["model", "a", "b"]), value, max_size=2))
    trail = draw(st.dictionaries(st.sampled_from(["tools", "stream", "z"]), value, max_size=3))
    history = draw(st.lists(element, max_size=4))
    write = WRITERS[draw(st.sampled_from(sorted(WRITERS)))]
    bodies = []
    for _ in range(draw(st.integers(1, 6))):
        lead.pop(field, None)
        trail.pop(field, None)
        obj = {**lead, field: history, **trail}
        bodies.append((obj, write(obj)))
        edit = draw(
            st.sampled_from(
                ["append", "append", "append", "change", "cut", "trail", "lead", "same"]
            )
        )
        if edit == "append":
            history = history + draw(st.lists(element, min_size=1, max_size=3))
        elif edit == "change" and history:
            i = draw(st.integers(0, len(history) - 1))
            history = [*history[:i], draw(element), *history[i + 1 :]]
        elif edit == "cut":
            history = history[: draw(st.integers(0, len(history)))]
        elif edit == "trail":
            trail = {**trail, draw(st.sampled_from(["tools", "z", "y"])): draw(value)}
        elif edit == "lead":
            lead = {**lead, draw(st.sampled_from(["model", "a"])): draw(value)}
    return field, bodies


def same_as_orjson(bodies: ResentBodies, field: str, raw: bytes) -> None:
    try:
        want = orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(APIError) as err:
            bodies.parse("s", field, raw)
        assert err.value.status == 400
        return
    got = bodies.parse("s", field, raw)
    assert got == want
    if isinstance(want, dict):
        assert list(got) == list(want)  # the members in the sender's order


@settings(max_examples=400, deadline=None)
@given(conversation())
def test_every_body_parses_as_orjson_does(conv):
    field, bodies_sent = conv
    bodies = ResentBodies(min_bytes=0)
    for _, raw in bodies_sent:
        same_as_orjson(bodies, field, raw)


@settings(max_examples=300, deadline=None)
@given(conversation(), st.data())
def test_bytes_changed_anywhere_parse_as_orjson_does(conv, data):
    """Any edit of the bytes (not only edits a harness makes): a byte changed, dropped or
    inserted, a member named twice, a trailing comma."""
    field, bodies_sent = conv
    bodies = ResentBodies(min_bytes=0)
    for obj, raw in bodies_sent:
        same_as_orjson(bodies, field, raw)
        i = data.draw(st.integers(0, len(raw)))
        kind = data.draw(st.sampled_from(["byte", "drop", "insert", "twice", "comma", "comma-end"]))
        if kind == "byte" and i < len(raw):
            bad = raw[:i] + bytes([data.draw(st.sampled_from(b'",]}{[ 0a\\'))]) + raw[i + 1 :]
        elif kind == "drop":
            bad = raw[:i] + raw[i + 1 :]
        elif kind == "insert":
            bad = raw[:i] + data.draw(st.sampled_from([b",", b"]", b'"', b" ", b",{}"])) + raw[i:]
        elif kind == "twice" and raw.rstrip().endswith(b"}"):
            end = raw.rstrip().rindex(b"}")
            name = data.draw(st.sampled_from([field, "model", "tools"]))
            again = orjson.dumps(data.draw(st.sampled_from([[], [1], "x", {"role": "user"}])))
            bad = raw[:end] + b',"' + name.encode() + b'":' + again + raw[end:]
        elif kind == "comma-end":  # the list the last member, then ",}"
            names = list(obj)
            bad = orjson.dumps({k: obj[k] for k in names[: names.index(field) + 1]})
            bad = bad[:-1] + b",}"
        else:
            bad = raw.replace(b"]", b",]", 1)
        same_as_orjson(bodies, field, bad)


def test_appended_histories_reuse_what_was_parsed():
    """The shortcut is taken where it should be (else the tests above test orjson alone):
    a history that grows by appends reuses every earlier element, whichever writer."""
    for name, write in WRITERS.items():
        bodies = ResentBodies(min_bytes=0)
        # three quotes in the text: an odd count, so an escape misread shows
        history: list = [{"role": "system", "content": 'say "hi, \\" or "bye:\n'}]
        for turn in range(6):
            history = [*history, {"role": "user", "content": f"q{turn} ü"}, {"role": "x"}]
            body = {"model": "m", "messages": history, "tools": [{"x": [1, 2.5]}], "n": turn}
            before = bodies.reused
            assert bodies.parse("s", "messages", write(body)) == body
            if turn:
                assert bodies.reused - before == len(history) - 2, name


def test_elements_are_shared_and_bodies_are_not():
    """The reused elements are the same objects as the last parse's; the body and its list
    are new each call (a caller may change those)."""
    bodies = ResentBodies(min_bytes=0)
    one = bodies.parse("s", "messages", orjson.dumps({"messages": [{"a": 1}]}))
    two = bodies.parse("s", "messages", orjson.dumps({"messages": [{"a": 1}, {"b": 2}]}))
    assert isinstance(one, dict) and isinstance(two, dict)
    assert two["messages"][0] is one["messages"][0]
    assert two is not one and two["messages"] is not one["messages"]
    one["messages"].append("changed")
    three = bodies.parse("s", "messages", orjson.dumps({"messages": [{"a": 1}, {"b": 2}, 3]}))
    assert three == {"messages": [{"a": 1}, {"b": 2}, 3]}


def test_sessions_and_fields_are_kept_apart():
    bodies = ResentBodies(min_bytes=0)
    a = orjson.dumps({"messages": [1, 2]})
    assert bodies.parse("a", "messages", a) == {"messages": [1, 2]}
    assert bodies.parse("b", "messages", orjson.dumps({"messages": [1, 3]})) == {"messages": [1, 3]}
    assert bodies.parse("a", "input", orjson.dumps({"input": [1, 2], "messages": [9]})) == {
        "input": [1, 2],
        "messages": [9],
    }
    bodies.forget("a")
    assert bodies.parse("a", "messages", a) == {"messages": [1, 2]}


def test_small_bodies_are_parsed_whole():
    bodies = ResentBodies()
    raw = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for _ in range(3):
        assert bodies.parse("s", "messages", raw) == orjson.loads(raw)
    assert bodies.reused == 0


def test_a_long_changed_history_is_parsed_whole_and_right():
    """A body changed near its start and after its list is read bracket by bracket only up to
    a bound (``WALK_MAX``), then parsed whole: the result is orjson's either way."""
    history = [{"role": "tool", "content": f"line {i} " + "x" * 500} for i in range(400)]
    assert len(orjson.dumps(history)) > 2 * WALK_MAX
    for write in WRITERS.values():
        bodies = ResentBodies(min_bytes=0)
        first = {"messages": history, "n": 1}
        assert bodies.parse("s", "messages", write(first)) == first
        changed = {"messages": [{"role": "system", "content": "new"}, *history[1:]], "n": 2}
        assert bodies.parse("s", "messages", write(changed)) == changed
        grown = {"messages": [*changed["messages"], {"role": "user", "content": "q"}], "n": 3}
        before = bodies.reused
        assert bodies.parse("s", "messages", write(grown)) == grown
        assert bodies.reused - before == len(changed["messages"])
