"""``POST /admin/pause {"mode": "hold"}``: a call preempted by a weight update goes on after the
resume from its prompt + the tokens sampled so far, and its harness (the official SDKs) gets
one answer, never an error. Against the vLLM fake, stopped at a known token by a gate in its
pacing, so the seam is where the test put it; the truth is what the fake received and sent
(its recorder), never Turnstile's own idea. Greedy sampling makes an unpaused call of the same
prompt the reference the held one must equal token for token and, streamed, text for text."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import openai
import pytest
from conftest import Turnstile

from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.toy_model import EOS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

K = 7  # tokens sampled before the pause
N = 24  # max_tokens
GENERATE = "/inference/v1/generate"
MSG = [{"role": "user", "content": "count"}]


class Gate:
    """Holds the fake's ``n``-th request of a run at its ``at``-th token (it has sent
    ``at`` tokens and waits to sample the next) until the request is dropped or aborted."""

    def __init__(self, fake: VLLMFake):
        self.fake, self.plain = fake, fake.pace
        self.at: int | None = None
        self.counts: dict[str, int] = {}
        self.reached = threading.Event()
        self.rid: str | None = None
        fake.pace = self.pace  # type: ignore[method-assign]

    def arm(self, at: int) -> None:
        self.at, self.rid = at, None
        self.reached.clear()

    async def pace(self, rid: str) -> bool:
        n = self.counts[rid] = self.counts.get(rid, 0) + 1
        if self.at is not None and n == self.at + 1 and self.rid is None:
            self.rid = rid
            self.reached.set()
            while not self.fake.is_aborted(rid):
                await asyncio.sleep(0.01)  # a dropped connection cancels this sleep
        return await self.plain(rid)


@pytest.fixture(scope="module")
def fake() -> Iterator[VLLMFake]:
    """The vLLM fake whose toy model never ends on its own (its EOS biased away, as a
    ``logit_bias`` would, for the dialects that take none): every call runs to max_tokens."""
    f = VLLMFake(dev_mode=True)
    f.token_delay = 0.01
    plain = f.model.generate

    def generate(prompt: list[int], **kw: object) -> object:
        bias = {**(kw.pop("logit_bias", None) or {}), EOS: -100.0}  # type: ignore[dict-item]
        return plain(prompt, logit_bias=bias, **kw)  # type: ignore[arg-type]

    f.model.generate = generate  # type: ignore[method-assign]
    with f:
        yield f


@pytest.fixture(scope="module")
def gate(fake: VLLMFake) -> Gate:
    return Gate(fake)


def _serve(fake: VLLMFake, model: Path, tmp: Path, *extra: str) -> Turnstile:
    opts = ("--engine", "vllm", "--keepalive", "0.1", *extra)
    return Turnstile(fake.url, model, tmp / "data", tmp / "turnstile.log", opts).start()


@pytest.fixture(scope="module")
def ts(fake, tiny_qwen2, tmp_path_factory) -> Iterator[Turnstile]:
    t = _serve(fake, tiny_qwen2, tmp_path_factory.mktemp("hold"), "--hold-stream")
    yield t
    t.stop()


def _bias(ts: Turnstile) -> dict[str, int]:
    """Keeps the toy model from ending (its EOS, the template's end tokens): it runs to N."""
    return {str(EOS): -100}


def _generates(fake: VLLMFake, since: int) -> list[dict]:
    return [r.body for r in fake.rec.requests[since:] if r.path == GENERATE]


def _sent_ids(fake: VLLMFake, rid: str) -> list[int]:
    """The token IDs the fake's response bytes carried (what it sent, not what it meant to)."""
    out: list[int] = []
    for raw in fake.rec.raw.get(rid, []):
        for line in raw.decode().splitlines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:]).get("choices") or []:
                    out.extend(c.get("token_ids") or [])
    if not out and rid in fake.rec.sent:
        out = list(fake.rec.sent[rid].ids)
    return out


