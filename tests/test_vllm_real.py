"""The vLLM adapter against a real vLLM (its CPU build, 0.32) serving SmolLM2-135M-Instruct.

Turnstile → a recording relay → vLLM: each test compares Turnstile's records with what vLLM
received and returned on the wire (the relay), on both token-in routes, streamed and not.
vLLM runs as a user starts it, with ``--enable-scale-out`` (``/inference/v1/generate``),
``--logprobs-mode processed_logprobs`` and a 2048-token context: one server for the module
(30-50 s to start here once cached; one more, on vLLM's defaults, for the ``auto`` test).
Token-in Turnstiles render with Qwen2.5's template (ChatML, as SmolLM2's, but it renders
tools); capture mode lets vLLM render with the model's own. What each test needs is forced
(max_tokens, logit_bias, tool_choice, stop), never left to what the model happens to sample.

The test bed installs vLLM into its own venv on first use (about 4 minutes, once;
``turnstile_testbed.vllm.vllm_python``): where it cannot, the module fails with the reason.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest
from conftest import Turnstile

import turnstile_testbed as testbed
from turnstile.engines import make_engine
from turnstile.engines.base import EngineAdapter
from turnstile.engines.http import EngineUnusable
from turnstile.engines.vllm import SAMPLER_WIRE
from turnstile.testing import relay as wire
from turnstile.testing.relay import Exchange, Relay
from turnstile_testbed import vllm as testbed_vllm

# The slowest call here takes ~40 s; the servers' starts are fixtures, outside the timeout.
pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

END_IDS = (0, 2)  # SmolLM2: <|endoftext|>, <|im_end|>
NO_END = {str(t): -100 for t in END_IDS}  # runs to max_tokens
CONTEXT = 2048
CAT = 2644  # " cat" in SmolLM2's vocabulary (" cat cat" is two of them)
GENERATE, COMPLETIONS = "/inference/v1/generate", "/v1/completions"
CHAT = "/v1/chat/completions"  # capture mode: vLLM renders
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                "required": ["city"],
            },
        },
    }
]


VLLM_PATHS = (GENERATE, COMPLETIONS, CHAT)  # the generation routes whose exchanges are kept


def start_relay(
    upstream: str, paths: tuple[str, ...] = VLLM_PATHS
) -> tuple[Relay, ThreadingHTTPServer]:
    """The suite's recording relay (``turnstile.testing.relay``) to vLLM, keeping the
    generation routes' exchanges (and every ``/abort_requests`` body)."""
    return wire.start_relay(upstream, paths=paths)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """SmolLM2 as a Hugging Face directory; installing vLLM on first use. Fails (never skips)
    with the reason where vLLM cannot be installed."""
    t = time.monotonic()
    path = testbed_vllm.vllm_model()
    print(f"[vllm] venv + model ready in {time.monotonic() - t:.0f} s", file=sys.stderr)
    return path


@pytest.fixture(scope="module")
def vllm(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM with the token-in route and the sampling distribution's logprobs
    (``$TURNSTILE_VLLM_URL``: one already running so, while working on these tests)."""
    if os.environ.get("TURNSTILE_VLLM_URL"):
        yield os.environ["TURNSTILE_VLLM_URL"]
        return
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    t = time.monotonic()
    extra = ["--enable-scale-out", "--logprobs-mode", "processed_logprobs"]
    extra += ["--max-model-len", str(CONTEXT)]  # SmolLM2's 8192 is slow to fill on a CPU
    dev = {"VLLM_SERVER_DEV_MODE": "1"}  # /pause, /resume, /is_paused (RL weight updates)
    with testbed_vllm.vllm_server(model_dir, extra, log=log, env=dev) as url:
        print(f"[vllm] server up in {time.monotonic() - t:.0f} s ({log})", file=sys.stderr)
        yield url


@pytest.fixture(scope="module")
def relay(vllm: str) -> Iterator[Relay]:
    rel, server = start_relay(vllm)
    yield rel
    server.shutdown()
    server.server_close()


def _turnstile(relay: Relay, model_dir: Path, tmp: Path, *extra: str) -> Turnstile:
    template = testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    args = ("--engine", "vllm", "--chat-template", str(template), *extra)
    return Turnstile(relay.url, model_dir, tmp / "data", tmp / "turnstile.log", args).start()


@pytest.fixture(scope="module")
def ts(relay: Relay, model_dir: Path, tmp_path_factory) -> Iterator[Turnstile]:
    """Turnstile on its defaults (``--vllm-api auto``), told vLLM's logprobs mode."""
    t = _turnstile(
        relay, model_dir, tmp_path_factory.mktemp("ts"), "--engine-logprobs-mode",
        "processed_logprobs",
    )  # fmt: skip
    yield t
    t.stop()


@pytest.fixture(scope="module")
def ts_completions(relay: Relay, model_dir: Path, tmp_path_factory) -> Iterator[Turnstile]:
    """The same vLLM through ``/v1/completions`` (``--vllm-api completions``)."""
    t = _turnstile(
        relay, model_dir, tmp_path_factory.mktemp("tsc"), "--vllm-api", "completions",
        "--engine-logprobs-mode", "processed_logprobs",
    )  # fmt: skip
    yield t
    t.stop()


def _client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0, timeout=180)


_wedged: list[str] = []  # the test after which vLLM stopped answering


