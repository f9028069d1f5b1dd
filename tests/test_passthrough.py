"""Passthrough capture (``turnstile serve --mode passthrough``), a real Turnstile process in
front of a fake vLLM (``return_token_ids``) or SGLang (``sglext`` ids) ``/v1/chat/completions``
that renders prompts itself, with the official ``openai`` client as the harness.

The fake's model samples turn 2's first ``"ab"`` as ``"a"`` + ``"b"`` (same text, not the
canonical tokenization); turn 3's prompt re-tokenizes that reply canonically, so it no longer
extends what was sampled. The tree and the drift report must say exactly that.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

import turnstile_testbed as testbed
from turnstile.testing import toychat
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import MODEL, VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The trainer's token ($TURNSTILE_TOKEN for the servers below); harnesses get base URLs only.
TOKEN = "tst-passthrough-" + secrets.token_urlsafe(16)
AUTH = {"authorization": f"Bearer {TOKEN}"}


class Passthrough:
    """``turnstile serve --mode passthrough`` as a real process."""

    def __init__(self, engine_url: str, data: Path, log: Path, *extra: str, engine: str = "vllm"):
        self.port = testbed.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            "--mode",
            "passthrough",
            "--engine",
            engine,
            "--engine-url",
            engine_url,
            "--model",
            MODEL,
            "--port",
            str(self.port),
            "--data",
            str(data),
            *extra,
        ]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TURNSTILE_TOKEN": TOKEN},
            )
        testbed.wait_healthy(self.url + "/v1/models", self.proc, timeout=60, headers=AUTH)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def session(self) -> str:
        r = httpx.post(self.url + "/v1/sessions", json={"metadata": {}}, headers=AUTH)
        r.raise_for_status()
        return r.json()["id"]

    def base_url(self, sid: str) -> str:
        """The session's base URL (its capability), as the trainer hands it to a harness."""
        return self.get(f"/v1/sessions/{sid}")["base_url"]

    def client(self, sid: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url(sid), api_key="unused", max_retries=0)

    def get(self, path: str) -> dict:
        r = httpx.get(self.url + path, timeout=30, headers=AUTH)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def fake() -> Iterator[VLLMFake]:
    with VLLMFake("0.33.0") as f:
        f.chat.split_turns = {2}
        yield f


@pytest.fixture(scope="module")
def ts(fake: VLLMFake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Passthrough]:
    d = tmp_path_factory.mktemp("passthrough")
    t = Passthrough(fake.url, d / "data", d / "turnstile.log", "--keep-bodies")
    yield t
    t.stop()


@pytest.fixture(scope="module")
def sglang_fake() -> Iterator[SGLangFake]:
    with SGLangFake() as f:
        f.chat.split_turns = {2}
        yield f


@pytest.fixture(scope="module")
def sglang_ts(
    sglang_fake: SGLangFake, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Passthrough]:
    d = tmp_path_factory.mktemp("passthrough-sglang")
    t = Passthrough(
        sglang_fake.url, d / "data", d / "turnstile.log", "--keep-bodies", engine="sglang"
    )
    yield t
    t.stop()


@pytest.fixture(params=["vllm", "sglang"])
def engine(request: pytest.FixtureRequest) -> tuple[str, Passthrough, VLLMFake | SGLangFake]:
    """(engine, Turnstile, its fake) for each engine."""
    if request.param == "vllm":
        return "vllm", request.getfixturevalue("ts"), request.getfixturevalue("fake")
    return ("sglang", request.getfixturevalue("sglang_ts"), request.getfixturevalue("sglang_fake"))


def _logprobs(kind: str, stream: bool, ids: list[int]) -> list[float | None]:
    """What the engine reports for each sampled token: SGLang streams no logprob for the stop
    token (its text is empty, so no chunk carries it)."""
    out: list[float | None] = [toychat.logprob(t, i) for i, t in enumerate(ids)]
    if kind == "sglang" and stream:
        out[-1] = None
    return out


def _chat(client: openai.OpenAI, msgs: list[dict], stream: bool, **kw: object) -> dict:
    """One harness turn; returns the assistant message the harness appends."""
    if not stream:
        r = client.chat.completions.create(model=MODEL, messages=msgs, **kw)
        return r.choices[0].message.model_dump(exclude_none=True)
    text, finish = "", None
    for chunk in client.chat.completions.create(model=MODEL, messages=msgs, stream=True, **kw):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish == "stop"
    return {"role": "assistant", "content": text}


