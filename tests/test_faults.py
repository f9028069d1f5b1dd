"""Faults and bad input: OpenAI-shaped 4xx/5xx, never a 500 or a hang; nothing acknowledged lost."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

import turnstile_testbed as testbed
from turnstile.testing.fake_vllm import VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def turnstile(shared_turnstile):  # noqa: ANN001, ANN201
    """One server for the module's tests that take ``turnstile``: each works in sessions of
    its own (the tests that stop or starve a server start their own)."""
    return shared_turnstile


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) >= {"message", "type", "param", "code"}
    return err


def test_sigkill_keeps_every_acknowledged_call(relay, tiny_qwen2, turnstile_factory, tmp_path):
    data = tmp_path / "store"
    ts = turnstile_factory(relay.url, tiny_qwen2, data)
    session = ts.session(task="durable")
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "one"}]
    replies = []
    for i in range(3):
        r = client.chat.completions.create(model="t", messages=msgs, max_tokens=8, seed=i)
        replies.append(r)
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"turn {i + 2}"},
        ]
    before = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    ts.stop(signal.SIGKILL)

    ts2 = turnstile_factory(relay.url, tiny_qwen2, data)
    after = ts2.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert after == before
    assert [c["message"]["content"] for c in after] == [
        r.choices[0].message.content for r in replies
    ]
    # The restarted server still extends the recorded conversation token for token.
    client2 = openai.OpenAI(
        base_url=session["base_url"].replace(ts.url, ts2.url), api_key="x", max_retries=0
    )
    client2.chat.completions.create(model="t", messages=msgs, max_tokens=8, seed=9)
    calls = ts2.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls[-1]["parent_id"] == before[-1]["id"]
    ex = relay.completions()[-1]
    traj = [
        t
        for t in ts2.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
        if t["id"] == calls[-1]["id"]
    ][0]
    assert traj["token_ids"] == ex.request["prompt"] + ex.response["tokens"]


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"model": "t"}', 400, "messages"),
        (b'{"messages": "hi"}', 400, "messages"),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages[0].content"),
        (b'{"messages": [{"role": "user"}]}', 400, "messages[0].content"),
        (
            b'{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}]}',
            400,
            "messages[1].tool_call_id",
        ),
        (
            b'{"messages": [{"role": "user", "content": "a"}], "temperature": "hot"}',
            400,
            "temperature",
        ),
        (b'{"messages": [{"role": "user", "content": "a"}], "temperature": 7}', 400, "temperature"),
        (b'{"messages": [{"role": "user", "content": "a"}], "max_tokens": -3}', 400, "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "a"}], "n": 2}', 400, "n"),
        (b'{"messages": [{"role": "user", "content": "a"}], "stream": "yes"}', 400, "stream"),
        (
            b'{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}',
            400,
            "tools[0]",
        ),
        (b'{"messages": [{"role": "user", "content": "a"}], "stop": [1]}', 400, "stop"),
        (
            b'{"messages": [{"role": "user", "content": "a"}], "logit_bias": {"x": 1}}',
            400,
            "logit_bias",
        ),
    ],
)
def test_bad_requests_name_the_field(turnstile, body, status, param):
    session = turnstile.session()
    r = httpx.post(
        session["base_url"] + "/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    err = _error(r, status)
    assert err["param"] == param
    if param:
        assert param.split(".")[0].split("[")[0] in err["message"]


def test_unknown_session_and_oversize_body(turnstile):
    r = httpx.post(
        turnstile.url + "/s/nope/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "a"}]},
    )
    assert _error(r, 404)["code"] == "session_not_found"
    _error(turnstile.http.get(turnstile.url + "/v1/sessions/nope/calls"), 404)
    _error(turnstile.http.get(turnstile.url + "/v1/sessions/nope/trajectories"), 404)
    _error(httpx.get(turnstile.url + "/no/such/route"), 404)
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (33 << 20) + b'"}]}'
    r = turnstile.http.post(
        turnstile.url + "/v1/chat/completions",
        content=big,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert _error(r, 413)["code"] == "request_too_large"


def test_context_overflow_is_a_400(turnstile):
    session = turnstile.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="t", messages=[{"role": "user", "content": "word " * 9000}], max_tokens=5
        )
    assert e.value.body["code"] == "context_length_exceeded"


def test_official_client_sees_openai_errors(turnstile):
    session = turnstile.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="t", messages=[{"role": "tool", "content": "x"}])
    assert "tool_call_id" in str(e.value)


def test_engine_down_gives_503_then_recovers(tiny_qwen2, turnstile_factory):
    port = testbed.free_port()
    ts = turnstile_factory(f"http://127.0.0.1:{port}", tiny_qwen2)  # nothing listens there yet
    session = ts.session()
    url = session["base_url"] + "/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert _error(httpx.post(url, json=body, timeout=30), 503)["type"] == "engine_unavailable"
    assert httpx.get(ts.url + "/health").status_code == 503
    with testbed.llama_server(tiny_qwen2, port=port):
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.get(ts.url + "/health").status_code == 200


def test_engine_dies_mid_run(tiny_qwen2, turnstile_factory):
    """Calls fail with 502/503 while the engine is gone, are recorded as errors, and never
    become a parent: the session's tree stays intact."""
    with testbed.llama_server(tiny_qwen2) as engine_url:
        ts = turnstile_factory(engine_url, tiny_qwen2)
        session = ts.session()
        client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model="t", messages=msgs, max_tokens=4, seed=1)
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "still there?"},
    ]
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="t", messages=msgs, max_tokens=4)
    assert e.value.status_code in (502, 503)
    # Streaming: the failure arrives in-band as an OpenAI error event.
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
            model="t", messages=msgs, max_tokens=4, stream=True
        ):
            pass
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["status"] for c in calls] == ["ok", "error", "error"]
    assert calls[1]["parent_id"] == calls[2]["parent_id"] == calls[0]["id"]
    trajs = ts.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert [t["call_ids"] for t in trajs] == [[calls[0]["id"]]]


