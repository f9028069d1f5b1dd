"""The OpenAI Responses dialect through the real ``openai`` SDK against llama-server (a random
model on the real Qwen2 vocabulary): multi-turn tool use chained by ``previous_response_id``,
streamed, and with the whole input resent, extends the recorded tokens exactly as a Chat harness
would. Truth: the recording relay (what llama-server received and sampled) and the SDK's own
typed models (every streamed event validates; the stream reassembles the stored response)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from turnstile.chat.tokenizer import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

IM_END = 151645
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "strict": False,
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        },
    }
]
INSTRUCTIONS = "You are a weather assistant. Use the tools."
EVENTS = TypeAdapter(ResponseStreamEvent)


def _client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)


def _dump(items: list) -> list[dict]:
    return [i.model_dump(exclude_none=True) for i in items]


def test_responses_tool_use_chain_stream_and_resend_extend_exactly(
    turnstile, relay, tiny_qwen2, no_end_bias
):
    session = turnstile.session(dialect="responses")
    client = _client(session)
    common = dict(model="tiny", instructions=INSTRUCTIONS, tools=TOOLS)

    # 1: a forced function call (grammar), from a plain string input
    r1 = client.responses.create(
        **common,
        input="Weather in Paris?",
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        extra_body={"seed": 3},
    )
    calls = [o for o in r1.output if o.type == "function_call"]
    assert r1.status == "completed" and len(calls) == 1
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")

    # 2: the tool's output, chained by previous_response_id; no end token may be sampled
    out = [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp_c": 18}'}
    ]
    r2 = client.responses.create(
        **common,
        previous_response_id=r1.id,
        input=out,
        max_output_tokens=40,
        extra_body={"seed": 4, "logit_bias": no_end_bias},
    )
    assert r2.status == "incomplete" and r2.incomplete_details.reason == "max_output_tokens"
    assert r2.output_text and r2.previous_response_id == r1.id

    # 3: streamed, chained; every event validates against the SDK's own event models
    user3 = [{"role": "user", "content": "And in Oslo, HAVING fun?"}]
    seen = []
    with client.responses.stream(
        **common,
        previous_response_id=r2.id,
        input=user3,
        max_output_tokens=40,
        extra_body={"seed": 5, "logit_bias": no_end_bias},
    ) as stream:
        for ev in stream:
            EVENTS.validate_python(ev.to_dict())
            seen.append(ev.type)
            if ev.type == "response.incomplete":  # as OpenAI's API at max_output_tokens (the
                r3 = ev.response  # SDK's get_final_response waits for response.completed)
            elif ev.type == "response.output_text.delta":
                text = (locals().get("text") or "") + ev.delta
    assert r3.output_text == text
    assert seen[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in seen and seen[-1] == "response.incomplete"
    # the stream reassembles what the record holds (GET rebuilds it from the record)
    stored = client.responses.retrieve(r3.id)
    assert stored.output_text == r3.output_text and stored.id == r3.id
    assert [o.id for o in stored.output] == [o.id for o in r3.output]

    # 4: no previous_response_id: the whole input resent, output items as the SDK holds them
    user4 = [{"role": "user", "content": "Thanks!"}]
    full = [
        {"role": "user", "content": "Weather in Paris?"},
        *_dump(r1.output),
        *out,
        *_dump(r2.output),
        *user3,
        *_dump(r3.output),
        *user4,
    ]
    client.responses.create(
        **common,
        input=full,
        max_output_tokens=12,
        extra_body={"seed": 6, "logit_bias": no_end_bias},
    )

    # One trajectory: every call extended the one before it, token for token.
    exchanges = relay.completions()
    assert len(exchanges) == 4
    recorded = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["segment_reason"] for c in recorded] == ["first_call", None, None, None]
    assert all(c["dialect"] == "responses" for c in recorded)
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(trajs) == 1
    ids = trajs[0]["token_ids"]
    for ex in exchanges:
        n, sampled = len(ex.request["prompt"]), ex.response["tokens"]
        assert ids[: n + len(sampled)] == ex.request["prompt"] + sampled
    assert ids == exchanges[-1].request["prompt"] + exchanges[-1].response["tokens"]
    assert sum(trajs[0]["loss_mask"]) == sum(len(ex.response["tokens"]) for ex in exchanges)

    # Re-tokenizing the sampled text would have drifted.
    tok = load_tokenizer(str(tiny_qwen2))
    drifted = [
        ex
        for ex in exchanges[1:]
        if tok.encode(tok.decode([t for t in ex.response["tokens"] if t != IM_END]))
        != [t for t in ex.response["tokens"] if t != IM_END]
    ]
    assert drifted, "a random model should sample at least one non-canonical tokenization"


def test_responses_errors_name_the_responses_field(turnstile):
    session = turnstile.session()
    url = session["base_url"] + "/responses"

    def post(body: dict) -> httpx.Response:
        return httpx.post(url, json={"model": "t", **body}, timeout=30)

    cases = [
        ({}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "tools": [{"type": "custom", "name": "patch"}]}, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "msg_nope_0"}]}, "input[0].id"),
        ({"input": [{"type": "frobnicate"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "truncation": "auto"}, "truncation"),
        ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ]
    for body, param in cases:
        r = post(body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.json())
    r = httpx.get(url + "/resp_nope", timeout=30)
    assert r.status_code == 404


def test_responses_chain_is_private_to_its_session(turnstile):
    """A session cannot extend or read another session's response."""
    a, b = turnstile.session(), turnstile.session()
    r = _client(a).responses.create(model="t", input="hi", max_output_tokens=3)
    with pytest.raises(openai.BadRequestError):
        _client(b).responses.create(
            model="t", input="more", previous_response_id=r.id, max_output_tokens=3
        )
    with pytest.raises(openai.NotFoundError):
        _client(b).responses.retrieve(r.id)
    assert _client(a).responses.retrieve(r.id).id == r.id
    # store=false keeps no chain: such a response cannot be named (as OpenAI)
    unstored = _client(a).responses.create(model="t", input="hi", max_output_tokens=3, store=False)
    with pytest.raises(openai.BadRequestError):
        _client(a).responses.create(
            model="t", input="more", max_output_tokens=3, previous_response_id=unstored.id
        )