@pytest.fixture(autouse=True)
def _vllm_still_answers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Once a test here has run past two minutes, vLLM (one CPU server for the module) is
    taken as wedged: the tests after it fail at once, naming that test, instead of each
    waiting out its timeout (CI once ran out of time so)."""
    if _wedged:
        pytest.fail(f"vLLM stopped answering during {_wedged[0]}; not run")
    began = time.monotonic()
    yield
    if time.monotonic() - began > 120:
        _wedged.append(request.node.nodeid)


def _sampled(ex: Exchange) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """What vLLM sampled, as it said so: token ids, their logprobs, each step's top list."""
    if ex.path == GENERATE:
        parts = ex.parts()
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        for part in parts:
            for ch in part.get("choices") or []:
                ids += ch.get("token_ids") or []
                for e in (ch.get("logprobs") or {}).get("content") or []:
                    lps.append(e["logprob"])
                    tops.append([(t["token_id"], t["logprob"]) for t in e["top_logprobs"]])
        return ids, lps, tops
    parts = ex.parts()
    ids, lps, tops = [], [], []
    for part in parts:
        for ch in part.get("choices") or []:
            ids += ch.get("token_ids") or []
            lp = ch.get("logprobs") or {}
            lps += lp.get("token_logprobs") or []
            for d in lp.get("top_logprobs") or []:
                tops.append([(int(k.split(":")[1]), v) for k, v in (d or {}).items()])
    return ids, lps, tops


def _prompt(ex: Exchange) -> list[int]:
    return ex.request["token_ids"] if ex.path == GENERATE else ex.request["prompt"]


def _chat(
    client: openai.OpenAI, stream: bool, model: str = "m", **kw: object
) -> tuple[str, list, str]:
    """Text, logprob entries and finish reason of one chat completion."""
    if not stream:
        r = client.chat.completions.create(model=model, **kw)
        c = r.choices[0]
        return c.message.content or "", (c.logprobs.content if c.logprobs else []), c.finish_reason
    text, entries, finish = "", [], None
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        if chunk.choices:
            c = chunk.choices[0]
            text += c.delta.content or ""
            entries += c.logprobs.content if c.logprobs and c.logprobs.content else []
            finish = c.finish_reason or finish
    return text, entries, finish


@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_token_in_records_and_logprobs_are_what_vllm_received_and_sampled(
    request, relay, route, stream
):
    """Token IDs in, token IDs out; under temperature 0.7 / top_p 0.9 the recorded and
    answered logprobs are vLLM's processed ones (the sampling distribution's)."""
    t = request.getfixturevalue("ts" if route == GENERATE else "ts_completions")
    session = t.session(test="token-in")
    before = len(relay.exchanges)
    text, entries, finish = _chat(
        _client(session),
        stream,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=12,
        temperature=0.7,
        top_p=0.9,
        seed=5,
        logprobs=True,
        top_logprobs=3,
        logit_bias=NO_END,
    )
    (ex,) = relay.wait(before + 1)[before:]
    assert ex.path == route and ex.status == 200
    sent = ex.request if route == COMPLETIONS else ex.request["sampling_params"]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.7, 0.9, 12)
    assert sent["top_k"] in (0, -1) and sent["repetition_penalty"] == 1.0
    assert ex.request["stream"] is stream

    ids, lps, tops = _sampled(ex)
    assert len(ids) == 12 and finish == "length"
    assert not set(ids) & set(END_IDS)  # the bias held
    (call,) = t.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert call["status"] == "ok"
    assert call["reused_prefix_len"] + len(call["prompt_delta_ids"]) == len(_prompt(ex))
    assert _prompt(ex)[call["reused_prefix_len"] :] == call["prompt_delta_ids"]
    assert call["completion_ids"] == ids
    if route == GENERATE:  # 0.32's spans of the weights each token was sampled with
        parts = ex.parts()
        spans = [sp for p in parts for c in p["choices"] for sp in c.get("weight_versions") or []]
        assert spans == [{"version": "default", "start": 0, "end": 12}]
        assert call["weight_version"] == ["default"] * 12
    (traj,) = t.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert traj["token_ids"] == _prompt(ex) + ids
    assert traj["logprobs"][len(_prompt(ex)) :] == pytest.approx(lps, abs=1e-6)
    # what the harness got: vLLM's logprobs and its true top 3
    assert [e.logprob for e in entries] == pytest.approx(lps, abs=1e-6)
    for e, top in zip(entries, tops, strict=True):
        best = sorted(top, key=lambda p: -p[1])[:3]
        assert [x.logprob for x in e.top_logprobs] == pytest.approx([p[1] for p in best], abs=1e-6)
    assert text  # detokenized by Turnstile


def test_multi_turn_forced_tool_call_is_chained_exactly(ts, relay):
    """tool_choice required (a grammar vLLM enforces), the tool's result, one more turn: each
    prompt vLLM got starts with the previous prompt and exactly the tokens it sampled."""
    session = ts.session(test="tools")
    client = _client(session)
    before = len(relay.exchanges)
    msgs: list[dict] = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    r = client.chat.completions.create(
        model="m",
        messages=msgs,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # one call, then the grammar lets only an end token through
        max_tokens=60,
        seed=1,
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", msg
    (tc,) = msg.tool_calls
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments)["city"] in ("Paris", "Tokyo")
    msgs += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": '{"temp_c": 21, "sky": "clear"}'},
    ]
    r2 = client.chat.completions.create(
        model="m", messages=msgs, tools=TOOLS, max_tokens=10, seed=2, logit_bias=NO_END
    )
    msgs += [{"role": "assistant", "content": r2.choices[0].message.content}]
    msgs += [{"role": "user", "content": "Thanks!"}]
    client.chat.completions.create(
        model="m", messages=msgs, tools=TOOLS, max_tokens=5, seed=3, logit_bias=NO_END
    )
    exs = relay.wait(before + 3)[before:]
    assert [e.path for e in exs] == [GENERATE] * 3
    assert "structured_outputs" in exs[0].request["sampling_params"]  # the forced call
    assert "grammar" in exs[0].request["sampling_params"]["structured_outputs"]
    for prev, nxt in zip(exs, exs[1:], strict=False):
        chained = _prompt(prev) + _sampled(prev)[0]
        assert _prompt(nxt)[: len(chained)] == chained
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["parent_id"] for c in calls] == [None, calls[0]["id"], calls[1]["id"]]
    assert [c["completion_ids"] for c in calls] == [_sampled(e)[0] for e in exs]
    (traj,) = ts.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert traj["token_ids"] == _prompt(exs[-1]) + _sampled(exs[-1])[0]
    assert traj["segment_reason"] == "first_call"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stop_string_ends_the_call_where_vllm_ended_it(ts, relay, stream):
    """ " cat" forced (+100) at every step, stop at "cat cat": vLLM detokenizes (it was
    sent ``detokenize``), stops on the string and says so; the record keeps the tokens it
    sampled, the harness gets the text before the stop string."""
    session = ts.session(test="stop")
    before = len(relay.exchanges)
    text, _, finish = _chat(
        _client(session),
        stream,
        messages=[{"role": "user", "content": "Say cat."}],
        max_tokens=20,
        stop=["cat cat"],
        logit_bias={str(CAT): 100},
    )
    (ex,) = relay.wait(before + 1)[before:]
    sp = ex.request["sampling_params"]
    assert sp["stop"] == ["cat cat"] and sp["detokenize"] is True
    ids, _, _ = _sampled(ex)
    assert ids and set(ids) == {CAT} and len(ids) < 20
    parts = ex.parts()
    ends = [c for part in parts for c in part.get("choices") or [] if c.get("finish_reason")]
    stop_reason = [c.get("stop_reason") for c in ends]
    assert stop_reason == ["cat cat"]
    assert finish == "stop"
    assert "cat cat" not in text
    (call,) = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert call["completion_ids"] == ids