def _conversation(
    ts: Passthrough, fake: VLLMFake | SGLangFake, turns: int, stream: bool
) -> tuple[str, list[dict], list[dict]]:
    sid = ts.session()
    client = ts.client(sid)
    before = len(fake.chat_log)
    msgs: list[dict] = [{"role": "system", "content": "be brief"}]
    for t in range(1, turns + 1):
        msgs.append({"role": "user", "content": f"question {t}"})
        reply = _chat(client, msgs, stream)
        assert reply["content"] == f"reply {t}: ab ab"  # the engine's text, unchanged
        msgs.append(reply)
    return sid, msgs, fake.chat_log[before:]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_drift_on_turn_three_is_located_exactly(engine, stream):
    kind, ts, fake = engine
    sid, msgs, sent = _conversation(ts, fake, 4, stream)
    calls = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    assert len(calls) == len(sent) == 4
    prompts = [s["prompt_token_ids"] for s in sent]
    outs = [s["choices"][0]["token_ids"] for s in sent]
    for c, s in zip(calls, sent, strict=True):
        assert c["status"] == "ok" and c["mode"] == "passthrough"
        ids = s["choices"][0]["token_ids"]
        assert c["completion_ids"] == ids
        want = _logprobs(kind, stream, ids)
        assert [x is None for x in c["completion_logprobs"]] == [x is None for x in want]
        assert [x for x in c["completion_logprobs"] if x is not None] == pytest.approx(
            [x for x in want if x is not None], abs=1e-5
        )
        assert c["engine_request_id"] == s["id"]
        assert c["stop_token_id"] == toychat.IM_END and c["finish_reason"] == "stop"
        assert c["engine"] == f"passthrough-{kind}"
        if kind == "vllm":  # per-token versions from the choice's weight_versions spans
            assert c["weight_version"] == ["default"] * len(ids)
        else:  # SGLang: metadata.weight_version, on whole responses only
            assert c["weight_version"] == (None if stream else "default")
    c1, c2, c3, c4 = calls

    # Turns 1-2 extend: turn 2's prompt starts with turn 1's prompt + completion.
    assert c1["parent_id"] is None and c1["segment_reason"] == "first_call"
    assert c1["prompt_delta_ids"] == prompts[0]
    assert c2["parent_id"] == c1["id"] and c2["segment_reason"] is None
    assert c2["reused_prefix_len"] == len(prompts[0]) + len(outs[0])
    assert c2["prompt_delta_ids"] == prompts[1][c2["reused_prefix_len"] :]

    # Turn 3 drifts: the engine re-tokenized turn 2's reply ("a" + "b" sampled, "ab" now).
    split = toychat.ChatScript().split_index(msgs[:4])
    index = len(prompts[1]) + split
    assert prompts[2][:index] == (prompts[1] + outs[1])[:index]
    assert prompts[2][index] != (prompts[1] + outs[1])[index]
    assert c3["parent_id"] is None and c3["segment_reason"] == "drift"
    assert c3["prompt_delta_ids"] == prompts[2] and c3["reused_prefix_len"] == 0
    d = c3["drift"]
    assert d["call_id"] == c2["id"] and d["at_call_id"] == c2["id"]
    assert d["index"] == index and d["region"] == "completion" and d["offset"] == split
    lo = d["window_start"]
    assert d["recorded"]["ids"] == (prompts[1] + outs[1])[lo : index + 6]
    assert d["received"]["ids"] == prompts[2][lo : index + 6]
    a, b, ab = toychat.char_id("a"), toychat.char_id("b"), toychat.PIECES["ab"]
    assert d["recorded"]["ids"][index - lo : index - lo + 2] == [a, b]
    assert d["received"]["ids"][index - lo] == ab
    assert d["same_text"] is True  # same text, other tokens: retokenization
    assert d["recorded"]["text_from_index"] == "ab ab<|im_end|>"
    assert d["received"]["text_from_index"].startswith("ab ab<|im_end|>\n")
    assert d["recorded"]["text"] == "\nreply 2: ab ab<|im_end|>"
    assert d["received"]["text"].startswith("\nreply 2: ab ab<|im_end|>\n")
    detail = c3["segment_detail"]
    assert f"prompt token {index} is the first that differs" in detail
    assert f"at token {split} of call {c2['id']}'s completion" in detail
    assert f"call {c2['id']}" in detail and "retokenization" in detail

    # Turn 4 extends turn 3.
    assert c4["parent_id"] == c3["id"] and c4["segment_reason"] is None
    assert c4["reused_prefix_len"] == len(prompts[2]) + len(outs[2])
    assert c4["prompt_delta_ids"] == prompts[3][c4["reused_prefix_len"] :]

    # Trajectories are exactly what the engine saw and sampled, one per segment.
    trajs = ts.get(f"/v1/sessions/{sid}/trajectories")["data"]
    assert [t["call_ids"] for t in trajs] == [[c1["id"], c2["id"]], [c3["id"], c4["id"]]]
    first, second = trajs
    assert first["token_ids"] == prompts[1] + outs[1]
    assert second["token_ids"] == prompts[3] + outs[3]
    assert first["segment_reason"] == "first_call" and second["segment_reason"] == "drift"
    assert second["segment_detail"] == detail
    for t, pieces in (
        (first, [(prompts[0], outs[0]), (prompts[1], outs[1])]),
        (second, [(prompts[2], outs[2]), (prompts[3], outs[3])]),
    ):
        mask = [0] * len(pieces[0][0]) + [1] * len(pieces[0][1])
        mask += [0] * (len(pieces[1][0]) - len(mask)) + [1] * len(pieces[1][1])
        assert t["loss_mask"] == mask
        lp = [x for _, out in pieces for x in _logprobs(kind, stream, out)]
        got = [x for x, m in zip(t["logprobs"], mask, strict=True) if m]
        assert [x is None for x in got] == [x is None for x in lp]
        assert [x for x in got if x is not None] == pytest.approx(
            [x for x in lp if x is not None], abs=1e-5
        )
    per_call = ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
    assert [t["token_ids"] for t in per_call] == [p + o for p, o in zip(prompts, outs, strict=True)]


