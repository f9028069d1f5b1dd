"""SGLang specifics against the fake: the request as sent, both streaming modes (with skipped
cumulative events), weight versions, the stop token, and its several error shapes."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from turnstile.engines import EngineError, SamplingParams, make_engine
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.tokens import tokens
from turnstile.testing.toy_model import EOS, IM_END

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
PROMPT = [3, 1, 4, 1, 5]


def run(coro):
    return asyncio.run(coro)


async def generate(url: str, params: SamplingParams, stream: bool = False, **options):
    engine = make_engine("sglang", url, **options)
    await engine.start()
    try:
        out = [batch async for batch in engine.generate(PROMPT, params, stream=stream)]
    finally:
        await engine.close()
    events, finish = tokens(out)
    return events, finish, engine


def test_the_request_is_token_in_with_every_sampling_default_pinned():
    with SGLangFake() as fake:
        p = SamplingParams(
            max_tokens=5,
            temperature=0.9,
            top_p=0.8,
            seed=3,
            stop=["<7>"],
            top_logprobs=2,
            logit_bias={4: -2.0},
            stop_token_ids=[IM_END],
        )
        run(generate(fake.url, p))
        body = fake.rec.bodies("/generate")[-1]
        assert body["input_ids"] == PROMPT and body["rid"].startswith("turnstile-")
        assert body["return_logprob"] is True and body["logprob_start_len"] == -1
        assert body["top_logprobs_num"] == 2 and body["return_text_in_logprobs"] is False
        assert body["sampling_params"] == {
            "max_new_tokens": 5,
            "temperature": 0.9,
            "top_p": 0.8,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "min_new_tokens": 0,
            "n": 1,
            "ignore_eos": False,
            "skip_special_tokens": False,
            "no_stop_trim": False,
            "stop": ["<7>"],
            "stop_token_ids": [IM_END],
            "logit_bias": {"4": -2.0},
            "sampling_seed": 3,
        }


@pytest.mark.parametrize(
    "incremental, skip, per_event", [(False, 0, 1), (False, 2, 1), (True, 0, 1), (True, 0, 3)]
)
def test_both_streaming_modes_give_every_token_once(incremental, skip, per_event):
    with SGLangFake(incremental=incremental, skip_events=skip, tokens_per_event=per_event) as f:
        p = SamplingParams(
            max_tokens=11, seed=9, top_logprobs=1, logit_bias={EOS: -100.0, IM_END: -100.0}
        )
        events, finish, _ = run(generate(f.url, p, stream=True))
        gen = f.rec.sent[finish.engine_request_id]
        assert [(e.token_id, e.logprob, e.top) for e in events] == [
            (s.token_id, s.logprob, s.top) for s in gen.steps
        ]
        assert finish.reason == "length"
        sent = [
            orjson.loads(c[6:])
            for c in f.rec.raw[finish.engine_request_id]
            if c.startswith(b"data: {")
        ]
        lengths = [len(c["output_ids"]) for c in sent]
        if incremental:
            assert sum(lengths) == 11
        else:
            assert lengths == sorted(lengths) and lengths[-1] == 11


def test_the_sampled_stop_token_stays_in_output_ids():
    with SGLangFake() as fake:
        p = SamplingParams(
            max_tokens=8, seed=1, logit_bias={IM_END: 100.0}, stop_token_ids=[IM_END]
        )
        events, finish, _ = run(generate(fake.url, p))
        assert [e.token_id for e in events] == [IM_END]
        assert (finish.reason, finish.stop_token_id) == ("stop", IM_END)
        body = orjson.loads(fake.rec.raw[finish.engine_request_id][0])
        assert body["output_ids"] == [IM_END] and body["text"] == ""
        assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}


def test_weight_versions_and_the_server_version():
    with SGLangFake(incremental=True) as fake:
        fake.weight_version = "3"
        fake.version_from = {2: "4"}
        p = SamplingParams(max_tokens=5, seed=2, logit_bias={EOS: -100.0, IM_END: -100.0})
        events, finish, engine = run(generate(fake.url, p, stream=True))
        assert finish.weight_versions == [
            {"version": "3", "start": 0, "end": 2},
            {"version": "4", "start": 2, "end": 5},
        ]
        assert finish.weight_version == "4"
        assert engine.weight_version == "3" and engine.version == "0.5.23"
        assert engine.incremental_streaming is True


def test_logprob_kind_follows_the_server():
    with SGLangFake(original_logprobs=True) as fake:
        _, finish, engine = run(
            generate(fake.url, SamplingParams(max_tokens=2, seed=1), original_logprobs=True)
        )
        assert finish.logprob_kind == "raw_logprobs"
        assert "temperature" in engine.logprob_warning(
            SamplingParams(max_tokens=1, temperature=0.5)
        )


@pytest.mark.parametrize("stream", [False, True])
def test_errors_in_each_of_sglangs_shapes(stream):
    with SGLangFake(context_len=64) as fake:
        with pytest.raises(EngineError) as e:  # a ValueError: 400, or in-band once streaming
            run(generate(fake.url, SamplingParams(max_tokens=100), stream=stream))
        assert e.value.status == 400 and "context length" in str(e.value)
        fake.fail_next = 503  # an HTTPException: {"object": "error", ...}
        with pytest.raises(EngineError) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4), stream=stream))
        assert e.value.status == 503 and "overloaded" in str(e.value)


def test_a_contract_violation_is_a_400_with_sglangs_message():
    async def go() -> None:
        engine = make_engine("sglang", fake.url)
        await engine.start()
        body = engine.request_body(PROMPT, SamplingParams(max_tokens=2), False, "r1")
        body["sampling_params"]["bogus"] = 1
        status, raw = await engine._request("POST", "/generate", body)
        await engine.close()
        assert status == 400
        raise engine._error("/generate", status, raw)

    with SGLangFake() as fake:
        with pytest.raises(EngineError) as e:
            run(go())
        assert e.value.status == 400 and "unknown field `bogus`" in str(e.value)


def test_an_engine_side_abort_is_an_error_not_a_finish():
    with SGLangFake() as fake:
        fake.token_delay = 0.05

        async def go() -> None:
            engine = make_engine("sglang", fake.url)
            await engine.start()
            try:
                async for _ in engine.generate(PROMPT, SamplingParams(max_tokens=50, seed=1)):
                    if not fake.rec.aborts:
                        fake.abort(list(fake.rec.sent))  # e.g. /pause_generation mode=abort
            finally:
                await engine.close()

        with pytest.raises(EngineError) as e:
            run(go())
        assert "aborted" in str(e.value) and e.value.status == 503