def _held_run(
    ts: Turnstile,
    fake: VLLMFake,
    gate: Gate,
    call: Callable[[], object],
    version: str,
    held: bool = True,
) -> tuple[object, dict]:
    """Run ``call`` (a harness's request) in a thread; at the gate pause with hold, wait, set the
    engine's new version, resume; return what the harness got and the pause's answer."""
    gate.arm(K)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(call)
        while not gate.reached.wait(0.05):
            if fut.done():
                raise AssertionError(f"the call ended before the gate: {fut.result()!r}")
        paused = ts.http.post(ts.url + "/admin/pause", json={"mode": "hold"}).json()
        time.sleep(0.4)  # held: the stream sends keep-alives meanwhile
        assert fut.done() is not held
        fake.weight_version = f"engine-{version}"  # the engine's own label for its weights
        r = ts.http.post(ts.url + "/admin/resume", json={"weight_version": version})
        assert r.status_code == 200, r.text
        return fut.result(60), paused


def _last_call(ts: Turnstile, sid: str) -> dict:
    return ts.get(f"/v1/sessions/{sid}/calls")["data"][-1]


def _check_chunks(
    fake: VLLMFake, since: int, rec: dict, version: str, first_policy: str | None
) -> None:
    """The record's tokens are the concatenation of what the engine sent for each request;
    the resubmission is prompt + the first chunk's tokens, max_tokens less them."""
    first, second = _generates(fake, since)[-2:]
    rid1 = f"generate-tokens-{first['request_id']}"
    rid2 = f"generate-tokens-{second['request_id']}"
    sent1, sent2 = _sent_ids(fake, rid1), _sent_ids(fake, rid2)
    assert len(sent1) == K
    assert rec["completion_ids"] == sent1 + sent2
    assert second["token_ids"] == first["token_ids"] + sent1
    assert second["sampling_params"]["max_tokens"] == first["sampling_params"]["max_tokens"] - K
    info = rec  # the record's info is spread on its JSON
    chunks = info["chunks"]
    assert [(c["start"], c["end"]) for c in chunks] == [(0, K), (K, len(rec["completion_ids"]))]
    assert chunks[0]["finish_reason"] == "preempted" and chunks[1]["engine_request_id"]
    assert chunks[1]["prompt_tokens"] == len(second["token_ids"])
    assert info["hold"]["preemptions"] == 1
    spans = info["weight_versions"]
    # the engine's own spans where it gave them (the resumed request's), else the policy version
    # the trainer had declared when the chunk was sent (the preempted request gave none)
    end = len(rec["completion_ids"])
    assert spans[-1] == {"version": f"engine-{version}", "start": K, "end": end}
    assert spans[0] == {"version": first_policy, "start": 0, "end": K}
    assert rec["weight_version"] == [first_policy] * K + [f"engine-{version}"] * (end - K)


def test_a_held_chat_stream_is_one_answer_equal_to_an_unpaused_one(ts, fake, gate):
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

    def ask() -> list:
        return list(
            client.chat.completions.create(
                model="t",
                messages=MSG,
                max_tokens=N,
                temperature=0,
                logit_bias=_bias(ts),
                stream=True,
            )
        )

    gate.at = None
    reference = ask()  # not paused: the same greedy tokens in one request
    since = len(fake.rec.requests)
    before = ts.get("/admin/status")["weight_version"]
    chunks, paused = _held_run(ts, fake, gate, ask, "v-hold-1")
    assert paused["mode"] == "hold" and paused["preempted"] == 1 and paused["aborted"] == 0

    def text(cs: list) -> str:
        return "".join(c.choices[0].delta.content or "" for c in cs if c.choices)

    assert text(chunks) == text(reference) and len(text(chunks)) > 0

    def empty(cs: list) -> int:  # the role chunk, and the keep-alive chunks while silent
        return sum(bool(c.choices) and c.choices[0].delta.content == "" for c in cs)

    assert empty(chunks) >= empty(reference) + 2  # held 0.4 s, a keep-alive every 0.1 s
    assert chunks[-1].choices[0].finish_reason == "length"
    rec = _last_call(ts, session["id"])
    assert rec["status"] == "ok" and len(rec["completion_ids"]) == N
    assert rec["message"]["content"] == text(chunks)
    _check_chunks(fake, since, rec, "v-hold-1", before)