def test_max_tokens_is_cut_to_the_room_left_in_the_context(ts, relay):
    """A prompt a few tokens short of ``--max-model-len`` with max_tokens 100: vLLM is asked
    for exactly the room left (it would refuse more) and fills the context; a prompt that
    fills it is Turnstile's 400, and vLLM never sees it."""
    session = ts.session(test="context")
    client = _client(session)
    before = len(relay.exchanges)

    def ask(words: int, max_tokens: int) -> object:
        messages = [{"role": "user", "content": "hello" + " hello" * (words - 1)}]
        return client.chat.completions.create(
            model="m", messages=messages, max_tokens=max_tokens, logit_bias=NO_END
        )

    ask(100, 1)
    (probe,) = relay.wait(before + 1)[before:]
    overhead = len(_prompt(probe)) - 100  # the template's tokens around one " hello" each
    room = 7
    r = ask(CONTEXT - overhead - room, 100)
    (ex,) = relay.wait(before + 2)[before + 1 :]
    assert len(_prompt(ex)) == CONTEXT - room
    assert ex.request["sampling_params"]["max_tokens"] == room
    assert len(_sampled(ex)[0]) == room and r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == CONTEXT
    with pytest.raises(openai.BadRequestError) as e:
        ask(CONTEXT - overhead, 1)
    assert "context" in str(e.value)
    assert len(relay.exchanges) == before + 2  # not sent


@pytest.fixture(scope="module")
def ts_capture(relay: Relay, model_dir: Path, tmp_path_factory) -> Iterator[Turnstile]:
    """Capture mode: vLLM renders with the model's own template, Turnstile records the IDs."""
    tmp = tmp_path_factory.mktemp("capture")
    args = ("--mode", "passthrough", "--engine", "vllm")
    t = Turnstile(relay.url, model_dir, tmp / "data", tmp / "turnstile.log", args).start()
    yield t
    t.stop()