def test_client_gone_mid_stream_is_recorded_as_aborted(turnstile, no_end_bias):
    session = turnstile.session()
    # no end token can be sampled: the call is still generating when the harness goes away
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 2000,
        "stream": True,
        "seed": 5,
        "logit_bias": no_end_bias,
    }
    with httpx.stream(
        "POST", session["base_url"] + "/chat/completions", json=body, timeout=60
    ) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            break  # the harness goes away after the first chunk
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    r2 = client.chat.completions.create(
        model="t", messages=[{"role": "user", "content": "ok"}], max_tokens=4
    )
    assert r2.choices[0].finish_reason in ("stop", "length")
    deadline = time.monotonic() + 30
    while True:
        calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
        statuses = sorted(c["status"] for c in calls)
        if statuses == ["aborted", "ok"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert statuses == ["aborted", "ok"]


def test_closed_session_refuses_new_calls(turnstile):
    session = turnstile.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="t", messages=msgs, max_tokens=2)
    assert (
        turnstile.http.post(
            f"{turnstile.url}/v1/sessions/{session['id']}/close", json={}
        ).status_code
        == 200
    )
    with pytest.raises(openai.ConflictError) as e:
        client.chat.completions.create(model="t", messages=msgs, max_tokens=2)
    assert e.value.body["code"] == "session_closed"
    assert len(turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]) == 1


def _answers(log: Path) -> list[str]:
    """The error lines of a server's log (``server.error_log``)."""
    return [line for line in log.read_text(errors="replace").splitlines() if " answered " in line]


def test_errors_are_logged_and_their_bodies_name_no_engine_address(tiny_qwen2, turnstile_factory):
    """Every error answered is one log line at --log-level info (status, route template, code,
    session; never a capability or the token), and the engine's address stays on the trainer's
    side: in that line and in the call's record, never in what a harness reads (any dialect,
    whole or streamed)."""
    with VLLMFake("0.33.0") as fake:
        ts = turnstile_factory(
            fake.url, tiny_qwen2, extra=("--engine", "vllm", "--log-level", "info")
        )
        session = ts.session()
        sid, base = session["id"], session["base_url"]
        cap = base.rsplit("/s/", 1)[1].split("/")[0]
        bad = httpx.post(base + "/chat/completions", json={"messages": "hi"}, timeout=30)
        assert _error(bad, 400)["param"] == "messages"
    # the engine is gone: every call fails there (a 502, or in-band once a stream began)
    address = f"127.0.0.1:{fake.port}"
    calls = {
        "chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        "responses": {"input": "hi"},
        "messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    }
    for route, body in calls.items():
        for stream in (False, True):
            r = httpx.post(
                f"{base}/{route}", json={"model": "m", **body, "stream": stream}, timeout=60
            )
            assert r.status_code == (200 if stream else 502), (route, stream, r.text)
            assert "error" in r.text
            assert address not in r.text and "127.0.0.1" not in r.text, (route, stream, r.text)
    r = httpx.post(ts.url + "/s/cap_wrong/v1/chat/completions", json=calls["messages"])
    assert _error(r, 404)["code"] == "session_not_found"
    _error(ts.http.get(ts.url + "/v1/sessions/nope/calls"), 404)

    records = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    assert [c["status"] for c in records] == ["error"] * 6
    assert all(address in c["error"] for c in records), [c["error"] for c in records]

    text = ts.log.read_text(errors="replace")
    assert cap not in text and ts.token not in text and "cap_wrong" not in text
    lines = _answers(ts.log)
    assert len(lines) == 1 + 6 + 2, lines
    harness = "POST /s/{sid}/v1/"
    assert f"answered 400 to {harness}chat/completions code=" in lines[0]
    assert f"session={sid}" in lines[0] and "INFO" in lines[0]
    for line, (route, stream) in zip(
        lines[1:7], [(r, s) for r in calls for s in (False, True)], strict=True
    ):
        status = "502 in-band" if stream else "502"
        assert f"answered {status} to {harness}{route} code=engine_error" in line, line
        assert f"session={sid}:" in line and address in line and "WARNING" in line, line
    assert f"answered 404 to {harness}chat/completions code=session_not_found" in lines[7]
    assert "session=-" in lines[7]
    assert "answered 404 to GET /v1/sessions/{sid}/calls code=session_not_found" in lines[8]
    assert "session=nope" in lines[8]
