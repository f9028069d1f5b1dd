"""Tool calling end to end on llama-server: a random-weight model on the real Qwen2 vocabulary
is made to call a tool by a grammar (tool_choice), the harness answers with the tool result,
and the recorded tokens extend exactly (checked against what the engine received)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time.",
            "parameters": {
                "type": "object",
                "required": ["city", "utc"],
                "properties": {
                    "city": {"type": "string", "enum": ["Tokyo"]},
                    "utc": {"type": "boolean"},
                },
            },
        },
    },
]


def _client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)


def test_required_tool_call_then_result_extends_exactly(turnstile, relay):
    session = turnstile.session()
    client = _client(session)
    msgs = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    r = client.chat.completions.create(
        model="t",
        messages=msgs,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        seed=3,
    )  # room however finely the
    # grammar's literal text is tokenized: one call, then only an end token is allowed
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    assert args.get("city") in ("Paris", "Oslo", "Tokyo")
    assert call.id

    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
    ]
    client.chat.completions.create(model="t", messages=msgs, tools=TOOLS, max_tokens=8, seed=4)

    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls[1]["parent_id"] == calls[0]["id"]
    assert calls[1]["segment_reason"] is None
    assert calls[0]["sampling"]["grammar"].startswith("root ::=")  # the constraint is recorded
    assert "grammar" not in calls[1]["sampling"]
    ex = relay.completions()
    assert ex[0].request["grammar"] == calls[0]["sampling"]["grammar"]
    traj = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(traj) == 1
    assert traj[0]["token_ids"] == ex[1].request["prompt"] + ex[1].response["tokens"]
    # The tool result sits in the second prompt as unsampled tokens, after the sampled call.
    first = ex[0].request["prompt"] + ex[0].response["tokens"]
    assert ex[1].request["prompt"][: len(first)] == first


def test_named_function_and_streaming_deltas(turnstile):
    session = turnstile.session()
    client = _client(session)
    stream = client.chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "Time in Tokyo?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=200,
        seed=5,
        stream=True,
    )  # one call, ended by the grammar well within max_tokens
    name, args, finish, ids = "", "", None, set()
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for tc in d.tool_calls or ():
            if tc.id:
                ids.add(tc.id)
            if tc.function:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "get_time"
    assert json.loads(args)["city"] == "Tokyo"
    assert isinstance(json.loads(args)["utc"], bool)
    assert finish == "tool_calls" and len(ids) == 1


def test_tool_choice_none_hides_tools_and_bad_choices_are_400(turnstile, relay):
    session = turnstile.session()
    client = _client(session)
    msgs = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(
        model="t", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    client.chat.completions.create(model="t", messages=msgs, tools=TOOLS, max_tokens=4)
    plain, with_tools = (ex.request["prompt"] for ex in relay.completions()[-2:])
    assert len(with_tools) > len(plain)  # the template listed the tools only when allowed
    url = session["base_url"] + "/chat/completions"
    for choice in ({"type": "function", "function": {"name": "nope"}}, "sometimes", 3):
        r = httpx.post(url, json={"messages": msgs, "tools": TOOLS, "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = httpx.post(url, json={"messages": msgs, "tool_choice": "required"})
    assert r.status_code == 400