def _normalize(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("id", "created")}


def _sse(r: httpx.Response) -> list[dict]:
    out = []
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(_normalize(orjson.loads(line[6:])))
    return out


ADDED = {
    "vllm": {"return_token_ids", "logprobs", "return_weight_versions"},
    "sglang": {"return_input_ids_in_sglext", "return_output_ids_in_sglext", "logprobs"},
}
ASK_IDS = {
    "vllm": {"return_token_ids": True},
    "sglang": {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True},
}


@pytest.mark.parametrize("asked", ["plain", "logprobs", "token_ids"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_harness_gets_the_engines_own_response(engine, asked, stream):
    """Turnstile's additions (token IDs, logprobs, weight versions) are taken out again:
    the harness gets what the engine answers to the request as the harness sent it."""
    kind, ts, fake = engine
    asked = {
        "plain": {},
        "logprobs": {"logprobs": True, "top_logprobs": 2},
        "token_ids": ASK_IDS[kind],
    }[asked]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 30,
        "stream": stream,
        **asked,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    sid = ts.session()
    with httpx.stream("POST", f"{ts.base_url(sid)}/chat/completions", json=body, timeout=30) as via:
        assert via.status_code == 200
        got = _sse(via) if stream else _normalize(orjson.loads(via.read()))
    with httpx.stream("POST", f"{fake.url}/v1/chat/completions", json=body, timeout=30) as d:
        direct = _sse(d) if stream else _normalize(orjson.loads(d.read()))
    assert got == direct
    sent = fake.chat_log[-2]["body"]  # what the engine received through Turnstile
    assert all(sent[k] is True for k in ADDED[kind])
    assert {k: v for k, v in sent.items() if k not in ADDED[kind]} == {
        k: v for k, v in body.items() if k not in ADDED[kind]
    }
    (call,) = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    assert call["completion_ids"] == fake.chat_log[-2]["choices"][0]["token_ids"]
    assert call["prompt_delta_ids"] == fake.chat_log[-2]["prompt_token_ids"]
    assert set(call["added_fields"]) == ADDED[kind] - set(asked)
    kept = ts.get(f"/v1/sessions/{sid}/calls/{call['id']}/body")
    assert kept["request"] == sent


def test_several_choices_are_sibling_calls(ts, fake):
    sid = ts.session()
    client = ts.client(sid)
    msgs = [{"role": "user", "content": "pick"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, n=2)
    assert [c.message.content for c in r.choices] == ["reply 1: ab ab", "reply 1.1: ab ab"]
    msgs.append(r.choices[1].message.model_dump(exclude_none=True))
    msgs.append({"role": "user", "content": "and?"})
    client.chat.completions.create(model=MODEL, messages=msgs)
    a, b, c = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    sent = fake.chat_log[-2]
    assert a["completion_ids"] == sent["choices"][0]["token_ids"]
    assert b["completion_ids"] == sent["choices"][1]["token_ids"]
    assert a["prompt_delta_ids"] == b["prompt_delta_ids"] == sent["prompt_token_ids"]
    assert c["parent_id"] == b["id"]  # the harness continued the second choice
    assert len(ts.get(f"/v1/sessions/{sid}/trajectories")["data"]) == 2


def test_new_conversations_and_rewritten_history_are_named(ts, fake):
    sid = ts.session()
    client = ts.client(sid)
    msgs = [{"role": "system", "content": "main"}, {"role": "user", "content": "q1"}]
    msgs.append(_chat(client, msgs, False))
    # A subagent: another conversation in the same rollout, sharing no assistant turn.
    _chat(
        client, [{"role": "system", "content": "helper"}, {"role": "user", "content": "x"}], False
    )
    # The harness compacts its history: the assistant turn is not the one sampled.
    edited = [
        *msgs[:2],
        {"role": "assistant", "content": "summary"},
        {"role": "user", "content": "q2"},
    ]
    _chat(client, edited, False)
    first, sub, compacted = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    assert sub["segment_reason"] == "new_conversation" and sub["parent_id"] is None
    assert sub["drift"]["call_id"] == first["id"]
    assert sub["drift"]["region"] == "prompt_delta"
    assert compacted["segment_reason"] == "history_diverged"
    assert compacted["drift"]["call_id"] == first["id"]
    assert compacted["drift"]["region"] == "completion" and compacted["drift"]["offset"] == 0
    assert "the messages continue no recorded call" in compacted["segment_detail"]


def _error(exc: pytest.ExceptionInfo, status: int) -> dict:
    assert isinstance(exc.value, openai.APIStatusError)
    assert exc.value.status_code == status, exc.value.body
    err = exc.value.body
    assert isinstance(err, dict) and err.get("message"), err
    return err


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_engine_errors_reach_the_harness_in_openai_shape(ts, fake, stream):
    sid = ts.session()
    client = ts.client(sid)
    msgs = [{"role": "user", "content": "hi"}]

    def call(**kw: object) -> object:
        r = client.chat.completions.create(
            model=kw.pop("model", MODEL), messages=msgs, stream=stream, **kw
        )
        return list(r) if stream else r

    for status, want in ((500, 502), (503, 503)):
        fake.fail_next = status
        with pytest.raises(openai.APIStatusError) as e:
            call()
        _error(e, want)
    with pytest.raises(openai.APIStatusError) as e:
        call(model="no-such-model")
    assert _error(e, 404)["param"] == "model"  # the engine's own 4xx, relayed
    with pytest.raises(openai.APIStatusError) as e:
        call(max_tokens=100000)
    err = _error(e, 400)
    assert err["param"] == "max_tokens" and "maximum context length" in err["message"]
    calls = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    assert [c["status"] for c in calls] == ["error"] * 4
    assert all(c["completion_ids"] == [] for c in calls)
    assert ts.get(f"/v1/sessions/{sid}/trajectories")["data"] == []


def test_engine_failing_mid_stream_is_reported_in_band_and_recorded(ts, fake):
    sid = ts.session()
    fake.fail_mid_stream = 500
    with pytest.raises(openai.APIError) as e:
        list(
            ts.client(sid).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    assert "Internal server error" in str(e.value)
    (call,) = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    sent = fake.chat_log[-1]
    assert call["status"] == "error" and "500" in call["error"]
    assert call["prompt_delta_ids"] == sent["prompt_token_ids"]  # what came back is kept
    assert call["completion_ids"] == sent["choices"][0]["token_ids"][:1]


def test_engine_down_is_503_never_500(tmp_path):
    dead = f"http://127.0.0.1:{testbed.free_port()}"
    t = Passthrough(dead, tmp_path / "data", tmp_path / "turnstile.log")
    try:
        sid = t.session()
        client = t.client(sid)
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=MODEL, messages=msgs)
        message = _error(e, 503)["message"]
        assert "unreachable" in message
        with pytest.raises(openai.APIStatusError) as e:  # an HTTP status, not an in-band error
            client.chat.completions.create(model=MODEL, messages=msgs, stream=True)
        message += _error(e, 503)["message"]
        assert httpx.get(t.url + "/health").status_code == 503
    finally:
        t.stop()
    # the engine's address is the trainer's to know (the log), never the harness's
    assert "127.0.0.1" not in message and dead.rsplit(":", 1)[1] not in message, message
    assert dead in (tmp_path / "turnstile.log").read_text()


def test_the_tree_survives_a_restart(fake, tmp_path):
    data = tmp_path / "data"
    t = Passthrough(fake.url, data, tmp_path / "a.log")
    try:
        sid = t.session()
        msgs = [{"role": "user", "content": "q1"}]
        msgs.append(_chat(t.client(sid), msgs, False))
    finally:
        t.stop()
    t = Passthrough(fake.url, data, tmp_path / "b.log")
    try:
        msgs.append({"role": "user", "content": "q2"})
        _chat(t.client(sid), msgs, True)
        first, second = t.get(f"/v1/sessions/{sid}/calls")["data"]
        assert second["parent_id"] == first["id"] and second["seq"] == 1
    finally:
        t.stop()


def test_a_harness_that_goes_away_mid_stream_leaves_an_aborted_call(ts, fake):
    sid = ts.session()
    fake.token_delay = 0.1
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream(
            "POST", f"{ts.base_url(sid)}/chat/completions", json=body, timeout=30
        ) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
        deadline = time.monotonic() + 10
        while not (calls := ts.get(f"/v1/sessions/{sid}/calls")["data"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        fake.token_delay = 0.0
    (call,) = calls
    sent = fake.chat_log[-1]
    assert call["status"] == "aborted" and call["error"] == "the client disconnected"
    assert call["prompt_delta_ids"] == sent["prompt_token_ids"]
    out = call["completion_ids"]
    assert len(out) < len(sent["choices"][0]["token_ids"])
    assert out == sent["choices"][0]["token_ids"][: len(out)]


def _arrived(ts: Passthrough) -> float:
    """Calls the HTTP edge is answering (``turnstile_in_flight``): counted from a request's
    arrival, one held at the door included (``/admin/status``'s count starts past it)."""
    r = httpx.get(ts.url + "/metrics", headers=AUTH, timeout=10)
    r.raise_for_status()
    families = text_string_to_metric_families(r.text)
    return sum(s.value for f in families if f.name == "turnstile_in_flight" for s in f.samples)


def _until_in_flight(ts: Passthrough) -> None:
    deadline = time.monotonic() + 30
    while ts.get("/admin/status")["in_flight"] < 1:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.02)


def test_policy_pause_abort_and_resume(ts, fake):
    sid = ts.session()
    client = ts.client(sid)
    results: dict = {}

    def call(key: str) -> None:
        try:
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": key}]
            )
            results[key] = r.choices[0].finish_reason
        except openai.APIStatusError as e:
            results[key] = e.body.get("code") if isinstance(e.body, dict) else e.status_code

    fake.token_delay = 0.2
    try:
        t = threading.Thread(target=call, args=("aborted",))
        t.start()
        _until_in_flight(ts)  # running (it takes seconds at 0.2 s a token), not just sent
        r = httpx.post(
            ts.url + "/admin/pause", json={"mode": "abort"}, timeout=60, headers=AUTH
        ).json()
        t.join(30)
    finally:
        fake.token_delay = 0.0
    assert r["paused"] and r["in_flight"] == 0 and results["aborted"] == "policy_update"
    assert ts.get(f"/v1/sessions/{sid}/calls")["data"][-1]["status"] == "aborted"
    sent = len(fake.chat_log)
    waiting = threading.Thread(target=call, args=("waited",))
    waiting.start()

    def passed() -> tuple:
        """Past the door, at the engine, answered: all (0, 0, False) while it is held."""
        return ts.get("/admin/status")["in_flight"], len(fake.chat_log) - sent, "waited" in results

    # the call arrived (the edge counts it, or it went further) ...
    deadline = time.monotonic() + 30
    while _arrived(ts) < 1 and passed() == (0, 0, False):
        assert time.monotonic() < deadline, "the call never reached the gateway"
        time.sleep(0.02)

    # ... and is held at the door while paused: polled for a second, never past it
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert passed() == (0, 0, False), passed()
        time.sleep(0.02)
    resumed = time.time()
    httpx.post(
        ts.url + "/admin/resume", json={"weight_version": "7"}, headers=AUTH
    ).raise_for_status()
    # the positive control: the same probe sees it reach the engine and answer once resumed
    deadline = time.monotonic() + 30
    while passed()[1:] != (1, True):
        assert time.monotonic() < deadline, passed()
        time.sleep(0.02)
    waiting.join(30)
    assert results["waited"] == "stop"
    last = ts.get(f"/v1/sessions/{sid}/calls")["data"][-1]
    assert last["status"] == "ok" and last["policy_version"] == "7"
    assert last["timings"]["started"] >= resumed  # it started only once resumed


def test_close_aborts_the_sessions_running_calls(ts, fake):
    """Capture mode too: ``POST /v1/sessions/{id}/close`` while a whole and a streamed call of
    the session run (0.5 s a token) stops both, records them ``aborted`` with the reason before
    it answers, and each harness hears its session was closed (a 409, or in-band)."""
    sid = ts.session()
    url = ts.base_url(sid) + "/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    sent = sum(q.path == "/v1/chat/completions" for q in fake.rec.requests)
    fake.token_delay = 0.5
    try:
        with ThreadPoolExecutor(2) as pool:
            whole = pool.submit(httpx.post, url, json=body, timeout=60)
            stream = pool.submit(httpx.post, url, json={**body, "stream": True}, timeout=60)
            deadline = time.monotonic() + 30
            while (
                sum(q.path == "/v1/chat/completions" for q in fake.rec.requests) < sent + 2
                or ts.get("/admin/status")["in_flight"] < 2
            ):
                assert time.monotonic() < deadline, "the calls never reached the engine"
                time.sleep(0.02)
            r = httpx.post(f"{ts.url}/v1/sessions/{sid}/close", json={}, headers=AUTH, timeout=60)
            calls = ts.get(f"/v1/sessions/{sid}/calls")["data"]  # recorded before it answered
            w, s = whole.result(), stream.result()
    finally:
        fake.token_delay = 0.0
    assert r.status_code == 200 and r.json()["status"] == "closed"
    assert sorted(c["status"] for c in calls) == ["aborted", "aborted"]
    assert all("session was closed" in c["error"] for c in calls), calls
    assert w.status_code == 409 and w.json()["error"]["code"] == "session_closed"
    assert s.status_code == 200
    events = [orjson.loads(x[6:]) for x in s.text.splitlines() if x.startswith("data: {")]
    assert events[-1]["error"]["code"] == "session_closed"
    assert ts.get("/admin/status")["in_flight"] == 0


def test_stripping_keeps_what_the_harness_asked_for():
    from turnstile.engines.capture_dialects import (
        Asked,
        SGLangChat,
        VLLMChat,
        strip_chunk,
        strip_response,
    )

    nothing = Asked(False, False, False, False)
    # vLLM sends a chunk for an empty-text token only because ids/logprobs were asked for
    empty = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "delta": {"content": ""},
                "logprobs": {"content": [{"token": "", "logprob": -1.0}]},
                "finish_reason": None,
                "token_ids": [7],
            }
        ],
    }
    assert strip_chunk(orjson.loads(orjson.dumps(empty)), nothing, VLLMChat()) is None
    kept = strip_chunk(
        orjson.loads(orjson.dumps(empty)), Asked(True, True, False, False), VLLMChat()
    )
    assert kept["choices"][0]["token_ids"] == [7] and kept["choices"][0]["logprobs"] is None
    first = {
        "id": "x",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    assert strip_chunk(first, nothing, VLLMChat()) == {"id": "x", "choices": first["choices"]}
    # SGLang: the ids-only chunk goes; one that also carries other sglext fields stays
    ids_only = {
        "choices": [],
        "sglext": {"input_ids": [1], "output_ids": [[2]], "routed_experts": None},
    }
    assert strip_chunk(ids_only, nothing, SGLangChat()) is None
    mixed = {"choices": [], "sglext": {"input_ids": [1], "routed_experts": "AAAA"}}
    assert strip_chunk(mixed, nothing, SGLangChat()) == {
        "choices": [],
        "sglext": {"routed_experts": "AAAA"},
    }
    resp = {
        "prompt_token_ids": [1],
        "choices": [
            {"token_ids": [2], "logprobs": {"content": []}, "weight_versions": [{"version": "1"}]}
        ],
    }
    assert strip_response(resp, nothing, VLLMChat()) == {
        "prompt_token_ids": None,
        "choices": [{"token_ids": None, "logprobs": None, "weight_versions": None}],
    }


def test_replicas_keep_a_session_on_one_engine(tmp_path):
    """Two vLLM 0.32 replicas (no weight_versions there: not asked for); a session's calls all
    go to one, and its tree links across them as on one engine."""
    with VLLMFake("0.32.0") as a, VLLMFake("0.32.0") as b:
        t = Passthrough(a.url, tmp_path / "data", tmp_path / "t.log", "--engine-url", b.url)
        try:
            sids = [t.session() for _ in range(6)]
            for sid in sids:
                msgs = [{"role": "user", "content": sid}]
                msgs.append(_chat(t.client(sid), msgs, False))
                msgs.append({"role": "user", "content": "q2"})
                _chat(t.client(sid), msgs, True)
                first, second = t.get(f"/v1/sessions/{sid}/calls")["data"]
                assert second["parent_id"] == first["id"]
                assert first["added_fields"] == ["return_token_ids", "logprobs"]
                assert first["weight_version"] is None
            served = {
                f.url: [e["body"]["messages"][0]["content"] for e in f.chat_log] for f in (a, b)
            }
            for sid in sids:  # both calls of a session on the same replica
                assert sorted(len([x for x in v if x == sid]) for v in served.values()) == [0, 2]
        finally:
            t.stop()


def test_a_call_that_outlives_a_delete_is_not_recorded_into_the_re_created_id(ts, fake):
    """The session is deleted and created again under the same id while a capture call runs:
    the call's write fails (404 ``session_not_found``, as token-in answers) and the new
    session starts with no calls (it used to get the old incarnation's record)."""
    sid = f"reused-{secrets.token_hex(4)}"

    def create() -> None:
        httpx.post(ts.url + "/v1/sessions", json={"id": sid}, headers=AUTH).raise_for_status()

    create()
    fake.token_delay = 0.2
    out: dict = {}
    sent = len(fake.chat_log)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 40}
    url = f"{ts.url}/s/{sid}/v1/chat/completions"
    t = threading.Thread(
        target=lambda: out.update(r=httpx.post(url, headers=AUTH, json=body, timeout=60))
    )
    try:
        t.start()
        deadline = time.monotonic() + 30
        while len(fake.chat_log) == sent:  # the engine has the call
            assert time.monotonic() < deadline, "the call never reached the engine"
            time.sleep(0.02)
        r = httpx.delete(f"{ts.url}/v1/sessions/{sid}", headers=AUTH)
        assert r.status_code == 200, r.text
        create()  # re-created while the old call still runs
        t.join(60)
    finally:
        fake.token_delay = 0.0
    r = out["r"]
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "session_not_found"
    assert ts.get(f"/v1/sessions/{sid}/calls")["data"] == []


