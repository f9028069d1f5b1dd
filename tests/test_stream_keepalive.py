"""A stream that has nothing to send yet (a long prefill, a busy engine) sends its dialect's
keep-alive every ``--keepalive`` seconds: an empty chunk (an SSE comment before the first)
on Chat Completions, OpenAI's ``keepalive`` event on Responses (Codex's idle timer counts
events, not comments), Anthropic's ``ping`` event on Messages. Claude Code leaves a silent
stream after 300 s and sends the same call again; a keep-alive keeps it waiting. Checked on
the raw bytes of each stream and through each dialect's own SDK, which must read the stream
as it reads the real APIs'."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from turnstile.testing.fake_vllm import VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DELAY = 0.8  # the engine's time per token: the first comes only after it
INTERVAL = 0.15


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[VLLMFake]:
    fake = VLLMFake()
    fake.token_delay = DELAY
    with fake:
        yield fake


@pytest.fixture
def ts(slow_engine, tiny_qwen2, turnstile_factory):
    return turnstile_factory(
        slow_engine.url, tiny_qwen2, extra=("--engine", "vllm", "--keepalive", str(INTERVAL))
    )


def _raw(url: str, body: dict) -> list[str]:
    """The stream's lines up to its first event after the opening ones."""
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        return [line for line in r.iter_lines() if line]


def test_chat_keepalives_are_chunks_the_sdk_yields(ts):
    """A harness's idle timer counts the chunks its SDK yields (Qwen Code: 240 s without
    one ends the stream), and SSE comments never reach it: while the engine is silent the
    stream sends chunks of the same completion with empty content, which change nothing in
    the answer the SDK assembles."""
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="t", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
    )
    first_token = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    waiting = chunks[1:first_token]  # after the role chunk, before the first token
    assert len(waiting) >= 2, chunks
    assert all(
        c.id == chunks[0].id and c.choices[0].delta.content == "" and not c.choices[0].finish_reason
        for c in waiting
    )
    # the answer is the recorded one: the keep-alives added nothing to it
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    [call] = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert text == call["message"]["content"] and chunks[-1].choices[0].finish_reason == "length"


def test_responses_streams_send_keepalive_events_while_waiting(ts):
    base = ts.session()["base_url"]
    resp = _raw(
        base + "/responses", {"model": "t", "input": "hi", "max_output_tokens": 2, "stream": True}
    )
    delta = next(i for i, line in enumerate(resp) if "response.output_text.delta" in line)
    assert sum(line == "event: keepalive" for line in resp[:delta]) >= 2, resp
    # OpenAI's heartbeat, numbered as the event before it: never ahead of the next event
    seqs = [json.loads(line[6:])["sequence_number"] for line in resp if line.startswith("data: ")]
    assert seqs == sorted(seqs) and seqs[-1] == len(set(seqs)) - 1, seqs
    # the SDK reads such streams as it reads OpenAI's
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="t", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    with client.responses.stream(model="t", input="hi", max_output_tokens=2) as stream:
        kinds = [ev.type for ev in stream]
    assert kinds[-1] == "response.incomplete"


def test_messages_streams_send_pings_while_waiting(ts):
    session = ts.session()
    lines = _raw(
        session["anthropic_base_url"] + "/v1/messages",
        {
            "model": "t",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "stream": True,
        },
    )
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "message_start"
    first_delta = events.index("content_block_delta")
    assert events[1:first_delta].count("ping") >= 2, events
    assert 'data: {"type": "ping"}' in lines
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="unused", max_retries=0
    )
    with client.messages.stream(
        model="t", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2
