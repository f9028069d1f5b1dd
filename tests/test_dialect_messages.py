"""The Anthropic Messages dialect through the real ``anthropic`` SDK against llama-server (a
random model on the real Qwen2 vocabulary, tool calls forced by grammar): a multi-turn tool-use
conversation — forced call, tool result, streamed forced call, an ``is_error`` result — extends
the recorded tokens exactly. Truth: the recording relay (what llama-server received and sampled)
and the SDK's own typed event models."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from turnstile.chat.tokenizer import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

IM_END = 151645
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city.",
        "input_schema": {
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        },
    }
]
SYSTEM = [
    {"type": "text", "text": "You are a weather assistant."},
    {"type": "text", "text": "Use the tools."},
]
RAW = TypeAdapter(RawMessageStreamEvent)
RAW_TYPES = {
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
}


def _capability(session: dict) -> str:
    return session["base_url"].split("/s/")[1].split("/")[0]


def _blocks(content: list) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in content]


def test_messages_tool_use_conversation_extends_exactly(turnstile, relay, tiny_qwen2, no_end_bias):
    session = turnstile.session(dialect="messages")
    # the capability as the API key (x-api-key), as an Anthropic harness holds it
    client = anthropic.Anthropic(
        base_url=turnstile.url, api_key=_capability(session), max_retries=0
    )
    common = dict(model="tiny", system=SYSTEM, tools=TOOLS)

    msgs: list[dict] = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = client.messages.create(
        **common,
        messages=msgs,
        max_tokens=200,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"seed": 3},
    )
    assert r1.stop_reason == "tool_use"
    use = [b for b in r1.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].input["city"] in ("Paris", "Oslo")

    msgs += [
        {"role": "assistant", "content": _blocks(r1.content)},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "18 C"}],
        },
    ]
    r2 = client.messages.create(
        **common, messages=msgs, max_tokens=40, extra_body={"seed": 4, "logit_bias": no_end_bias}
    )
    assert r2.stop_reason == "max_tokens" and r2.content[0].type == "text"
    assert r2.usage.output_tokens == 40

    # streamed, with a forced call by name: every raw event validates against the SDK's models
    msgs += [
        {"role": "assistant", "content": _blocks(r2.content)},
        {"role": "user", "content": [{"type": "text", "text": "And in Oslo?"}]},
    ]
    seen = []
    with client.messages.stream(
        **common,
        messages=msgs,
        max_tokens=200,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"seed": 5},
    ) as stream:
        for ev in stream:
            if ev.type in RAW_TYPES:
                RAW.validate_python(ev.to_dict())
                seen.append(ev.type)
        r3 = stream.get_final_message()
    assert seen[0] == "message_start" and seen[-2:] == ["message_delta", "message_stop"]
    assert r3.stop_reason == "tool_use"
    use3 = [b for b in r3.content if b.type == "tool_use"]
    assert len(use3) == 1

    msgs += [
        {"role": "assistant", "content": _blocks(r3.content)},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use3[0].id,
                    "is_error": True,
                    "content": [{"type": "text", "text": "station offline"}],
                },
                {"type": "text", "text": "Try again later?"},
            ],
        },
    ]
    counted = client.messages.count_tokens(**common, messages=msgs).input_tokens
    r4 = client.messages.create(
        **common, messages=msgs, max_tokens=12, extra_body={"seed": 6, "logit_bias": no_end_bias}
    )
    assert r4.stop_reason == "max_tokens"

    exchanges = relay.completions()
    assert len(exchanges) == 4
    # count_tokens said what the next call sent, before it was sent
    assert counted == len(exchanges[-1].request["prompt"])
    recorded = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["segment_reason"] for c in recorded] == ["first_call", None, None, None]
    assert all(c["dialect"] == "messages" for c in recorded)
    # the streamed answer is the recorded message
    call3 = recorded[2]["message"]["tool_calls"][0]
    assert call3["id"] == use3[0].id and call3["function"]["name"] == use3[0].name
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(trajs) == 1
    ids = trajs[0]["token_ids"]
    for ex in exchanges:
        n, sampled = len(ex.request["prompt"]), ex.response["tokens"]
        assert ids[: n + len(sampled)] == ex.request["prompt"] + sampled
    assert ids == exchanges[-1].request["prompt"] + exchanges[-1].response["tokens"]
    assert r2.usage.input_tokens + (r2.usage.cache_read_input_tokens or 0) == len(
        exchanges[1].request["prompt"]
    )

    tok = load_tokenizer(str(tiny_qwen2))
    drifted = [
        ex
        for ex in exchanges
        if tok.encode(tok.decode([t for t in ex.response["tokens"] if t != IM_END]))
        != [t for t in ex.response["tokens"] if t != IM_END]
    ]
    assert drifted, "a random model should sample at least one non-canonical tokenization"


def test_messages_errors_have_anthropics_shape(turnstile):
    session = turnstile.session()
    url = session["anthropic_base_url"] + "/v1/messages"
    user = [{"role": "user", "content": "hi"}]
    cases = [
        ({"messages": user}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages.0.content.0.source",  # an image block needs its base64 source
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "max_tokens": 5,
                "messages": user,
                "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            },
            "context_management.edits.0",
        ),
        (
            {
                "max_tokens": 5,
                "messages": user,
                "context_management": {
                    "edits": [
                        {
                            "type": "clear_thinking_20251015",
                            "keep": {"type": "thinking_turns", "value": 1},
                        }
                    ]
                },
            },
            "context_management.edits.0",
        ),
        ({"max_tokens": 5, "messages": user, "output_config": {"verbosity": 1}}, "output_config"),
        (
            {"max_tokens": 5, "messages": user, "output_config": {"effort": "huge"}},
            "output_config.effort",
        ),
        ({"max_tokens": 5, "messages": user, "thinking": {"type": "sometimes"}}, "thinking"),
        ({"max_tokens": 5, "messages": user, "tool_choice": {"type": "maybe"}}, "tool_choice"),
        ({"max_tokens": 5, "messages": user, "frobnicate": 1}, "frobnicate"),
    ]
    for body, field in cases:
        r = httpx.post(url, json={"model": "t", **body}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert err["error"]["message"].startswith(field), (body, err)
    # a wrong key: Anthropic's authentication_error, through the SDK's own error class
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"].split("/s/")[0],
        api_key="not-a-capability",
        max_retries=0,
    )
    with pytest.raises(anthropic.AuthenticationError) as info:
        client.messages.create(model="t", max_tokens=3, messages=user)
    assert info.value.body["error"]["type"] == "authentication_error"


def test_claude_codes_defaults_are_accepted_for_what_they_do(
    turnstile, relay, tiny_qwen2, no_end_bias
):
    """What Claude Code sends on its defaults: a context edit that keeps everything and
    ``metadata`` (kept in the record), ``output_config.effort`` and adaptive ``thinking``
    (template variables), a system message mid-conversation (rendered where it stands), a
    server tool (left out, with a warning). The next call still extends the first exactly."""
    session = turnstile.session()
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="unused", max_retries=0
    )
    defaults = dict(
        model="tiny",
        system=SYSTEM,
        tools=[*TOOLS, {"type": "web_search_20250305", "name": "web_search"}],
        metadata={"user_id": '{"device_id":"d1"}'},
        thinking={"type": "adaptive"},
        extra_body={
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "seed": 3,
            "logit_bias": no_end_bias,
        },
    )
    msgs: list[dict] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "system", "content": "Answer in one word."},
    ]
    r1 = client.messages.create(**defaults, messages=msgs, max_tokens=6)
    msgs += [
        {"role": "assistant", "content": _blocks(r1.content)},
        {"role": "user", "content": "And Oslo?"},
    ]
    client.messages.create(**defaults, messages=msgs, max_tokens=6)
    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["segment_reason"] for c in calls] == ["first_call", None]
    options = calls[0]["request_options"]
    assert options["context_management"]["edits"][0]["keep"] == "all"
    assert options["metadata"] == {"user_id": '{"device_id":"d1"}'}
    assert any("'web_search_20250305'" in w for w in calls[0]["warnings"])
    a, b = relay.completions()
    n = len(a.request["prompt"])
    assert b.request["prompt"][: n + len(a.response["tokens"])] == (
        a.request["prompt"] + a.response["tokens"]
    )
    text = load_tokenizer(str(tiny_qwen2)).decode(a.request["prompt"])
    assert "<|im_start|>system\nAnswer in one word.<|im_end|>" in text
    assert '"name": "web_search"' not in text and '"name": "get_weather"' in text
