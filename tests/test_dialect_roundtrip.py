"""Property: whatever assistant message a call records, the answer a dialect gives for it, sent
back by the harness as the next request's history, is that same message again — content,
reasoning, tool-call IDs, names and arguments — so the next call can extend the recorded tokens.
Hypothesis generates the messages (and the surrounding turns); the check is the history
matcher's own notion of "the same message" plus the fields it does not hash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.chat.history_hash import message_key
from turnstile.dialects.messages import dialect as m
from turnstile.dialects.messages.request import messages as anthropic_messages
from turnstile.dialects.responses import dialect as r
from turnstile.dialects.responses.request import input_messages

pytestmark = pytest.mark.unit

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(text, json_value, max_size=4)


@st.composite
def replies(draw: st.DrawFn) -> dict:
    msg: dict = {"role": "assistant", "content": draw(st.none() | text)}
    if draw(st.booleans()):
        msg["reasoning_content"] = draw(text)
    calls = draw(
        st.lists(
            st.tuples(
                st.from_regex(r"call_[a-z0-9]{8}", fullmatch=True),
                st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
                arguments,
            ),
            max_size=3,
            unique_by=lambda c: c[0],
        )
    )
    if calls:
        msg["tool_calls"] = [
            {
                "id": i,
                "type": "function",
                "function": {
                    "name": n,
                    "arguments": json.dumps(a, ensure_ascii=draw(st.booleans())),
                },
            }
            for i, n, a in calls
        ]
    return msg


def _same(sent: dict, recorded: dict) -> None:
    assert message_key(sent) == message_key(recorded)
    assert (sent.get("reasoning_content") or "") == (recorded.get("reasoning_content") or "")
    assert [c["id"] for c in sent.get("tool_calls") or []] == [
        c["id"] for c in recorded.get("tool_calls") or []
    ]


@settings(max_examples=300, deadline=None)
@given(replies(), text)
def test_responses_output_items_come_back_as_the_recorded_message(reply, user):
    items = r.output_items(reply, "resp_abc")
    # the items round-trip through JSON as an SDK holds and resends them
    items = json.loads(json.dumps(items))
    back = input_messages(
        [{"role": "user", "content": "q"}, *items, *([{"role": "user", "content": user}])]
    )
    assistants = [x for x in back if x["role"] == "assistant"]
    if not items:  # an empty reply has no output item: nothing to send back
        assert not assistants
        return
    assert len(assistants) == 1
    _same(assistants[0], reply)
    assert back[-1] == {"role": "user", "content": user}


@settings(max_examples=300, deadline=None)
@given(replies())
def test_messages_blocks_come_back_as_the_recorded_message(reply):
    blocks = json.loads(json.dumps(m.blocks(reply, "call_x")))
    if not blocks:
        return
    back = anthropic_messages(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": blocks}]}
    )
    _same(back[1], reply)