def test_a_harness_that_leaves_a_whole_call_drops_the_engine_call(ts, fake):
    """A non-streamed capture call whose harness goes away: the engine call is dropped at once
    (not run to its end) and recorded as aborted, as token-in does."""
    sid = ts.session()
    fake.token_delay = 0.5
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
    before = len(fake.chat_log)
    began = time.monotonic()
    try:
        with pytest.raises(httpx.ReadTimeout):  # the harness gives up and closes its connection
            httpx.post(f"{ts.base_url(sid)}/chat/completions", json=body, timeout=1.5)
        deadline = time.monotonic() + 20
        while not (calls := ts.get(f"/v1/sessions/{sid}/calls")["data"]):
            assert time.monotonic() < deadline, "the dropped call was never recorded"
            time.sleep(0.05)
        recorded_after = time.monotonic() - began
    finally:
        fake.token_delay = 0.0
    (call,) = calls
    assert call["status"] == "aborted" and call["error"] == "the client disconnected"
    sent = fake.chat_log[before]
    whole = len(sent["choices"][0]["token_ids"]) * 0.5  # what running it to its end takes
    assert whole > 3.0, whole  # the reply is long enough for the check below to mean it
    assert recorded_after < whole - 1.0, (recorded_after, whole)
    assert ts.get("/admin/status")["in_flight"] == 0