def test_a_held_whole_messages_call_is_one_answer(ts, fake, gate):
    """Non-streamed, through the Anthropic SDK (``--hold-stream``: the engine is read as a
    stream, so the tokens before the pause are kept)."""
    session = ts.session()
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="unused", max_retries=0
    )

    def ask() -> object:
        return client.messages.create(model="t", messages=MSG, max_tokens=N)

    gate.at = None
    since = len(fake.rec.requests)
    before = ts.get("/admin/status")["weight_version"]
    message, paused = _held_run(ts, fake, gate, ask, "v-hold-2")
    assert paused["preempted"] == 1
    rec = _last_call(ts, session["id"])
    assert rec["status"] == "ok"
    assert message.content[0].text == rec["message"]["content"]  # type: ignore[attr-defined]
    assert message.usage.output_tokens == len(rec["completion_ids"])  # type: ignore[attr-defined]
    assert message.stop_reason == "max_tokens" and len(rec["completion_ids"]) == N  # type: ignore[attr-defined]
    _check_chunks(fake, since, rec, "v-hold-2", before)


def test_a_held_responses_stream_is_one_answer(ts, fake, gate):
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

    def ask() -> list:
        with client.responses.stream(
            model="t", input="count", max_output_tokens=N, temperature=0
        ) as stream:
            return [ev for ev in stream]

    since = len(fake.rec.requests)
    before = ts.get("/admin/status")["weight_version"]
    events, _ = _held_run(ts, fake, gate, ask, "v-hold-3")
    kinds = [ev.type for ev in events]
    assert "error" not in kinds and kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    rec = _last_call(ts, session["id"])
    assert rec["status"] == "ok" and text == rec["message"]["content"]
    _check_chunks(fake, since, rec, "v-hold-3", before)


def _chat(session: dict, **kw: object) -> Callable[[], list]:
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

    def ask() -> list:
        args = {"model": "t", "messages": MSG, "max_tokens": N, "temperature": 0, **kw}
        return list(client.chat.completions.create(stream=True, **args))  # type: ignore[call-overload]

    return ask


def _text(cs: list) -> str:
    return "".join(c.choices[0].delta.content or "" for c in cs if c.choices)


