"""Errors a harness can act on (issue 45): a prompt past the model's context answered in each
dialect as its provider words it, since harnesses key their recovery on those words and codes;
and the probe Claude Code sends before a run answered as Anthropic's API answers it.

What each harness looks for was read from its own release (the test bed's pinned CLIs):

- Claude Code 2.1.332 (and 2.1.197) compacts when an API error's text matches
  ``/prompt is too long[^0-9]*(\\d+)\\s*tokens?\\s*>\\s*(\\d+)/i`` and reads both counts from it
  (Anthropic's wording); before a run it sends ``GET {ANTHROPIC_BASE_URL}/api/hello`` and
  wants a 200;
- OpenAI clients (Codex, the SDKs' users) key on the error ``code``
  ``context_length_exceeded`` (Chat Completions: ``param`` ``messages``; Responses:
  ``input``).

The official SDKs raise their own error types from Turnstile's answers; the engine's context
length (the fake's ``max_model_len``) is the limit each message must state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from turnstile.testing.fake_vllm import VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONTEXT = 96
CLAUDE_CODE_OVERFLOW = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
LONG = "word " * 400  # far past CONTEXT tokens


@pytest.fixture(scope="module")
def small_engine() -> Iterator[VLLMFake]:
    with VLLMFake("0.32.0", max_model_len=CONTEXT) as f:
        yield f


@pytest.fixture
def ts(small_engine, tiny_qwen2, turnstile_factory):
    return turnstile_factory(small_engine.url, tiny_qwen2, extra=("--engine", "vllm"))


def _capability(session: dict) -> str:
    return session["base_url"].split("/s/")[1].split("/")[0]


def test_anthropic_overflow_is_what_claude_code_compacts_on(ts):
    session = ts.session()
    client = anthropic.Anthropic(base_url=ts.url, api_key=_capability(session), max_retries=0)
    msgs = [{"role": "user", "content": LONG}]
    counted = client.messages.count_tokens(model="m", messages=msgs).input_tokens
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m", max_tokens=16, messages=msgs)
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    m = CLAUDE_CODE_OVERFLOW.search(str(err.value))
    assert m is not None, err.value
    assert (int(m.group(1)), int(m.group(2))) == (counted, CONTEXT)
    assert counted > CONTEXT


def test_openai_overflow_carries_the_code_clients_key_on(ts):
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": LONG}], max_tokens=16
        )
    assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model="m", input=LONG, max_output_tokens=16)
    assert responses.value.code == "context_length_exceeded"
    assert responses.value.param == "input"
    assert "exceeds the context window" in responses.value.message
    # nothing reached the engine: a refused call is not sampled (and not recorded as one)
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls == []


def test_claude_codes_probe_gets_a_200_at_its_base_url(ts):
    session = ts.session()
    for url in (f"{ts.url}/s/{_capability(session)}/api/hello", f"{ts.url}/api/hello"):
        assert httpx.head(url).status_code == 200
        assert httpx.get(url).status_code == 200
    # a path beside it is still unknown: the probe route is not a catch-all
    assert httpx.get(f"{ts.url}/s/{_capability(session)}/api/other").status_code == 404


def _sent_max_tokens(engine: VLLMFake) -> int:
    """The budget the engine was sent for the last generation (its own recorder)."""
    body = engine.rec.bodies("/inference/v1/generate")[-1]
    return int(body["sampling_params"]["max_tokens"])


@pytest.mark.parametrize("default", [5, 0])
def test_a_request_without_max_tokens_gets_the_default_budget(
    default, small_engine, tiny_qwen2, turnstile_factory
):
    """aider and Codex send no max_tokens: the engine gets ``serve --default-max-tokens``
    (0: the room left in the context), the record says so; a request's own budget wins."""
    ts = turnstile_factory(
        small_engine.url,
        tiny_qwen2,
        extra=("--engine", "vllm", "--default-max-tokens", str(default)),
    )
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="m", messages=msgs)
    [call] = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    prompt_len = len(call["prompt_delta_ids"])
    assert _sent_max_tokens(small_engine) == (default or CONTEXT - prompt_len)
    assert call.get("max_tokens_default") == (default or None)
    client.chat.completions.create(model="m", messages=msgs, max_tokens=3)
    assert _sent_max_tokens(small_engine) == 3
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert "max_tokens_default" not in calls[-1]


# ---- rate and availability: what a harness retries on ----------------------------------
#
# Read from the pinned CLIs: Claude Code retries a 5xx/429 and counts Anthropic's
# ``overloaded_error`` (its 529) as overload; Codex retries a 5xx/429 unless its code names a
# quota (``usage_limit_reached``, ``insufficient_quota``); Qwen Code and opencode (the OpenAI
# SDK, the AI SDK's APICallError) retry 408/409/429/5xx on the status; Pi retries a message
# matching ``overloaded|rate.?limit|429|500|502|503|504|service.?unavailable``; gemini-cli
# retries 429/499/5xx (never a 400) and reads Google's ``status`` (``UNAVAILABLE``).
# An engine that is briefly unavailable (vLLM's 503 while paused) must reach each of them as
# such a retryable answer in its provider's shape, never as a 400 or a quota error.


def test_an_unavailable_engine_is_each_providers_retryable_503(small_engine, ts):
    session = ts.session()
    cap = _capability(session)
    msgs = [{"role": "user", "content": "hi"}]
    small_engine.fail_next = 503
    r = httpx.post(
        f"{ts.url}/s/{cap}/v1/messages",
        json={"model": "m", "max_tokens": 4, "messages": msgs},
        timeout=30,
    )
    assert r.status_code == 503
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "overloaded_error"  # Anthropic's words for it
    small_engine.fail_next = 503
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        json={"model": "m", "max_tokens": 4, "messages": msgs},
        timeout=30,
    )
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] not in ("insufficient_quota", "usage_limit_reached", "rate_limit_exceeded")
    assert re.search(r"service.?unavailable|overloaded|503", err["message"] + err["type"], re.I)
    small_engine.fail_next = 503
    r = httpx.post(
        f"{ts.url}/s/{cap}/v1beta/models/m:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": cap},
        timeout=30,
    )
    assert r.status_code == 503
    assert r.json()["error"] == {**r.json()["error"], "code": 503, "status": "UNAVAILABLE"}


@pytest.mark.parametrize("client", ["anthropic", "openai-chat", "openai-responses"])
def test_the_official_sdks_retry_an_unavailable_engine_through_turnstile(small_engine, ts, client):
    """The SDKs' own retry (which Claude Code, Qwen Code and the AI SDK's users inherit) takes
    Turnstile's 503 as retryable: the second try reaches the engine and answers."""
    session = ts.session()
    before = len(small_engine.rec.bodies("/inference/v1/generate"))
    small_engine.fail_next = 503
    msgs = [{"role": "user", "content": "hi"}]
    if client == "anthropic":
        a = anthropic.Anthropic(base_url=ts.url, api_key=_capability(session), max_retries=1)
        assert a.messages.create(model="m", max_tokens=4, messages=msgs).content is not None
    else:
        o = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=1)
        if client == "openai-chat":
            o.chat.completions.create(model="m", messages=msgs, max_tokens=4)
        else:
            o.responses.create(model="m", input="hi", max_output_tokens=4)
    assert len(small_engine.rec.bodies("/inference/v1/generate")) == before + 2
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls[-1]["status"] == "ok"
