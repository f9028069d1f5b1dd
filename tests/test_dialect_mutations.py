"""Property: whatever a harness sends, a dialect's parser answers with the request or a 4xx
naming a field, never another exception (which the server turns into a 500).

Each dialect starts from a valid body that uses most of its fields; hypothesis then replaces
the value at any path in it (a field, a message, a tool, a content part, a value deep in a
schema) with any JSON value, deletes it, or adds a key beside it. The fuzzer over HTTP
(``test_fuzz.py``) found a list as a Responses tool's ``type`` answered with a 500 (``x in
frozenset`` with an unhashable ``x``); these run every mutation through the three parsers
directly, many times faster, so such a case turns up in the unit tier."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.dialects.chat.request import parse_chat_request
from turnstile.dialects.messages import dialect as anthropic
from turnstile.dialects.responses import dialect as responses
from turnstile.errors import APIError
from turnstile.store.store import Store

pytestmark = pytest.mark.unit

_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "enum": ["a", "b"]}, "n": {"type": "integer"}},
    "required": ["path"],
}

CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Read a."}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Read it.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "text of a"},
        {"role": "user", "content": "Go on.", "name": "u"},
    ],
    "tools": [{"type": "function", "function": {"name": "read", "parameters": _SCHEMA}}],
    "tool_choice": "auto",
    "max_tokens": 16,
    "temperature": 0.5,
    "top_p": 0.9,
    "stop": ["\n\n"],
    "seed": 3,
    "logprobs": True,
    "top_logprobs": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _SCHEMA}},
    "reasoning_effort": "low",
    "parallel_tool_calls": True,
    "n": 1,
}

# a forced call: the object form of tool_choice (a structured output may not go with it)
CHAT_FORCED = {
    **{k: v for k, v in CHAT.items() if k != "response_format"},
    "tool_choice": {"type": "function", "function": {"name": "read"}},
}

MESSAGES = {
    "model": "m",
    "max_tokens": 16,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "Read a."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Read it.", "signature": "s"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "text of a"},
                {"type": "text", "text": "Go on."},
            ],
        },
    ],
    "tools": [{"name": "read", "description": "Read a file.", "input_schema": _SCHEMA}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "stop_sequences": ["\n\n"],
    "temperature": 0.5,
    "top_k": 5,
    "stream": True,
    "metadata": {"user_id": "u"},
    "output_config": {"effort": "low"},
}

RESPONSES = {
    "model": "m",
    "instructions": "You are terse.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Read a."}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Read it."}]},
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "text of a"},
        {"type": "message", "role": "user", "content": "Go on."},
    ],
    "tools": [
        {"type": "function", "name": "read", "parameters": _SCHEMA, "strict": True},
        {"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "ls"}]},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "max_output_tokens": 16,
    "temperature": 0.5,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "x", "schema": _SCHEMA}},
    "parallel_tool_calls": True,
    "store": True,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
}


def _paths(v: Any, at: tuple = ()) -> Iterator[tuple]:
    yield at
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*at, i))


text = st.text(max_size=8) | st.sampled_from(["function", "text", "user", "assistant", "tool"])
# what the server's JSON reader (orjson) can hand a parser: integers within 64 bits (a longer
# one arrives as a float), finite floats
integers = st.integers(-(2**63), 2**64 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | integers | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def mutated(draw: st.DrawFn, base: dict) -> dict:
    """``base`` with one to three of its values replaced, deleted or given a new sibling."""
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(body) if p]
        path = draw(st.sampled_from(paths))
        parent = body
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        how = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if how == "replace":
            parent[key] = draw(json_values)
        elif how == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(text)] = draw(json_values)
        else:
            parent.insert(key, draw(json_values))
    return body


def _answers_or_refuses(parse: Any, body: dict) -> None:
    try:
        parse(body)
    except APIError as exc:
        assert 400 <= exc.status < 500, (exc.status, exc.message, body)
        assert exc.message


SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "base",
    [CHAT, CHAT_FORCED, MESSAGES, RESPONSES],
    ids=["chat", "chat-forced", "messages", "responses"],
)
def test_the_valid_bodies_parse(base: dict, tmp_path: Path) -> None:
    """The starting points are valid: every mutation starts from a request that passes."""
    _parser(base, tmp_path)(copy.deepcopy(base))


def _parser(base: dict, tmp_path: Path) -> Any:
    if base is CHAT or base is CHAT_FORCED:
        return parse_chat_request
    if base is MESSAGES:
        return anthropic.parse
    chains = responses.Chains(Store(tmp_path / "records"))
    return lambda body: responses.parse(body, "s", chains)


@pytest.mark.parametrize(
    "base",
    [CHAT, CHAT_FORCED, MESSAGES, RESPONSES],
    ids=["chat", "chat-forced", "messages", "responses"],
)
def test_any_mutation_is_answered_or_refused_with_a_4xx(base: dict, tmp_path: Path) -> None:
    parse = _parser(base, tmp_path)

    @SETTINGS
    @given(mutated(base))
    def check(body: dict) -> None:
        _answers_or_refuses(parse, body)

    check()