def test_a_stop_string_across_the_seam_ends_the_call_where_an_unpaused_one_ends(ts, fake, gate):
    """The engine sees only the resumed chunk's text; a stop string that began in the tokens
    it was sent as prompt is found in the joined text, and the call ends there: the text
    before the stop string's first place in the unpaused greedy text, and the tokens up to the
    one that completes it. (The fake checks stop strings on its toy text, not the tokenizer's:
    the real engine's check is the real-vLLM module's.)"""
    session = ts.session()
    gate.at = None
    plain = _text(_chat(session)())
    # a stop string over the seam (each toy token is one character), found nowhere earlier
    stop = next(
        plain[K - a : K + b]
        for a, b in ((2, 2), (1, 2), (2, 1), (1, 1), (3, 3))
        if plain.find(plain[K - a : K + b]) == K - a
    )
    since = len(fake.rec.requests)
    chunks, _ = _held_run(ts, fake, gate, _chat(session, stop=[stop]), "v-stop")
    assert _text(chunks) == plain[: plain.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    rec = _last_call(ts, session["id"])
    [first, second] = _generates(fake, since)
    sent = _sent_ids(fake, f"generate-tokens-{first['request_id']}") + _sent_ids(
        fake, f"generate-tokens-{second['request_id']}"
    )
    end = plain.find(stop) + len(stop)  # the token that completes the stop string is the last
    assert rec["completion_ids"] == sent[:end] and rec["stop_string"] == stop
    assert rec["chunks"][-1]["finish_reason"] == "stop_string_across_seam"


def test_penalties_of_the_tokens_before_the_seam_are_carried_as_logit_bias(ts, fake, gate):
    session = ts.session()
    since = len(fake.rec.requests)
    _held_run(
        ts,
        fake,
        gate,
        _chat(session, presence_penalty=0.5, frequency_penalty=0.25, logit_bias={"3": 1}),
        "v-pen",
    )
    first, second = _generates(fake, since)
    sent1 = _sent_ids(fake, f"generate-tokens-{first['request_id']}")
    want = {"3": 1.0}
    for t in set(sent1):
        want[str(t)] = want.get(str(t), 0.0) - 0.5 - 0.25 * sent1.count(t)
    assert second["sampling_params"]["logit_bias"] == want
    assert second["sampling_params"]["presence_penalty"] == 0.5  # still on for new tokens
    rec = _last_call(ts, session["id"])
    assert any("logit_bias" in n for n in rec["hold"]["notes"])


def test_a_forced_tool_call_with_partial_output_is_not_resumable(ts, fake, gate):
    """A grammar would restart at the prompt's end: the call is aborted like ``abort`` does,
    the reason named in the answer and the record."""
    session = ts.session()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.APIError) as err:
        _held_run(ts, fake, gate, _chat(session, tools=tools, tool_choice="required"), "v-g", False)
    assert "grammar" in str(err.value) and "not resumable" in str(err.value)
    rec = _last_call(ts, session["id"])
    assert rec["status"] == "aborted" and "grammar" in rec["error"]
    assert rec["hold"]["preemptions"] == 1 and rec["chunks"][0]["end"] == K


def test_past_the_preemption_cap_the_call_is_aborted_naming_it(ts, fake, gate):
    session = ts.session()
    ask = _chat(session)
    gate.arm(K)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(ask)
        for i in range(4):  # the cap is 3 (serve's default)
            assert gate.reached.wait(30)
            paused = ts.http.post(ts.url + "/admin/pause", json={"mode": "hold"}).json()
            assert paused["preempted"] == 1
            gate.arm(2)
            ts.http.post(ts.url + "/admin/resume", json={"weight_version": f"v-cap-{i}"})
        with pytest.raises(openai.APIError) as err:
            fut.result(60)
    assert "preempted 4 times" in str(err.value) and "--hold-preemptions 3" in str(err.value)
    rec = _last_call(ts, session["id"])
    assert rec["status"] == "aborted" and rec["hold"]["preemptions"] == 4
    assert [c["end"] - c["start"] for c in rec["chunks"]] == [K, 2, 2, 2]
    assert ts.get("/admin/status")["in_flight"] == 0


def test_trajectories_mask_the_stale_tokens_or_the_preempted_calls_when_asked(ts, fake, gate):
    """For the trainer: the K tokens the old weights sampled lose their loss under
    ``mask_stale_versions`` (the versions stay); a call preempted more than
    ``max_preemptions`` times loses all of its own; by default every sampled token trains."""
    session = ts.session()
    _held_run(ts, fake, gate, _chat(session), "v-traj")
    path = f"/v1/sessions/{session['id']}/trajectories?mode=per_call"

    def completion_mask(query: str = "") -> list[int]:
        [t] = ts.get(path + query)["data"]
        start = t["turns"][0]["completion_start"]
        return t["loss_mask"][start:]

    assert completion_mask() == [1] * N
    assert completion_mask("&mask_stale_versions=true") == [0] * K + [1] * (N - K)
    assert completion_mask("&max_preemptions=0") == [0] * N
    assert completion_mask("&max_preemptions=1") == [1] * N
    bad = ts.http.get(ts.url + path + "&max_preemptions=-1")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_preemptions"
