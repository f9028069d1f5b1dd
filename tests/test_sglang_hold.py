"""SGLang's pause modes (issue 44): the fake answers ``/pause_generation`` (``abort``,
``retract``, ``in_place``) and ``/continue_generation`` as SGLang 0.5.23 does (a golden answer
of the shape its source gives, ``tests/fakes/golden/sglang-0.5.23-pause.json``) and behaves as
its tokenizer manager and scheduler do; ``POST /admin/pause {"mode": "hold"}`` on
``--engine sglang`` cuts a running request at a known token (``test_hold``'s gate), asks SGLang
to ``retract``, and after the resume resubmits prompt + the tokens sampled so far: the truth is
what the fake received and sent per request (its recorder)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from conftest import Turnstile
from fakes import vllm_golden as compare
from fakes.vllm_golden import Case
from test_hold import MSG, Gate

from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.toy_model import EOS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GOLDEN = Path(__file__).parent / "fakes" / "golden" / "sglang-0.5.23-pause.json"
K = 6  # tokens sampled before the pause
N = 20  # max_tokens


@pytest.fixture(scope="module")
def fake() -> Iterator[SGLangFake]:
    """The SGLang fake whose toy model never ends on its own: every call runs to max_tokens."""
    f = SGLangFake()
    f.token_delay = 0.01
    plain = f.model.generate

    def generate(prompt: list[int], **kw: object) -> object:
        bias = {**(kw.pop("logit_bias", None) or {}), EOS: -100.0}  # type: ignore[dict-item]
        return plain(prompt, logit_bias=bias, **kw)  # type: ignore[arg-type]

    f.model.generate = generate  # type: ignore[method-assign]
    with f:
        yield f


def test_the_pause_routes_answer_as_sglang_does():
    golden = json.loads(GOLDEN.read_text())
    with SGLangFake() as fake, httpx.Client(timeout=10) as client:
        for name, want in golden["cases"].items():
            req = want["request"]
            got = compare.answer(
                client, fake.url, Case(name, req["method"], req["path"], req["body"])
            )
            diffs = compare.differences(want, got, name)
            assert not diffs, "\n".join(diffs)
            assert json.loads(got["example"]) == json.loads(want["example"]), name
        assert fake.paused is None  # the last case: the continue


def _generate(fake: SGLangFake, rid: str, n: int = 50) -> dict:
    body = {"rid": rid, "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": n}}
    return httpx.post(fake.url + "/generate", json=body, timeout=30).json()


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_each_pause_mode_does_what_sglang_does_to_a_running_request(fake, mode):
    """abort: the running request ends with finish type abort; retract / in_place: it samples
    nothing while paused and finishes after the continue; every mode holds a new request."""
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(_generate, fake, f"pause-{mode}")
        time.sleep(0.1)
        assert httpx.post(fake.url + "/pause_generation", json={"mode": mode}).status_code == 200
        late = pool.submit(_generate, fake, f"late-{mode}", 3)
        time.sleep(0.2 if mode == "abort" else 0.8)  # 50 tokens take 0.5 s unpaused
        assert not late.done()
        assert running.done() is (mode == "abort")
        httpx.post(fake.url + "/continue_generation", json={})
        first, second = running.result(10), late.result(10)
    finish = first["meta_info"]["finish_reason"]["type"]
    assert finish == ("abort" if mode == "abort" else "length")
    assert (len(first["output_ids"]) < 50) is (mode == "abort")
    assert second["meta_info"]["finish_reason"]["type"] == "length"
    bad = httpx.post(fake.url + "/pause_generation", json={"mode": "freeze"})
    assert bad.status_code == 422 and fake.paused is None


@pytest.fixture(scope="module")
def ts(fake, tiny_qwen2, tmp_path_factory) -> Iterator[Turnstile]:
    tmp = tmp_path_factory.mktemp("sglang-hold")
    opts = ("--engine", "sglang", "--keepalive", "0.1", "--hold-stream")
    t = Turnstile(fake.url, tiny_qwen2, tmp / "data", tmp / "turnstile.log", opts).start()
    yield t
    t.stop()


@pytest.fixture(scope="module")
def gate(fake: SGLangFake) -> Gate:
    return Gate(fake)  # type: ignore[arg-type]


def _held_run(ts: Turnstile, fake: SGLangFake, gate: Gate, call: Callable[[], object]) -> tuple:
    """``call`` in a thread; at the gate a hold, the engine's new version, the resume."""
    gate.arm(K)
    since = len(fake.rec.requests)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(call)
        while not gate.reached.wait(0.05):
            if fut.done():
                raise AssertionError(f"the call ended before the gate: {fut.result()!r}")
        paused = ts.http.post(ts.url + "/admin/pause", json={"mode": "hold"}).json()
        time.sleep(0.3)
        assert not fut.done() and fake.paused == "retract"
        fake.weight_version = "sglang-2"
        assert ts.http.post(ts.url + "/admin/resume", json={"weight_version": "2"}).is_success
        assert fake.paused is None
        return fut.result(60), paused, since