def test_codex_and_ai_sdk_shapes_extend_exactly(turnstile, relay, no_end_bias):
    """What Codex and the AI SDK send on their defaults: a namespace of tools (flattened under
    the names Codex calls them by, answered with the namespace), a hosted tool (left out, with
    a warning), ``client_metadata`` (kept), a developer message, and on the next turn the
    earlier output by ``item_reference`` (resolved from this session's records): the second
    call extends the first token for token."""
    session = turnstile.session()
    client = _client(session)
    tools = [
        {
            "type": "namespace",
            "name": "weather_v1",
            "description": "Weather tools.",
            "tools": [{**TOOLS[0], "type": "function"}],
        },
        {"type": "web_search", "external_web_access": False},
    ]
    first = [
        {"role": "developer", "content": INSTRUCTIONS},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    r1 = client.responses.create(
        model="tiny",
        input=first,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        extra_body={"seed": 3, "client_metadata": {"thread_id": "t-1"}},
    )
    [fc] = [o.to_dict() for o in r1.output if o.type == "function_call"]
    assert (fc["namespace"], fc["name"]) == ("weather_v1", "get_weather")
    out = {"type": "function_call_output", "call_id": fc["call_id"], "output": "18 C"}
    client.responses.create(
        model="tiny",
        input=[*first, {"type": "item_reference", "id": fc["id"]}, out],
        tools=tools,
        max_output_tokens=8,
        extra_body={"seed": 4, "logit_bias": no_end_bias},
    )
    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["segment_reason"] for c in calls] == ["first_call", None]
    assert calls[0]["request_options"]["client_metadata"] == {"thread_id": "t-1"}
    assert any("'web_search' was left out" in w for w in calls[0]["warnings"])
    a, b = relay.completions()
    assert b.request["prompt"][: len(a.request["prompt"])] == a.request["prompt"]
    n = len(a.request["prompt"])
    assert b.request["prompt"][n : n + len(a.response["tokens"])] == a.response["tokens"]
    # a reference to another session's item is not found here
    other = _client(turnstile.session())
    with pytest.raises(openai.BadRequestError, match="no item with id"):
        other.responses.create(
            model="tiny", input=[{"type": "item_reference", "id": fc["id"]}], max_output_tokens=2
        )
