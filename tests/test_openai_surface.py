"""What a harness sees, as OpenAI's API would show it, on a real llama-server (random weights on
the real Qwen2 vocabulary, the Qwen2.5 template): matched stop strings are left out of the
content (the record keeps the sampled IDs), a forced call cut by max_tokens is "length",
``tool_choice: "required"`` admits several calls unless ``parallel_tool_calls`` is false, and
every request field is either passed to the engine and recorded or refused with a 400.

Nothing here depends on what the model happens to sample: the text is forced with a JSON
schema (response_format) or a grammar plus a logit bias."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from turnstile.parsing.grammar import tool_call_grammar
from turnstile.testing.mock_engine import MockEngine, Reply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


# one server and relay for the module: every test works in a session of its own and reads
# the relay's last exchange
@pytest.fixture
def relay(shared_relay):  # noqa: ANN001, ANN201
    return shared_relay


@pytest.fixture
def turnstile(shared_turnstile):  # noqa: ANN001, ANN201
    return shared_turnstile


NEWLINE = 198  # "\n" in the Qwen2 vocabulary
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            },
        },
    }
]
FORCED = {
    "type": "json_schema",
    "json_schema": {"name": "forced", "schema": {"const": "abc STOP def"}},
}


def _client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)


def _calls(turnstile, session: dict) -> list[dict]:
    return turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_matched_stop_string_is_left_out_of_the_content(turnstile, relay, stream):
    session = turnstile.session()
    client = _client(session)
    msgs = [{"role": "user", "content": "Say it."}]
    kw = dict(
        model="t", messages=msgs, response_format=FORCED, stop=["STOP"], max_tokens=32, seed=1
    )
    if stream:
        content, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content, finish = choice.message.content, choice.finish_reason
    assert (content, finish) == ('"abc ', "stop")
    call = _calls(turnstile, session)[0]
    assert call["message"]["content"] == '"abc '
    assert call["stop_string"] == "STOP"
    # the record keeps the sampled tokens, the stop string's included
    assert call["completion_ids"] == relay.completions()[-1].response["tokens"]
    assert "STOP" in relay.completions()[-1].response["content"] + "STOP"
    # the harness echoes what it got: the next call extends the recorded one
    msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": "Again."}]
    client.chat.completions.create(model="t", messages=msgs, max_tokens=2, seed=2)
    second = _calls(turnstile, session)[1]
    assert second["parent_id"] == call["id"] and second["segment_reason"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_max_tokens_is_length(turnstile, stream):
    session = turnstile.session()
    client = _client(session)
    kw = dict(
        model="t",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=6,
        seed=3,
    )
    if stream:
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
    else:
        finish = client.chat.completions.create(**kw).choices[0].finish_reason
    assert finish == "length"
    call = _calls(turnstile, session)[0]
    assert call["finish_reason"] == "length"
    assert len(call["completion_ids"]) == 6


def test_required_admits_several_calls_unless_parallel_tool_calls_is_false(turnstile):
    """A bias on "\\n" makes the model start another call whenever the grammar allows it."""
    session = turnstile.session()
    client = _client(session)
    kw = dict(
        model="t",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        tool_choice="required",
        logit_bias={str(NEWLINE): 100},
        seed=4,
    )
    r = client.chat.completions.create(max_tokens=200, **kw)
    done = [
        c
        for c in r.choices[0].message.tool_calls or ()
        if c.function.arguments == '{"city": "Paris"}'
    ]
    assert len(done) >= 2, r.choices[0].message
    assert r.choices[0].finish_reason == "length"  # it never stops adding calls
    one = client.chat.completions.create(max_tokens=200, parallel_tool_calls=False, **kw)
    assert one.choices[0].finish_reason == "tool_calls"
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == [
        '{"city": "Paris"}'
    ]
    many, single = _calls(turnstile, session)
    assert many["parallel_tool_calls"] is True and single["parallel_tool_calls"] is False
    assert many["sampling"]["grammar"] == tool_call_grammar("hermes", TOOLS, parallel=True)
    assert single["sampling"]["grammar"] == tool_call_grammar("hermes", TOOLS)


def test_named_function_is_one_call_even_with_parallel_tool_calls(turnstile):
    session = turnstile.session()
    r = _client(session).chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        logit_bias={str(NEWLINE): 100},
        max_tokens=200,
        seed=5,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(r.choices[0].message.tool_calls) == 1


def test_response_format_is_passed_to_the_engine_and_recorded(turnstile, relay):
    session = turnstile.session()
    client = _client(session)
    schema = {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    }
    r = client.chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "Yes or no?"}],
        max_tokens=48,
        seed=6,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert json.loads(r.choices[0].message.content)["answer"] in ("yes", "no")
    assert relay.completions()[-1].request["json_schema"] == schema
    assert _calls(turnstile, session)[0]["sampling"]["json_schema"] == schema
    client.chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "JSON?"}],
        max_tokens=4,
        seed=6,
        response_format={"type": "json_object"},
    )
    assert relay.completions()[-1].request["json_schema"] == {"type": "object"}
    client.chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "Text?"}],
        max_tokens=2,
        response_format={"type": "text"},
    )
    assert "json_schema" not in relay.completions()[-1].request


def test_penalties_and_sampling_knobs_reach_the_engine_and_the_record(turnstile, relay):
    session = turnstile.session()
    _client(session).chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        seed=7,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        user="u-1",
        metadata={"k": "v"},
        extra_body={"top_k": 20, "min_p": 0.1, "repetition_penalty": 1.1},
    )
    sent = relay.completions()[-1].request
    assert (
        sent["frequency_penalty"],
        sent["presence_penalty"],
        sent["repeat_penalty"],
        sent["top_k"],
        sent["min_p"],
    ) == (0.5, -0.25, 1.1, 20, 0.1)
    call = _calls(turnstile, session)[0]
    s = call["sampling"]
    assert (
        s["frequency_penalty"],
        s["presence_penalty"],
        s["repetition_penalty"],
        s["top_k"],
        s["min_p"],
    ) == (0.5, -0.25, 1.1, 20, 0.1)
    assert any("prompt" in w for w in call["warnings"])  # llama-server penalises the prompt too
    assert call["request_options"] == {"user": "u-1", "metadata": {"k": "v"}}
    assert "penalties" in call["logprob_warning"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("frequency_penalty", 3),
        ("presence_penalty", "a"),
        ("response_format", {"type": "xml"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("modalities", ["audio"]),
        ("best_of", 2),
        ("guided_json", {}),
        ("parallel_tool_calls", "yes"),
        ("reasoning_effort", 3),
    ],
)
def test_fields_turnstile_cannot_honour_are_a_400_naming_them(turnstile, field, value):
    session = turnstile.session()
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, field: value},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field


def test_a_json_format_cannot_be_combined_with_a_forced_call(turnstile):
    session = turnstile.session()
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_reasoning_effort_reaches_the_template_or_is_flagged(turnstile):
    """The Qwen2.5 template reads no reasoning_effort: the call says so."""
    session = turnstile.session()
    _client(session).chat.completions.create(
        model="t",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        reasoning_effort="low",
    )
    call = _calls(turnstile, session)[0]
    assert "the chat template does not read 'reasoning_effort'" in call["warnings"]


def test_a_stream_holds_back_what_may_start_a_stop_string(tiny_qwen2, tmp_path):
    """The stop string arrives split over batches: no piece of it reaches the harness."""
    import asyncio

    from turnstile.app.wiring import build_gateway
    from turnstile.chat.tokenizer import load_tokenizer
    from turnstile.dialects.chat.answer import Chunks as ChatChunks
    from turnstile.dialects.chat.request import parse_chat_request

    tok = load_tokenizer(str(tiny_qwen2))
    pieces = ["Hello", " wor", "ld", " EN", "D", " after"]
    ids = [tok.encode(p) for p in pieces]
    gw = build_gateway("http://127.0.0.1:9", str(tiny_qwen2), tmp_path, audit_template=False)
    # the engine streams fixed batches of token IDs (as vLLM and SGLang do)
    flat = [t for b in ids for t in b]
    gw.engine = MockEngine(
        lambda prompt, params: Reply(
            flat, batches=[len(b) for b in ids], finish_fields={"stop_string": "END"}
        )
    )

    async def run() -> list[str]:
        req = parse_chat_request(
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stop": ["END", "world!"],
                "stream": True,
            }
        )
        render = ChatChunks("m", include_usage=False)  # the gateway's events as Chat chunks
        chunks = [c async for e in await gw.stream("s1", req) for c in render(e)]
        return [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]

    deltas = asyncio.run(run())
    assert "".join(deltas) == "Hello world "
    # " wor" could begin "world!": held back until "ld" showed it does not (then "ld " until
    # "EN" ... ): no delta ever holds a stop string's start that later matched
    assert all("E" not in d for d in deltas)
    call = gw.store.calls("s1")[0]
    assert call.message["content"] == "Hello world "
    assert call.completion_ids.tolist() == [t for b in ids for t in b]