def _check(fake: SGLangFake, since: int, rec: dict) -> None:
    """The record's tokens are what the fake sent for each request; the resubmission is the
    prompt + the cut request's tokens, max_new_tokens less them; SGLang was told retract."""
    new = fake.rec.requests[since:]
    gens = [r.body for r in new if r.path == "/generate"]
    assert len(gens) == 2
    first, second = gens
    sent1, sent2 = fake.rec.sent[first["rid"]].ids, fake.rec.sent[second["rid"]].ids
    assert len(sent1) == K and len(sent1) + len(sent2) == N
    assert rec["completion_ids"] == list(sent1) + list(sent2)
    assert second["input_ids"] == first["input_ids"] + list(sent1)
    assert second["sampling_params"]["max_new_tokens"] == N - K
    assert first["rid"] in fake.rec.aborts  # cut by rid, keeping what it had sampled
    pauses = [r.body for r in new if r.path == "/pause_generation"]
    assert pauses == [{"mode": "retract"}]
    assert [r.path for r in new if r.path == "/continue_generation"] == ["/continue_generation"]
    chunks = rec["chunks"]  # the record's info is spread on its JSON
    assert [(c["start"], c["end"]) for c in chunks] == [(0, K), (K, N)]
    assert chunks[0]["finish_reason"] == "preempted" and rec["hold"]["preemptions"] == 1
    assert chunks[1]["engine_request_id"] == second["rid"]
    assert chunks[1]["prompt_tokens"] == len(second["input_ids"])


def test_a_held_chat_stream_on_sglang_is_one_answer(ts, fake, gate):
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

    def ask() -> list:
        args = {"model": "t", "messages": MSG, "max_tokens": N, "temperature": 0}
        return list(client.chat.completions.create(stream=True, **args))  # type: ignore[call-overload]

    gate.at = None
    reference = ask()
    chunks, paused, since = _held_run(ts, fake, gate, ask)
    assert paused["preempted"] == 1 and paused["aborted"] == 0

    def text(cs: list) -> str:
        return "".join(c.choices[0].delta.content or "" for c in cs if c.choices)

    assert text(chunks) == text(reference) and text(chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    rec = ts.get(f"/v1/sessions/{session['id']}/calls")["data"][-1]
    assert rec["status"] == "ok" and rec["message"]["content"] == text(chunks)
    _check(fake, since, rec)


def test_a_held_whole_messages_call_on_sglang_is_one_answer(ts, fake, gate):
    session = ts.session()
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="unused", max_retries=0
    )

    def ask() -> object:
        return client.messages.create(model="t", messages=MSG, max_tokens=N)

    gate.at = None
    message, paused, since = _held_run(ts, fake, gate, ask)
    assert paused["preempted"] == 1
    rec = ts.get(f"/v1/sessions/{session['id']}/calls")["data"][-1]
    assert rec["status"] == "ok" and len(rec["completion_ids"]) == N
    assert message.content[0].text == rec["message"]["content"]  # type: ignore[attr-defined]
    assert message.stop_reason == "max_tokens"  # type: ignore[attr-defined]
    _check(fake, since, rec)


def test_a_drain_on_sglang_lets_the_running_call_finish(ts, fake, gate):
    """Drain waits for the running calls on the old weights: SGLang must not freeze them
    (``in_place`` and ``retract`` would, until the continue: the pause would wait its whole
    timeout), so Turnstile drains at its own door and leaves SGLang's scheduler running."""
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    gate.at = None
    since = len(fake.rec.requests)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(
            lambda: client.chat.completions.create(model="t", messages=MSG, max_tokens=N)
        )
        while not any(r.path == "/generate" for r in fake.rec.requests[since:]):
            time.sleep(0.01)
        started = time.monotonic()
        paused = ts.http.post(ts.url + "/admin/pause", json={"mode": "drain", "timeout": 20})
        waited = time.monotonic() - started
        assert paused.json()["in_flight"] == 0 and waited < 5, (paused.text, waited)
        assert fut.result(10).choices[0].finish_reason == "length"
    assert fake.paused is None
    assert ts.http.post(ts.url + "/admin/resume", json={}).is_success
