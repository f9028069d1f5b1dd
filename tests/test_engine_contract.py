"""One engine contract, the same assertions for every adapter.

llama.cpp runs against the real llama-server (through the recording relay, whose record of
each ``/completion`` exchange is the truth); vLLM in its 0.29, 0.32, 0.33 shapes (and a pre-0.25
server that only has ``/v1/completions``) and SGLang 0.5.x (cumulative and incremental
streaming) run against the fakes in ``tests/fakes``, whose record of every token they sent is
the truth. What is checked: token IDs and logprobs (and top-k) equal what the engine sent,
finish reasons, the sampled stop token, streaming == non-streaming, engine failures as
``EngineError`` with a 4xx/5xx status, a cancelled call reaching the engine, and the context
length read by ``refresh()``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import turnstile_testbed as testbed
from turnstile.engines import Engine, EngineError, Finish, SamplingParams, make_engine
from turnstile.testing.fake_server import FakeServer
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.tokens import Token, tokens
from turnstile.testing.toy_model import EOS, IM_END

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QWEN_IM_END = 151645


@dataclass
class Truth:
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]] | None]


@dataclass
class Harness:
    """An engine kind, where it runs, and how to read what it really did."""

    name: str
    kind: str
    url: str
    prompt: list[int]
    stop_token: int  # a token the test can push the model to sample, reported as the stop
    eog: list[int]  # every token the engine ends on: biased away so generations run long
    context_length: int
    truth: Callable[[Finish], Truth]
    aborted: Callable[[Finish | None], bool]  # did the engine see the last call go away?
    options: dict = field(default_factory=dict)
    fake: FakeServer | None = None
    direct_url: str | None = None  # the engine itself, when ``url`` is a recording relay

    def engine(self, url: str | None = None) -> Engine:
        return make_engine(self.kind, url or self.url, **self.options)


def run(coro):
    return asyncio.run(coro)


async def collect(h: Harness, params: SamplingParams, stream: bool) -> tuple[list[Token], Finish]:
    engine = h.engine()
    await engine.start()
    try:
        items: list = [b async for b in engine.generate(h.prompt, params, stream=stream)]
    finally:
        await engine.close()
    return tokens(items)  # batches of tokens (never empty, columns of one length), one Finish


# harnesses


def _fake_truth(fake: FakeServer) -> Callable[[Finish], Truth]:
    def truth(finish: Finish) -> Truth:
        gen = fake.rec.sent[finish.engine_request_id]
        return Truth(gen.ids, [s.logprob for s in gen.steps], [s.top for s in gen.steps])

    return truth


def _fake_aborted(fake: FakeServer) -> Callable[[Finish | None], bool]:
    def aborted(_: Finish | None) -> bool:
        deadline = time.monotonic() + 5
        while not (fake.rec.aborts or fake.rec.disconnects) and time.monotonic() < deadline:
            time.sleep(0.02)
        return bool(fake.rec.aborts or fake.rec.disconnects)

    return aborted


FAKES: dict[str, Callable[[], tuple[FakeServer, dict]]] = {
    "vllm-0.29": lambda: (VLLMFake("0.29.0"), {}),
    "vllm-0.32": lambda: (VLLMFake("0.32.0", tokens_per_chunk=2), {}),
    "vllm-0.33": lambda: (VLLMFake("0.33.0", keep_alive=True), {}),
    "vllm-0.24-completions": lambda: (VLLMFake("0.24.0"), {}),
    "sglang-cumulative": lambda: (SGLangFake(skip_events=1), {}),
    "sglang-incremental": lambda: (SGLangFake(incremental=True, tokens_per_event=2), {}),
}


@pytest.fixture(params=["llama-cpp", *FAKES])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "llama-cpp":
        yield request.getfixturevalue("llama_harness")
        return
    fake, options = FAKES[request.param]()
    kind = request.param.split("-")[0]
    with fake:
        ctx = fake.max_model_len if isinstance(fake, VLLMFake) else fake.context_len
        yield Harness(
            request.param,
            kind,
            fake.url,
            list(range(1, 9)),
            IM_END,
            [EOS, IM_END],
            ctx,
            _fake_truth(fake),
            _fake_aborted(fake),
            options,
            fake,
        )


@pytest.fixture
def llama_harness(relay, tiny_qwen2: Path, llama_tiny: str, tiny_end_ids: list[int]) -> Harness:
    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_qwen2))
    prompt = tok.encode(
        "<|im_start|>user\nHello there, how are you?<|im_end|>\n<|im_start|>assistant\n"
    )

    def truth(_: Finish) -> Truth:
        resp = relay.completions()[-1].response
        probs = {i: p for i, p in enumerate(resp.get("completion_probabilities") or [])}
        ids = resp["tokens"]
        lps, tops, j = [], [], 0
        for tid in ids:  # entries skip tokens ending inside a UTF-8 character
            p = probs.get(j)
            if p is not None and p["id"] == tid:
                lps.append(p["logprob"])
                tops.append([(t["id"], t["logprob"]) for t in p["top_logprobs"]])
                j += 1
            else:
                lps.append(math.nan)
                tops.append(None)
        return Truth(ids, lps, tops)

    def aborted(_: Finish | None) -> bool:
        """llama-server stops a non-streamed task whose connection closed: its slots go idle.
        It looks only when no result reached its queue for a second (HTTP_POLLING_SECONDS),
        and every /slots answer is such a result, so look rarely."""
        time.sleep(2.5)
        for _ in range(4):
            with urllib.request.urlopen(llama_tiny + "/slots", timeout=5) as r:
                if not any(s.get("is_processing") for s in json.load(r)):
                    return True
            time.sleep(1.5)
        return False

    ctx = json.load(urllib.request.urlopen(llama_tiny + "/props", timeout=5))
    n_ctx = ctx["default_generation_settings"]["n_ctx"]
    return Harness(
        "llama-cpp",
        "llama-cpp",
        relay.url,
        prompt,
        QWEN_IM_END,
        tiny_end_ids,
        n_ctx,
        truth,
        aborted,
        direct_url=llama_tiny,
    )


def params(h: Harness, **kw) -> SamplingParams:
    base = dict(
        max_tokens=12,
        temperature=1.0,
        seed=11,
        top_logprobs=2,
        logit_bias={t: -100.0 for t in h.eog},
    )
    base.update(kw)
    return SamplingParams(**base)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def key(e: Token) -> tuple:
    return e.token_id, None if math.isnan(e.logprob) else e.logprob, e.top


# the contract


def test_tokens_and_logprobs_are_what_the_engine_sent(harness: Harness):
    events, finish = run(collect(harness, params(harness), stream=False))
    truth = harness.truth(finish)
    assert [e.token_id for e in events] == truth.ids
    assert all(same(e.logprob, t) for e, t in zip(events, truth.logprobs, strict=True))
    for e, top in zip(events, truth.top, strict=True):
        if top is None:
            continue
        assert e.top is not None and len(e.top) == 2
        assert [t for t, _ in e.top] == [t for t, _ in top[:2]]
        assert all(same(a, b) for (_, a), (_, b) in zip(e.top, top[:2], strict=True))
    assert finish.reason == "length" and len(events) == 12
    assert finish.stop_token_id is None
    assert finish.prompt_tokens == len(harness.prompt)


def test_streaming_equals_non_streaming(harness: Harness):
    p = params(harness, max_tokens=10)
    a, fa = run(collect(harness, p, stream=False))
    b, fb = run(collect(harness, p, stream=True))
    assert [key(e) for e in a] == [key(e) for e in b]
    assert [e.token_id for e in b] == harness.truth(fb).ids
    fa.engine_request_id = fb.engine_request_id = None
    fa.timings = fb.timings = {}
    assert fa == fb


@pytest.mark.parametrize("stream", [False, True])
def test_sampled_stop_token_is_kept_and_reported(harness: Harness, stream: bool):
    bias = {t: -100.0 for t in harness.eog if t != harness.stop_token}
    bias[harness.stop_token] = 100.0
    p = params(harness, logit_bias=bias, stop_token_ids=[harness.stop_token], top_logprobs=0)
    events, finish = run(collect(harness, p, stream=stream))
    assert [e.token_id for e in events] == harness.truth(finish).ids
    assert events and events[-1].token_id == harness.stop_token
    assert finish.reason == "stop"
    assert finish.stop_token_id == harness.stop_token
    assert finish.stop_string is None
    assert all(e.top is None for e in events)


def test_context_length_comes_from_refresh(harness: Harness):
    async def go() -> int:
        engine = harness.engine()
        await engine.start()  # start() refreshes
        engine.context_length = 0
        await engine.refresh()
        await engine.close()
        return engine.context_length

    assert run(go()) == harness.context_length


def test_a_prompt_over_the_context_is_the_harness_error(harness: Harness):
    prompt = harness.prompt * (harness.context_length // len(harness.prompt) + 2)
    p = params(harness, max_tokens=1)

    async def go() -> None:
        engine = harness.engine()
        await engine.start()
        try:
            async for _ in engine.generate(prompt, p, stream=False):
                pass
        finally:
            await engine.close()

    with pytest.raises(EngineError) as e:
        run(go())
    assert e.value.status == 400, e.value


def test_an_unreachable_engine_is_a_5xx(harness: Harness):
    url = f"http://127.0.0.1:{testbed.free_port()}"

    async def go() -> None:
        engine = harness.engine(url)
        await engine.start()
        assert not await engine.health()
        try:
            async for _ in engine.generate(harness.prompt, params(harness), stream=True):
                pass
        finally:
            await engine.close()

    with pytest.raises(EngineError) as e:
        run(go())
    assert 500 <= e.value.status < 600


def _engine_busy(h: Harness) -> bool:
    if h.fake is not None:
        return bool(h.fake.rec.sent)
    with urllib.request.urlopen(h.direct_url + "/slots", timeout=5) as r:
        return any(s.get("is_processing") for s in json.load(r))


@pytest.mark.parametrize("stream", [False, True])
def test_a_cancelled_call_reaches_the_engine(harness: Harness, stream: bool):
    """The harness went away: the engine must stop generating for it."""
    if harness.fake is not None:
        harness.fake.token_delay = 0.02
    p = params(harness, max_tokens=2000, top_logprobs=0)

    async def go() -> int:
        # The relay in front of llama-server reads whole responses: it would hide the hang-up.
        engine = harness.engine(harness.direct_url)
        await engine.start()
        got = 0

        async def consume() -> None:
            nonlocal got
            async for _ in engine.generate(harness.prompt, p, stream=stream):
                got += 1

        task = asyncio.ensure_future(consume())
        # Cancel once the engine is generating for it (not after a sleep that may be too
        # short on a busy machine): no end token can be sampled, so it is still running.
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_engine_busy, harness):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await engine.close()  # lets the background abort finish
        return got

    run(go())
    assert harness.aborted(None)
    if harness.fake is not None:
        assert not harness.fake.rec.finished
        rid = next(iter(harness.fake.rec.sent))
        assert rid in harness.fake.rec.aborts or rid in harness.fake.rec.disconnects


def test_logprob_kind_is_reported_and_judged(harness: Harness):
    _, finish = run(collect(harness, params(harness, max_tokens=2), stream=False))
    expected = {"llama-cpp": "raw_logprobs", "vllm": "raw_logprobs", "sglang": "scaled_logprobs"}[
        harness.kind
    ]
    assert finish.logprob_kind == expected
    engine = harness.engine()
    assert engine.logprob_warning(params(harness, temperature=1.0, logit_bias={})) is None
    assert "top_p" in engine.logprob_warning(params(harness, top_p=0.9, logit_bias={}))
    warn_t = engine.logprob_warning(params(harness, temperature=0.7, logit_bias={}))
    assert (warn_t is not None) == (expected == "raw_logprobs")
    assert "greedy" in engine.logprob_warning(params(harness, temperature=0.0))
