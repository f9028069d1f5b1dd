"""The Gemini dialect through Google's own ``google-genai`` SDK against llama-server (a random
model on the real Qwen2 vocabulary, tool calls forced by grammar): a forced function call, its
functionResponse, a streamed forced call, a token count and a streamed text turn extend the
recorded tokens exactly. Truth: the recording relay (what llama-server received and sampled) and
the SDK's own types (it parses every answer and chunk into them)."""

from __future__ import annotations

import re

import httpx
import pytest
from google import genai
from google.genai import errors, types

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Weather for a city.",
    # as newer clients (gemini-cli) send it: a plain JSON Schema
    parameters_json_schema={
        "type": "object",
        "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    },
)
TIME = types.FunctionDeclaration(
    name="get_time",
    description="The time in a city.",
    # Google's own Schema type (upper-case types on the wire)
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"city": types.Schema(type=types.Type.STRING, enum=["Paris", "Oslo"])},
        required=["city"],
    ),
)
TOOLS = [types.Tool(function_declarations=[WEATHER, TIME])]


def _capability(session: dict) -> str:
    return session["base_url"].split("/s/")[1].split("/")[0]


def _forced(name: str) -> types.ToolConfig:
    return types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(
            mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=[name]
        )
    )


def test_gemini_sdk_tool_round_extends_the_recorded_tokens(
    turnstile, relay, tiny_qwen2, no_end_bias
):
    session = turnstile.session(dialect="gemini")
    # the capability as the API key (x-goog-api-key), against the bare base URL
    answered: list[tuple[str, str]] = []  # (path, content type) of each answer
    hooks = {
        "response": [
            lambda r: answered.append((r.url.path, r.headers["content-type"].split(";")[0]))
        ]
    }
    client = genai.Client(
        api_key=_capability(session),
        http_options=types.HttpOptions(
            base_url=turnstile.url, httpx_client=httpx.Client(event_hooks=hooks, timeout=60)
        ),
    )
    system = "You are a weather assistant. Use the tools."

    def config(**kw: object) -> types.GenerateContentConfig:
        return types.GenerateContentConfig(system_instruction=system, tools=TOOLS, **kw)

    contents: list[types.Content] = [
        types.Content(role="user", parts=[types.Part(text="Weather in Paris?")])
    ]
    r1 = client.models.generate_content(
        model="tiny",
        contents=contents,
        config=config(tool_config=_forced("get_weather"), seed=3, max_output_tokens=200),
    )
    assert r1.candidates[0].finish_reason == types.FinishReason.STOP
    calls = r1.function_calls
    assert calls and len(calls) >= 1 and calls[0].name == "get_weather"
    assert calls[0].args.get("city") in ("Paris", "Oslo")
    assert r1.candidates[0].content.parts[-len(calls)].thought_signature  # round-tripped below

    contents += [
        r1.candidates[0].content,
        types.Content(
            role="user",
            parts=[
                types.Part.from_function_response(name=c.name, response={"output": "18 C"})
                for c in calls
            ],
        ),
    ]
    r2 = client.models.generate_content(
        model="tiny",
        contents=contents,
        config=config(
            seed=4,
            max_output_tokens=20,
            http_options=types.HttpOptions(extra_body={"logit_bias": no_end_bias}),
        ),
    )
    assert r2.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r2.usage_metadata.candidates_token_count == 20
    assert r2.text is not None

    # streamed, a forced call by the other tool
    contents += [
        r2.candidates[0].content,
        types.Content(role="user", parts=[types.Part(text="Time?")]),
    ]
    chunks = list(
        client.models.generate_content_stream(
            model="tiny",
            contents=contents,
            config=config(tool_config=_forced("get_time"), seed=5, max_output_tokens=200),
        )
    )
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    streamed_calls = [c for ch in chunks for c in ch.function_calls or ()]
    assert [c.name for c in streamed_calls] == ["get_time"] * len(streamed_calls)
    assert streamed_calls and isinstance(streamed_calls[0].args.get("city"), str)
    model_parts = [p for ch in chunks for p in ch.candidates[0].content.parts or ()]

    contents += [
        types.Content(role="model", parts=model_parts),
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="get_time", response={"output": "noon"})]
            + [types.Part(text="Thanks.")],
        ),
    ]
    counted = client.models.count_tokens(
        model="tiny", contents=contents
    ).total_tokens  # without tools and system: checked below against the same request's count
    full = httpx.post(
        f"{turnstile.url}/v1beta/models/tiny:countTokens",
        headers={"x-goog-api-key": _capability(session)},
        json={
            "contents": [
                c.model_dump(mode="json", exclude_none=True, by_alias=True) for c in contents
            ],
            "systemInstruction": {"parts": [{"text": system}]},
            "tools": [t.model_dump(mode="json", exclude_none=True, by_alias=True) for t in TOOLS],
        },
    ).json()["totalTokens"]
    assert counted < full
    text = "".join(
        ch.text or ""
        for ch in client.models.generate_content_stream(
            model="tiny",
            contents=contents,
            config=config(
                seed=6,
                max_output_tokens=12,
                http_options=types.HttpOptions(extra_body={"logit_bias": no_end_bias}),
            ),
        )
    )
    assert text

    exchanges = relay.completions()
    assert len(exchanges) == 4
    # answered as server-sent events exactly where the path asked for them
    assert [kind for path, kind in answered if path.endswith("Content")] == [
        "application/json",
        "application/json",
        "text/event-stream",
        "text/event-stream",
    ]
    # countTokens said what the next call sent, before it was sent
    assert full == len(exchanges[-1].request["prompt"])
    recorded = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["segment_reason"] for c in recorded] == ["first_call", None, None, None]
    assert all(c["dialect"] == "gemini" for c in recorded)
    assert all(c["reused_prefix_len"] > 0 for c in recorded[1:])
    # the record's prompt and completion are what the engine received and sampled
    for rec, ex in zip(recorded, exchanges, strict=True):
        prompt, reused = ex.request["prompt"], rec["reused_prefix_len"]
        assert rec["prompt_delta_ids"] == prompt[reused:] and len(prompt) > reused
        assert rec["completion_ids"] == ex.response["tokens"]
    # the streamed function call is the recorded one
    call3 = recorded[2]["message"]["tool_calls"][0]
    assert call3["function"]["name"] == "get_time" and call3["id"] == streamed_calls[0].id
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(trajs) == 1
    assert (
        trajs[0]["token_ids"] == exchanges[-1].request["prompt"] + exchanges[-1].response["tokens"]
    )