def _chat_ids(ex: Exchange) -> tuple[list[int], list[int]]:
    """Prompt and sampled IDs vLLM's Chat Completions returned (``return_token_ids``)."""
    parts = ex.parts()
    prompt = next(p["prompt_token_ids"] for p in parts if p.get("prompt_token_ids"))
    out = [t for p in parts for c in p.get("choices") or [] for t in c.get("token_ids") or []]
    return prompt, out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_capture_mode_records_the_ids_vllm_rendered_and_sampled(
    ts_capture, relay, model_dir, stream
):
    """Two turns through vLLM's own rendering: each record is vLLM's prompt and sampled IDs
    and their logprobs; turn 2 extends turn 1 (a reply of " cat"s re-tokenizes as sampled)."""
    session = ts_capture.session(test="capture")
    client = _client(session)
    before = len(relay.exchanges)
    msgs: list[dict] = [{"role": "user", "content": "Say cat."}]
    for _ in range(2):
        text, _, finish = _chat(
            client, stream, str(model_dir), messages=msgs, max_tokens=4, logprobs=True,
            logit_bias={str(CAT): 100},
        )  # fmt: skip
        assert finish == "length"
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
    exs = relay.wait(before + 2)[before:]
    assert [e.path for e in exs] == [CHAT, CHAT]
    calls = ts_capture.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["mode"] for c in calls] == ["passthrough"] * 2
    (p1, o1), (p2, o2) = (_chat_ids(e) for e in exs)
    assert o1 == o2 == [CAT] * 4
    for c, ex in zip(calls, exs, strict=True):
        prompt, out = _chat_ids(ex)
        assert c["reused_prefix_len"] + len(c["prompt_delta_ids"]) == len(prompt)
        assert c["completion_ids"] == out
        parts = ex.parts()
        lps = [
            e["logprob"]
            for p in parts
            for ch in p.get("choices") or []
            for e in (ch.get("logprobs") or {}).get("content") or []
        ]
        assert c["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
    assert calls[1]["parent_id"] == calls[0]["id"]
    assert calls[1]["reused_prefix_len"] == len(p1) + len(o1)
    assert p2[: len(p1) + len(o1)] == p1 + o1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_request_vllm_refuses_is_its_400_to_the_harness(ts, relay, stream):
    """An out-of-vocabulary logit_bias: vLLM's own 400 and message reach the harness (in the
    stream when streamed, as vLLM itself answers), and nothing is recorded as a sample."""
    session = ts.session(test="refused")
    before = len(relay.exchanges)
    with pytest.raises(openai.APIError if stream else openai.BadRequestError) as e:
        _chat(
            _client(session), stream, messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3, logit_bias={"999999": 5},
        )  # fmt: skip
    (ex,) = relay.wait(before + 1)[before:]
    # vLLM itself refuses a stream in the stream: 200, then one error object
    assert ex.status == (200 if stream else 400)
    said = (ex.chunks[0] if stream else ex.response)["error"]["message"]
    assert "out-of-vocab" in said and said in str(e.value)
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert all(c["status"] != "ok" and not c["completion_ids"] for c in calls), calls


def _get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


def test_pause_and_resume_reach_vllm(ts, relay, vllm):
    """The trainer's pause (drain) pauses vLLM itself (``/pause?mode=wait``, dev mode), its
    resume resumes it, and the next call samples as before."""
    assert _get(vllm + "/is_paused") == {"is_paused": False}
    r = ts.http.post(ts.url + "/admin/pause", json={"mode": "drain", "timeout": 10})
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is True and r.json()["in_flight"] == 0
    assert "/pause?mode=wait: 200" in json.dumps(r.json()["engines"])
    assert _get(vllm + "/is_paused") == {"is_paused": True}
    r = ts.http.post(ts.url + "/admin/resume", json={})
    assert r.status_code == 200, r.text
    assert "/resume: 200" in json.dumps(r.json())
    assert _get(vllm + "/is_paused") == {"is_paused": False}
    session = ts.session(test="resumed")
    before = len(relay.exchanges)
    _, _, finish = _chat(
        _client(session), False, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        logit_bias=NO_END,
    )  # fmt: skip
    assert finish == "length"
    assert len(_sampled(relay.wait(before + 1)[before])[0]) == 3


def _metric(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_gone_mid_call_aborts_the_request_in_vllm(ts, relay, vllm):
    """The harness hangs up three chunks into a 4000-token stream (minutes of generation
    here): vLLM stops it at once. vLLM 0.32 counts an aborted request in no finished counter
    (``request_success_total{finished_reason="abort"}`` stays 0), so the proof is that
    nothing is running seconds later while no request finished, and Turnstile's abort by id
    (``/inference/v1/abort_requests``, which 0.32 serves with scale-out) was accepted."""
    session = ts.session(test="abort")
    finished = _metric(vllm, "vllm:request_success_total")
    before = len(relay.exchanges)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 4000,
        "stream": True,
        "logit_bias": NO_END,
    }
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", session["base_url"] + "/chat/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen >= 3:
                    break  # and the connection is closed, mid-generation
    hung_up = time.monotonic()
    (ex,) = relay.wait(before + 1, timeout=60)[before:]
    while _metric(vllm, "vllm:num_requests_running") and time.monotonic() - hung_up < 30:
        time.sleep(0.2)
    assert _metric(vllm, "vllm:num_requests_running") == 0
    assert time.monotonic() - hung_up < 30  # 4000 tokens take minutes on this CPU
    assert _metric(vllm, "vllm:request_success_total") == finished  # stopped, not finished
    assert len(_sampled(ex)[0]) < 4000
    # the abort by id is sent in the background (the closed connection alone already stops
    # vLLM, which may beat it): it reaches vLLM within seconds
    rid = f"generate-tokens-{ex.request['request_id']}"
    deadline = time.monotonic() + 15
    while not (aborts := [a for a in relay.aborts if rid in a[0].get("request_ids", [])]):
        assert time.monotonic() < deadline, relay.aborts
        time.sleep(0.1)
    assert aborts[0][1] == 200, aborts
    deadline = time.monotonic() + 30
    while not (calls := ts.get(f"/v1/sessions/{session['id']}/calls")["data"]):
        assert time.monotonic() < deadline, "the cancelled call was never recorded"
        time.sleep(0.2)
    (call,) = calls
    assert call["status"] != "ok", call
    assert call["completion_ids"] == _sampled(ex)[0][: len(call["completion_ids"])]


@pytest.fixture(scope="module")
def vllm_defaults(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second vLLM, on vLLM's defaults (no scale-out, raw logprobs, the model's 8192
    tokens): the ``auto`` route test and the second replica of the pool test
    (``$TURNSTILE_VLLM_DEFAULTS_URL``: one already running so)."""
    if os.environ.get("TURNSTILE_VLLM_DEFAULTS_URL"):
        yield os.environ["TURNSTILE_VLLM_DEFAULTS_URL"]
        return
    log = tmp_path_factory.mktemp("vllm-defaults") / "vllm.log"
    t = time.monotonic()
    with testbed_vllm.vllm_server(model_dir, [], log=log) as url:
        print(f"[vllm] defaults server up in {time.monotonic() - t:.0f} s ({log})", file=sys.stderr)
        yield url


async def _start(engine: EngineAdapter) -> None:
    try:
        await engine.start()
    finally:
        await engine.close()


def test_auto_picks_completions_on_a_vllm_started_on_its_defaults(
    model_dir, vllm_defaults, tmp_path_factory
):
    """vLLM 0.32 without --enable-scale-out answers 403 on /inference/v1/generate:
    ``--vllm-api auto`` (the default) says so at start and generates through
    /v1/completions instead of answering 502 per call; a forced ``--vllm-api generate``
    refuses to start and says how to fix vLLM (the adapter's EngineUnusable, with which
    ``turnstile serve`` exits: tests/test_engine_vllm.py)."""
    tmp = tmp_path_factory.mktemp("vllm-defaults-auto")
    rel, server = start_relay(vllm_defaults)
    try:
        t = _turnstile(rel, model_dir, tmp)
        try:
            session = t.session(test="defaults")
            _, _, finish = _chat(
                _client(session), False,
                messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                logit_bias=NO_END,
            )  # fmt: skip
            assert finish == "length"
        finally:
            t.stop()
        # the start's probes (empty bodies: refused before anything is generated), then the call
        probes_and_call = [(GENERATE, 403), (COMPLETIONS, 400), (COMPLETIONS, 200)]
        assert [(e.path, e.status) for e in rel.exchanges] == probes_and_call
        assert "--enable-scale-out" in rel.exchanges[0].response["error"]["message"]
        log = t.log.read_text()
        assert re.search(
            r"generating through /v1/completions \(/inference/v1/generate answered 403", log
        )
        with pytest.raises(EngineUnusable) as forced:  # what `serve` exits with, saying it
            asyncio.run(_start(make_engine("vllm", rel.url, api="generate")))
    finally:
        server.shutdown()
        server.server_close()
    said = str(forced.value)
    assert "serves no token-in route" in said
    assert "/inference/v1/generate answered 403" in said and "--enable-scale-out" in said
    assert [(e.path, e.status) for e in rel.exchanges[3:]] == [(GENERATE, 403)]  # one probe


def _detokenize(vllm: str, ids: list[int]) -> str:
    """vLLM's own text for token IDs (``/detokenize``, the served model's tokenizer)."""
    model = _get(vllm + "/v1/models")["data"][0]["id"]
    r = httpx.post(vllm + "/detokenize", json={"model": model, "tokens": ids}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def _check_chain(t: Turnstile, session: dict, exs: list[Exchange], dialect: str) -> list[dict]:
    """Each record is what vLLM received and sampled (ids, logprobs), each prompt extends the
    one before by exactly what was sampled, and the calls are one lineage."""
    calls = t.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["dialect"] for c in calls] == [dialect] * len(exs)
    assert [c["parent_id"] for c in calls] == [None, *(c["id"] for c in calls[:-1])]
    for c, ex in zip(calls, exs, strict=True):
        ids, lps, _ = _sampled(ex)
        assert c["status"] == "ok"
        assert c["reused_prefix_len"] + len(c["prompt_delta_ids"]) == len(_prompt(ex))
        assert _prompt(ex)[c["reused_prefix_len"] :] == c["prompt_delta_ids"]
        assert c["completion_ids"] == ids
        assert c["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
    for prev, nxt in zip(exs, exs[1:], strict=False):
        chained = _prompt(prev) + _sampled(prev)[0]
        assert _prompt(nxt)[: len(chained)] == chained
    (traj,) = t.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert traj["token_ids"] == _prompt(exs[-1]) + _sampled(exs[-1])[0]
    return calls


def test_processed_logprobs_are_the_sampling_distributions(ts, relay):
    """top_p 0.01 leaves one candidate per step: its processed logprob is 0 (the raw one
    would be the model's, below 0). What vLLM answered, what was recorded and what the
    harness got are that: the sampling distribution's logprobs, not the model's."""
    session = ts.session(test="processed")
    before = len(relay.exchanges)
    _, entries, _ = _chat(
        _client(session), False, messages=[{"role": "user", "content": "Count: one, two,"}],
        max_tokens=6, temperature=0.8, top_p=0.01, seed=9, logprobs=True, logit_bias=NO_END,
    )  # fmt: skip
    (ex,) = relay.wait(before + 1)[before:]
    assert ex.request["sampling_params"]["top_p"] == 0.01
    ids, lps, _ = _sampled(ex)
    assert len(ids) == 6 and lps == pytest.approx([0.0] * 6, abs=1e-5)
    (call,) = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert call["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
    assert call["logprob_kind"] == "processed_logprobs"
    assert [e.logprob for e in entries] == pytest.approx(lps, abs=1e-6)


def test_responses_dialect_turns_are_recorded_as_vllm_sampled(ts, relay, vllm):
    """OpenAI Responses, two turns chained by previous_response_id (the second streamed),
    sampled at temperature 0.7 / top_p 0.9 with logprobs: each record is vLLM's prompt and
    sampled IDs and logprobs, the second prompt extends the first, and the harness's text
    and logprobs are vLLM's (its own /detokenize of the sampled IDs)."""
    session = ts.session(test="responses")
    client = _client(session)
    before = len(relay.exchanges)
    common: dict = dict(
        model="m", max_output_tokens=8, temperature=0.7, top_p=0.9,
        include=["message.output_text.logprobs"], top_logprobs=2,
        instructions="Be brief.",  # not inherited through previous_response_id (OpenAI's rule)
    )  # fmt: skip
    r1 = client.responses.create(
        **common, input="Name a colour.",
        extra_body={"seed": 7, "logit_bias": NO_END},
    )  # fmt: skip
    assert r1.status == "incomplete" and r1.incomplete_details.reason == "max_output_tokens"
    r2 = None
    with client.responses.stream(
        **common, previous_response_id=r1.id, input=[{"role": "user", "content": "Another."}],
        extra_body={"seed": 8, "logit_bias": NO_END},
    ) as stream:  # fmt: skip
        for ev in stream:
            if ev.type == "response.incomplete":
                r2 = ev.response
    assert r2 is not None and r2.previous_response_id == r1.id
    exs = relay.wait(before + 2)[before:]
    assert [(e.path, e.request["stream"]) for e in exs] == [(GENERATE, False), (GENERATE, True)]
    sp = exs[0].request["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["max_tokens"]) == (0.7, 0.9, 8)
    _check_chain(ts, session, exs, "responses")
    for r, ex in zip((r1, r2), exs, strict=True):
        ids, lps, _ = _sampled(ex)
        assert r.output_text == _detokenize(vllm, ids)
        (part,) = r.output[0].content
        assert [lp.logprob for lp in part.logprobs] == pytest.approx(lps, abs=1e-6)
        assert r.usage.output_tokens == len(ids) == 8


def test_messages_dialect_turns_are_recorded_as_vllm_sampled(ts, relay, vllm):
    """Anthropic Messages, two turns (the second streamed) at temperature 0.7 / top_p 0.9:
    each record is vLLM's prompt and sampled IDs and logprobs, the second prompt extends the
    first, and the harness's text is vLLM's own detokenization of what it sampled."""
    import anthropic

    session = ts.session(test="messages")
    capability = session["base_url"].split("/s/")[1].split("/")[0]
    client = anthropic.Anthropic(base_url=ts.url, api_key=capability, max_retries=0)
    before = len(relay.exchanges)
    common: dict = dict(model="m", max_tokens=8, system="Be brief.")
    sampling = {"temperature": 0.7, "top_p": 0.9, "logit_bias": NO_END}  # (not in this SDK's
    msgs: list[dict] = [{"role": "user", "content": "Name a colour."}]  # signature)
    m1 = client.messages.create(**common, messages=msgs, extra_body={"seed": 7, **sampling})
    assert m1.stop_reason == "max_tokens"
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
        {"role": "user", "content": "Another."},
    ]
    with client.messages.stream(
        **common, messages=msgs, extra_body={"seed": 8, **sampling}
    ) as stream:
        m2 = stream.get_final_message()
    assert m2.stop_reason == "max_tokens"
    exs = relay.wait(before + 2)[before:]
    assert [(e.path, e.request["stream"]) for e in exs] == [(GENERATE, False), (GENERATE, True)]
    sp = exs[1].request["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["max_tokens"]) == (0.7, 0.9, 8)
    _check_chain(ts, session, exs, "messages")
    for m, ex in zip((m1, m2), exs, strict=True):
        ids, _, _ = _sampled(ex)
        assert m.content[0].text == _detokenize(vllm, ids)
        assert m.usage.output_tokens == len(ids) == 8
        assert m.usage.input_tokens == len(_prompt(ex))


def test_the_live_vllm_still_answers_as_the_golden_file(vllm, vllm_defaults):
    """The answers the vLLM fake is held to (tests/fakes/golden, tests/test_vllm_golden.py)
    are still this server's: every case asked again, its structure compared."""
    from fakes import vllm_golden as g

    golden = g.load()
    model = _get(vllm + "/v1/models")["data"][0]["id"]
    assert _get(vllm + "/version")["version"] == golden["vllm"]
    diffs: list[str] = []
    with httpx.Client(timeout=120) as client:
        for case in g.cases(model):
            got = g.answer(client, vllm if case.server == g.MAIN else vllm_defaults, case)
            diffs += g.differences(golden["cases"][case.name], got, case.name)
    assert not diffs, "\n".join(diffs)


def test_two_replicas_keep_each_session_on_one_and_record_exactly(
    model_dir, relay, vllm_defaults, tmp_path_factory
):
    """A pool of the two vLLMs (``--engine-url`` twice): one serves /inference/v1/generate,
    the other only /v1/completions (each replica picks its route at start). Sessions are
    added until both replicas have some; each session's two calls go to one replica, and
    each record is what that replica received and sampled."""
    rel_b, server_b = start_relay(vllm_defaults)
    tmp = tmp_path_factory.mktemp("replicas")
    template = testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    args = ("--engine", "vllm", "--chat-template", str(template))
    t = Turnstile([relay.url, rel_b.url], model_dir, tmp / "data", tmp / "ts.log", args).start()
    relays = {GENERATE: relay, COMPLETIONS: rel_b}
    used: dict[str, int] = {GENERATE: 0, COMPLETIONS: 0}
    try:
        for n in range(12):
            if n >= 2 and all(used.values()):
                break
            session = t.session(test=f"replica-{n}")
            client = _client(session)
            marks = {k: len(r.exchanges) for k, r in relays.items()}
            msgs: list[dict] = [{"role": "user", "content": f"Say {n}."}]
            for turn in range(2):
                text, _, _ = _chat(
                    client, turn == 1, messages=msgs, max_tokens=4, seed=n,
                    logprobs=True, logit_bias=NO_END,
                )  # fmt: skip
                msgs += [{"role": "assistant", "content": text}]
                msgs += [{"role": "user", "content": "More."}]
            got = {k: r.exchanges[marks[k] :] for k, r in relays.items()}
            (route,) = [k for k, exs in got.items() if exs]  # one replica, not both
            exs = relays[route].wait(marks[route] + 2)[marks[route] :]
            assert [e.path for e in exs] == [route, route]
            used[route] += 1
            calls = _check_chain(t, session, exs, "chat")
            assert {c["engine_url"] for c in calls} == {relays[route].url}
    finally:
        t.stop()
        server_b.shutdown()
        server_b.server_close()
    assert all(used.values()), used


def test_weight_versions_are_the_ones_vllm_reports(ts, relay, vllm):
    """A trainer's weight update as vLLM 0.32 takes it: Turnstile pauses (vLLM drained), the
    trainer names the new weights on vLLM (``/update_weight_version``, dev mode), Turnstile
    resumes with that version. The next call's tokens are recorded with vLLM's version;
    a version changed while a stream runs splits the call where vLLM's spans say (vLLM frozen
    with ``/pause?mode=keep`` meanwhile, as a trainer updating weights mid-stream does)."""
    session = ts.session(test="weights")
    client = _client(session)

    def name(version: str) -> None:
        r = httpx.post(vllm + "/update_weight_version", json={"new_version": version})
        assert r.status_code == 200 and r.json()["new_version"] == version

    try:
        assert ts.http.post(ts.url + "/admin/pause", json={"mode": "drain"}).status_code == 200
        name("step-1")
        r = ts.http.post(ts.url + "/admin/resume", json={"weight_version": "step-1"})
        assert r.status_code == 200 and r.json()["weight_version"] == "step-1"
        assert _get(vllm + "/weight_info") == {"weight_version": "step-1"}
        before = len(relay.exchanges)
        _chat(client, False, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
              logit_bias=NO_END)  # fmt: skip
        (ex,) = relay.wait(before + 1)[before:]
        (choice,) = ex.response["choices"]
        assert choice["weight_versions"] == [{"version": "step-1", "start": 0, "end": 5}]
        # a stream under way when the version changes: vLLM reports two spans. The version
        # changes once the client has read 5 chunks, with vLLM frozen (``/pause?mode=keep``) so
        # the split cannot race; where vLLM had already finished the stream by then (a loaded
        # machine's client falls behind), the attempt proves nothing and a longer one follows.
        for n in (300, 900, 1800):
            before = len(relay.exchanges)
            body = {
                "model": "m", "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": n, "stream": True, "logit_bias": NO_END,
            }  # fmt: skip
            finished = _metric(vllm, "vllm:request_success_total")
            ran_on = False
            with httpx.Client(timeout=120) as http:
                with http.stream("POST", session["base_url"] + "/chat/completions", json=body) as s:
                    seen = 0
                    for line in s.iter_lines():
                        seen += line.startswith("data: {")
                        if seen == 5:
                            r = httpx.post(vllm + "/pause", params={"mode": "keep"})
                            assert r.status_code == 200, r.text
                            time.sleep(0.5)  # outputs already sampled reach the counter
                            ran_on = _metric(vllm, "vllm:request_success_total") == finished
                            name("step-2")
                            assert httpx.post(vllm + "/resume").status_code == 200
            (ex2,) = relay.wait(before + 1)[before:]
            if ran_on:
                break
            name("step-1")  # vLLM finished first: again, longer
        else:
            pytest.fail("vLLM finished each stream before the client read 5 chunks")
        spans = [
            sp for c in ex2.chunks for ch in c["choices"] for sp in ch.get("weight_versions") or []
        ]
        assert [sp["version"] for sp in spans] == ["step-1", "step-2"], spans
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] > 0
        assert spans[1]["end"] == n
        calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
        expected = [
            ["step-1"] * 5,
            ["step-1"] * spans[0]["end"] + ["step-2"] * (n - spans[0]["end"]),
        ]
        assert [c["weight_version"] for c in (calls[0], calls[-1])] == expected
        assert calls[-1]["completion_ids"] == _sampled(ex2)[0]
    finally:
        name("default")
        ts.http.post(ts.url + "/admin/resume", json={"weight_version": "default"})


def test_a_held_stream_goes_on_from_its_partial_output(ts, relay, vllm):
    """``POST /admin/pause {"mode": "hold"}`` mid-stream (issue 44): Turnstile cuts vLLM's
    request at a token boundary, holds the call while the trainer names new weights, and
    after the resume sends prompt + the tokens it had, ``max_tokens`` reduced. The harness's
    stream is one answer; the record holds every token once: what Turnstile had read of the
    cut request (a prefix of what vLLM sent: tokens still in flight are re-sampled), then
    what vLLM sent for the resumed one, under the version vLLM reports for it."""
    session = ts.session(test="hold")
    http_ = ts.http

    def name(version: str) -> None:
        r = httpx.post(vllm + "/update_weight_version", json={"new_version": version})
        assert r.status_code == 200

    n = 300
    try:
        assert http_.post(ts.url + "/admin/pause", json={"mode": "drain"}).status_code == 200
        name("hold-1")
        http_.post(ts.url + "/admin/resume", json={"weight_version": "hold-1"})
        before = len(relay.exchanges)
        body = {
            "model": "m", "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": n, "stream": True, "logit_bias": NO_END, "temperature": 0,
        }  # fmt: skip
        text, paused = "", None
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", session["base_url"] + "/chat/completions", json=body) as s:
                seen = 0
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        seen += 1
                        for ch in json.loads(line[6:])["choices"]:
                            text += ch["delta"].get("content") or ""
                            assert ch.get("finish_reason") in (None, "length"), line
                    if seen == 5 and paused is None:
                        paused = http_.post(ts.url + "/admin/pause", json={"mode": "hold"}).json()
                        name("hold-2")
                        r = http_.post(ts.url + "/admin/resume", json={"weight_version": "hold-2"})
                        assert r.status_code == 200
                    assert "error" not in line, line
        assert paused is not None and paused["preempted"] == 1, paused
        first, second = relay.wait(before + 2)[before:]
        (call,) = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
        k = call["chunks"][0]["end"]
        cut, rest = _sampled(first)[0], _sampled(second)[0]
        assert 0 < k <= len(cut) < n and call["completion_ids"][:k] == cut[:k]
        assert _prompt(second) == _prompt(first) + cut[:k]
        assert second.request["sampling_params"]["max_tokens"] == n - k
        assert call["completion_ids"] == cut[:k] + rest and len(call["completion_ids"]) == n
        assert call["status"] == "ok" and call["message"]["content"] == text
        spans = [
            sp
            for c in second.chunks
            for ch in c["choices"]
            for sp in ch.get("weight_versions") or []
        ]
        assert spans == [{"version": "hold-2", "start": 0, "end": n - k}]
        assert call["weight_version"] == ["hold-1"] * k + ["hold-2"] * (n - k)
        assert call["chunks"][1]["engine_request_id"] and call["hold"]["preemptions"] == 1
    finally:
        name("default")
        ts.http.post(ts.url + "/admin/resume", json={"weight_version": "default"})


# --- the sampler's provenance (was test_sampler_provenance_vllm.py: one vLLM start saved) ---
# Both token-in routes: the record's ``sampling_applied`` is what vLLM received (the relay),
# every field of vLLM's sampler is sent (``/v1/completions`` would fill an omitted one from the
# model's generation_config), and vLLM applied it: under ``top_k`` 2 its processed top lists
# keep exactly two tokens whose probabilities sum to 1. The logprobs are the sampler's, and the
# record says so.

VLLM_SAMPLER = {
    "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "max_tokens", "min_tokens",
}  # fmt: skip


@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS])
def test_applied_sampling_is_what_vllm_got_and_applied(request, relay, route):  # noqa: F811
    t = request.getfixturevalue("ts" if route == GENERATE else "ts_completions")
    for asked in ({}, {"top_k": 2}):
        session = t.session(test="provenance")
        before = len(relay.exchanges)
        _client(session).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=4,
            temperature=1.0,
            logprobs=True,
            top_logprobs=3,
            logit_bias=NO_END,
            extra_body=asked,
        )
        (ex,) = relay.wait(before + 1)[before:]
        assert ex.path == route
        got = ex.request if route == COMPLETIONS else ex.request["sampling_params"]
        (call,) = t.get(f"/v1/sessions/{session['id']}/calls")["data"]
        applied = call["sampling_applied"]
        assert applied["wire"] == {k: got[k] for k in SAMPLER_WIRE if k in got}
        assert VLLM_SAMPLER <= applied["wire"].keys()
        assert applied["from"]["top_k"] == ("request" if asked else "neutral")
        assert applied["wire"]["top_k"] == asked.get("top_k", 0)
        assert "engine_echo" not in applied  # vLLM echoes no settings
        ids, lps, tops = _sampled(ex)
        assert call["completion_ids"] == ids
        assert call["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
        assert call["behaviour_logprobs"] == {
            "exact": True,
            "kind": "processed_logprobs",
            "why": None,
        }
        for top in tops:
            # the sampled token comes first, then the best: one entry per token; vLLM marks a
            # token its sampler cut with -9999
            live = {tid: lp for tid, lp in top if lp > -9000}
            if asked:  # top_k 2 (ties at the 2nd logit kept too): the kept set holds all mass
                assert len(live) >= 2, top
                assert sum(math.exp(lp) for lp in live.values()) == pytest.approx(1.0, abs=1e-4)
            else:  # no cut: every listed token is live
                assert len(live) == len(dict(top)) >= 3, top


# --- top-k candidates as per-token arrays (issue 41) on the real engines ------------------
# A two-turn session, the first turn whole with top_logprobs 3, the second (a child call)
# streamed with 5: each sampled token's recorded ``top_ids``/``top_logprobs`` are the engine's
# best k as it returned them on the wire (the relay), present on completion tokens only.

TopWire = list[tuple[list[int], list[int], list[list[tuple[int, float]]]]]


def _vllm_tops(ex: Exchange, k: int) -> list[list[tuple[int, float]]]:
    """vLLM 0.32's best k of each step, by its own ``rank`` (1 the best): the generate route
    lists the sampled token, then the top ``logprobs`` (one more than k, the adapter asks)."""
    out = []
    for part in ex.parts():
        for ch in part.get("choices") or []:
            for e in (ch.get("logprobs") or {}).get("content") or []:
                ranked = {t["token_id"]: t for t in e["top_logprobs"]}.values()
                best = sorted((t for t in ranked if t["rank"] <= k), key=lambda t: t["rank"])
                assert [t["rank"] for t in best] == list(range(1, k + 1)), e
                out.append([(t["token_id"], t["logprob"]) for t in best])
    return out


TOP_K_ASKED = [3, 5]  # turn 1 whole, turn 2 streamed


def _top_k_turns(t: Turnstile, relay: Relay, test: str) -> tuple[dict, list[int], list[Exchange]]:
    """Two turns of one session, each forced to 6 tokens, asking top_logprobs 3 (whole) then
    5 (streamed): the session, the k asked and the relay's exchanges since."""
    session = t.session(test=test)
    client = _client(session)
    before = len(relay.exchanges)
    msgs: list[dict] = [{"role": "user", "content": "Name three colours."}]
    for turn, (k, stream) in enumerate(zip(TOP_K_ASKED, (False, True), strict=True)):
        text, entries, finish = _chat(
            client, stream, messages=msgs, max_tokens=6, temperature=1.0, seed=11 + turn,
            logprobs=True, top_logprobs=k, logit_bias=NO_END,
        )  # fmt: skip
        assert finish == "length" and len(entries) == 6
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
    return session, TOP_K_ASKED, relay.wait(before + 2)[before:]


def _check_top_k(t: Turnstile, session: dict, wire: TopWire, asked: list[int]) -> int:
    """The session's one trajectory and its per-call samples against the engine's wire: each
    completion token's row is the engine's best k (padded to the widest k with -1 / null), the
    prompt's positions absent, a child call's own sample without rows for its prefix."""
    sid = session["id"]
    calls = t.get(f"/v1/sessions/{sid}/calls")["data"]
    assert [c["parent_id"] for c in calls] == [None, calls[0]["id"]]
    (traj,) = t.get(f"/v1/sessions/{sid}/trajectories")["data"]
    width = max(asked)
    sampled: set[int] = set()
    checked = 0
    for (prompt, out, tops), k in zip(wire, asked, strict=True):
        assert len(tops) == len(out)
        assert traj["token_ids"][: len(prompt) + len(out)] == prompt + out
        for j, want in enumerate(tops):
            p = len(prompt) + j
            sampled.add(p)
            assert len(want) == k
            assert traj["top_ids"][p] == [tid for tid, _ in want] + [-1] * (width - k), p
            got = traj["top_logprobs"][p]
            assert got[:k] == pytest.approx([lp for _, lp in want], abs=1e-6), p
            assert got[k:] == [None] * (width - k)  # NaN: null in the JSON
            checked += 1
    n = len(traj["token_ids"])
    assert traj["top_ids_present"] == [int(p in sampled) for p in range(n)]
    per_call = t.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
    prompt, out, tops = wire[1]
    (child,) = [s for s in per_call if s["token_ids"] == prompt + out]
    assert child["top_ids_present"] == [0] * len(prompt) + [1] * len(out)
    assert child["top_ids"][len(prompt) :] == [[tid for tid, _ in row] for row in tops]
    return checked


def test_top_k_candidates_are_recorded_as_vllm_returned_them(ts, relay):
    """Turn 1 whole (k 3), turn 2 streamed (k 5), each forced to 6 tokens: the recorded
    candidates are vLLM's own best k by rank, token for token."""
    session, asked, exs = _top_k_turns(ts, relay, "top-k")
    assert [(e.path, e.request["stream"]) for e in exs] == [(GENERATE, False), (GENERATE, True)]
    assert len(exs[1].chunks) > 1  # streamed on the wire too
    wire: TopWire = []
    for ex, k in zip(exs, asked, strict=True):
        assert ex.request["sampling_params"]["logprobs"] == k + 1  # 0.32: one more than k
        ids, _, _ = _sampled(ex)
        assert len(ids) == 6
        wire.append((_prompt(ex), ids, _vllm_tops(ex, k)))
    assert _check_top_k(ts, session, wire, asked) == 12