def test_gemini_errors_have_googles_shape_and_key_places(turnstile):
    session = turnstile.session()
    cap = _capability(session)
    base = session["anthropic_base_url"]  # the session's base URL without /v1
    user = [{"role": "user", "parts": [{"text": "hi"}]}]
    cases = [
        ({"contents": []}, "contents"),
        ({"contents": user, "generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"contents": user, "generationConfig": {"bogus": 1}}, "bogus"),
        ({"contents": user, "cachedContent": "x"}, "cachedContent"),
        ({"contents": [{"role": "tool", "parts": [{"text": "x"}]}]}, "role"),
        ({"contents": [{"role": "user", "parts": [{"inlineData": {}}]}]}, "media parts"),
        ({"contents": user, "generationConfig": {"temperature": "hot"}}, "temperature"),
    ]
    for body, named in cases:
        r = httpx.post(base + "/v1beta/models/tiny:generateContent", json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == 400, (body, r.text)
        assert err["status"] == "INVALID_ARGUMENT" and named in err["message"], (body, err)
    # a prompt over the context, in Google's words (what a Gemini harness keys compaction on)
    long = [{"role": "user", "parts": [{"text": "hello " * 9000}]}]
    r = httpx.post(base + "/v1beta/models/tiny:generateContent", json={"contents": long})
    err = r.json()["error"]
    assert r.status_code == 400 and err["status"] == "INVALID_ARGUMENT", r.text
    assert re.fullmatch(
        r"The input token count \(\d+\) exceeds the maximum number of tokens allowed "
        r"\(\d+\)\.",
        err["message"],
    ), err
    # the JSON-array stream (no alt=sse) is refused, saying what to send
    r = httpx.post(base + "/v1beta/models/tiny:streamGenerateContent", json={"contents": user})
    assert r.status_code == 400 and "alt=sse" in r.json()["error"]["message"]
    # the key where Google's SDKs put it: the x-goog-api-key header, or ?key=
    body = {"contents": user, "generationConfig": {"maxOutputTokens": 1}}
    url = turnstile.url + "/v1beta/models/tiny:generateContent"
    assert httpx.post(url, json=body, headers={"x-goog-api-key": cap}).status_code == 200
    assert httpx.post(url + f"?key={cap}", json=body).status_code == 200
    for bad in ({"x-goog-api-key": cap[:-1]}, {}):
        r = httpx.post(url + f"?key={cap[:-1]}", json=body, headers=bad)
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    # another dialect's route does not read Google's places
    r = httpx.post(
        turnstile.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
        headers={"x-goog-api-key": cap},
    )
    assert r.status_code == 401
    # the capability opens its own session only, wherever it is sent
    victim = turnstile.session()
    for path, headers in (
        (f"/s/{victim['id']}/v1beta/models/tiny:generateContent", {"x-goog-api-key": cap}),
        (f"/s/{victim['id']}/v1/models/tiny:generateContent?key={cap}", {}),
        (f"/v1beta/models/tiny:generateContent?key={victim['id']}", {}),
        (f"/s/{cap[:-1]}/v1beta/models/tiny:countTokens", {"x-goog-api-key": cap}),
    ):
        r = httpx.post(turnstile.url + path, json=body, headers=headers)
        assert r.status_code in (401, 404), (path, r.text)
    for path in (f"/v1/sessions/{victim['id']}/calls", "/v1/sessions", "/admin/status"):
        r = httpx.get(turnstile.url + path + f"?key={cap}", headers={"x-goog-api-key": cap})
        assert r.status_code in (401, 403), (path, r.text)
    assert turnstile.get(f"/v1/sessions/{victim['id']}/calls")["data"] == []
    models = httpx.get(base + "/v1beta/models").json()["models"]
    assert models[0]["name"].startswith("models/")
    assert httpx.get(base + "/v1beta/models/tiny").json()["inputTokenLimit"] > 0
    recorded = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert len(recorded) == 2 and all(c["dialect"] == "gemini" for c in recorded)
    # the key in a query parameter is never logged
    assert cap not in turnstile.log.read_text(errors="replace")
    calls = turnstile.series("turnstile_dialect_calls")
    assert calls[("turnstile_dialect_calls_total", (("dialect", "gemini"),))] >= 2


def test_gemini_sdk_raises_googles_errors(turnstile):
    session = turnstile.session()
    client = genai.Client(
        api_key="unused",
        http_options=types.HttpOptions(base_url=session["anthropic_base_url"]),
    )
    with pytest.raises(errors.ClientError) as caught:
        client.models.generate_content(
            model="tiny",
            contents="hi",
            config=types.GenerateContentConfig(candidate_count=2),
        )
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
