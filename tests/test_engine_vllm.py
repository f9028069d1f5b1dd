"""vLLM specifics the shared contract does not cover, against the fake in each version's shape:
scale-out switched off, the completions route, the request as sent, logprob modes, weight
version spans, top-k exactness, errors inside a stream."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import orjson
import pytest

from turnstile.engines import EngineError, Finish, SamplingParams, VLLMEngine, make_engine
from turnstile.engines.http import EngineUnusable
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.tokens import tokens
from turnstile.testing.toy_model import EOS, IM_END
from turnstile_testbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
PROMPT = [5, 6, 7, 8, 9]


def run(coro):
    return asyncio.run(coro)


async def generate(url: str, params: SamplingParams, stream: bool = False, **options):
    engine = make_engine("vllm", url, **options)
    await engine.start()
    try:
        out = [batch async for batch in engine.generate(PROMPT, params, stream=stream)]
    finally:
        await engine.close()
    events, finish = tokens(out)
    return events, finish, engine


@pytest.mark.parametrize("version, status", [("0.31.0", 404), ("0.32.0", 403), ("0.33.0", 403)])
def test_scale_out_switched_off_auto_picks_completions_and_a_forced_generate_says_why(
    version, status, capfd
):
    with VLLMFake(version, scale_out=False) as fake:
        # auto: decided at start, logged, and every call goes through /v1/completions
        events, finish, engine = run(generate(fake.url, SamplingParams(max_tokens=4, seed=1)))
        assert engine.route == "/v1/completions"
        assert [e.token_id for e in events] == fake.rec.sent[finish.engine_request_id].ids
        assert f"/inference/v1/generate answered {status}" in engine.route_note
        assert "--enable-scale-out" in engine.route_note
        assert "generating through /v1/completions" in capfd.readouterr().err
        # a forced generate refuses to start, saying how to fix the server
        sent = len(fake.rec.sent)
        with pytest.raises(EngineUnusable) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4), api="generate"))
        assert "--enable-scale-out" in str(e.value)
        assert f"answered {status}" in str(e.value)
        assert len(fake.rec.sent) == sent  # nothing was generated


def test_scale_out_on_auto_picks_generate():
    with VLLMFake("0.32.0") as fake:
        _, _, engine = run(generate(fake.url, SamplingParams(max_tokens=2, seed=1)))
        assert engine.route == "/inference/v1/generate"
        assert engine.route_note.endswith("generating through /inference/v1/generate")


@pytest.mark.parametrize("api", ["auto", "completions"])
def test_no_token_in_route_refuses_to_start(api):
    with VLLMFake("0.32.0", scale_out=False, completions=False) as fake:
        with pytest.raises(EngineUnusable) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4), api=api))
        assert "serves no token-in route" in str(e.value)
        assert "/v1/completions answered 404" in str(e.value)
        assert not fake.rec.sent


def test_serve_refuses_to_start_when_no_route_works(tmp_path, tiny_qwen2):
    """``turnstile serve`` exits non-zero with the reason, instead of answering 502 per call."""
    with VLLMFake("0.32.0", scale_out=False, completions=False) as fake:
        port = str(free_port())
        proc = subprocess.run(
            [sys.executable, "-m", "turnstile", "serve", "--engine", "vllm",
             "--engine-url", fake.url, "--model", str(tiny_qwen2), "--port", port,
             "--data", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode != 0
    assert "serves no token-in route" in proc.stderr
    assert "--enable-scale-out" in proc.stderr


def test_a_vllm_without_the_route_is_driven_through_completions():
    with VLLMFake("0.24.0") as fake:
        p = SamplingParams(max_tokens=6, seed=3, top_logprobs=2)
        events, finish, engine = run(generate(fake.url, p, stream=True))
        assert engine.route == "/v1/completions"
        body = fake.rec.bodies("/v1/completions")[-1]
        assert body["prompt"] == PROMPT
        assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
        gen = fake.rec.sent[finish.engine_request_id]
        assert [(e.token_id, e.logprob) for e in events] == [
            (s.token_id, s.logprob) for s in gen.steps
        ]
        assert [e.top for e in events] == [s.top[:2] for s in gen.steps]


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0", "0.33.0"])
def test_the_request_is_token_in_with_every_sampling_default_pinned(version):
    with VLLMFake(version) as fake:
        p = SamplingParams(
            max_tokens=7,
            temperature=0.7,
            top_p=0.95,
            seed=42,
            stop=["<3>"],
            top_logprobs=3,
            logit_bias={12: 1.5},
            stop_token_ids=[IM_END],
        )
        run(generate(fake.url, p))
        body = fake.rec.bodies("/inference/v1/generate")[-1]
        assert body["token_ids"] == PROMPT
        assert body["request_id"].startswith("turnstile-")
        sp = body["sampling_params"]
        assert sp == {
            "n": 1,
            "temperature": 0.7,
            "top_p": 0.95,
            "top_k": 0,
            "min_p": 0.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": 7,
            "min_tokens": 0,
            "ignore_eos": False,
            # up to 0.32 vLLM cuts the list to k entries with the sampled token first
            "logprobs": 3 if version == "0.33.0" else 4,
            "skip_special_tokens": False,
            "include_stop_str_in_output": False,
            "seed": 42,
            "stop": ["<3>"],
            "stop_token_ids": [IM_END],
            "logit_bias": {"12": 1.5},
            "detokenize": True,
        }


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_a_long_int32_prompt_reaches_the_engine_exactly_call_after_call(route):
    """The gateway's int32 prompts, many blocks long (their JSON written from kept blocks,
    ``engines/prompt_json.py``), as a session sends them: extended, then edited inside a
    block already sent, then branched; the fake records what it parsed off the wire."""
    from array import array

    from turnstile.engines.prompt_json import BLOCK

    rng = random.Random(route)
    first = [rng.randrange(4, 60) for _ in range(3 * BLOCK + 17)]
    grown = first + [rng.randrange(4, 60) for _ in range(BLOCK)]
    edited = list(grown)
    edited[BLOCK + 5] = 61 if edited[BLOCK + 5] != 61 else 62
    branch = grown[: 2 * BLOCK - 1] + [3, 2, 1]
    prompts = [first, grown, edited, branch, grown]

    async def go(url: str) -> None:
        engine = make_engine("vllm", url, api=route)
        await engine.start()
        try:
            for ids in prompts:
                async for _ in engine.generate(array("i", ids), SamplingParams(max_tokens=1)):
                    pass
        finally:
            await engine.close()

    with VLLMFake("0.33.0", max_model_len=8 * BLOCK) as fake:
        run(go(fake.url))
        path = "/inference/v1/generate" if route == "generate" else "/v1/completions"
        field = "token_ids" if route == "generate" else "prompt"
        sent = [b[field] for b in fake.rec.bodies(path) if field in b]  # (not the probe)
        assert sent == prompts


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0", "0.33.0"])
def test_top_logprobs_are_the_true_top_k_in_every_version(version):
    with VLLMFake(version) as fake:
        for seed in range(4):
            p = SamplingParams(max_tokens=10, seed=seed, top_logprobs=2, temperature=1.5)
            events, finish, _ = run(generate(fake.url, p))
            gen = fake.rec.sent[finish.engine_request_id]
            # the fake was asked for k+1 (or k): its top list has at least k entries
            assert [e.top for e in events] == [s.top[:2] for s in gen.steps]
            assert any(s.rank > 2 for s in gen.steps) or seed < 3


@pytest.mark.parametrize("version", ["0.29.0", "0.32.0", "0.33.0"])
def test_the_wire_shape_of_each_version(version):
    """What the adapter read is what the fake put on the wire, in that version's shape."""
    with VLLMFake(version) as fake:
        p = SamplingParams(max_tokens=3, seed=1, top_logprobs=1)
        events, finish, _ = run(generate(fake.url, p, stream=True))
        raw = b"".join(fake.rec.raw[finish.engine_request_id])
        chunks = [
            orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")
        ]
        entries = [
            c
            for ch in chunks
            for choice in ch["choices"]
            for c in (choice["logprobs"] or {}).get("content") or []
        ]
        if version == "0.29.0":
            assert b'"token":"token_id:' in raw and b'"stop_reason"' not in raw
            ids = [int(e["token"].split(":")[1]) for e in entries]
        else:
            assert b'"token_id":' in raw and b'"stop_reason":' in raw
            ids = [e["token_id"] for e in entries]
            assert b'"output_mode":"tokens"' in raw
        assert ids == [e.token_id for e in events]
        assert [e["logprob"] for e in entries] == [e.logprob for e in events]
        assert raw.endswith(b"data: [DONE]\n\n")


def test_logprobs_mode_is_read_from_a_dev_mode_server():
    with VLLMFake("0.33.0", dev_mode=True, logprobs_mode="processed_logprobs") as fake:
        events, finish, engine = run(
            generate(fake.url, SamplingParams(max_tokens=3, seed=2, temperature=0.6))
        )
        assert finish.logprob_kind == "processed_logprobs"
        assert engine.logprobs_mode_source == "server"
        assert (
            engine.logprob_warning(SamplingParams(max_tokens=1, temperature=0.6, top_p=0.5)) is None
        )
        assert engine.logprob_warning() is None
    with VLLMFake("0.33.0") as fake:
        _, finish, engine = run(generate(fake.url, SamplingParams(max_tokens=2, seed=2)))
        assert finish.logprob_kind == "raw_logprobs"
        assert "could not be read" in engine.logprob_warning()
    engine = VLLMEngine("http://unused", logprobs_mode="raw_logits")
    assert "not logprobs" in engine.logprob_warning()


@pytest.mark.parametrize("stream", [False, True])
def test_weight_version_spans_are_recorded(stream):
    with VLLMFake("0.33.0") as fake:
        fake.weight_version = "step-7"
        fake.version_from = {4: "step-8"}
        p = SamplingParams(max_tokens=6, seed=5, logit_bias={EOS: -100.0, IM_END: -100.0})
        events, finish, _ = run(generate(fake.url, p, stream=stream))
        assert finish.weight_versions == [
            {"version": "step-7", "start": 0, "end": 4},
            {"version": "step-8", "start": 4, "end": 6},
        ]
        assert finish.weight_version == "step-8"
        assert finish.token_versions(len(events)) == ["step-7"] * 4 + ["step-8"] * 2


def test_the_eos_token_is_reported_from_a_null_stop_reason():
    with VLLMFake("0.33.0") as fake:
        p = SamplingParams(max_tokens=6, seed=5, logit_bias={EOS: 100.0})
        events, finish, _ = run(generate(fake.url, p))
        assert [e.token_id for e in events] == [EOS]
        assert (finish.reason, finish.stop_token_id) == ("stop", EOS)


def test_stop_strings_are_reported():
    with VLLMFake("0.33.0") as fake:
        p = SamplingParams(max_tokens=30, seed=5, stop=["<1"])
        events, finish, _ = run(generate(fake.url, p, stream=True))
        gen = fake.rec.sent[finish.engine_request_id]
        if gen.stop_string:
            assert (finish.reason, finish.stop_string, finish.stop_token_id) == ("stop", "<1", None)
        assert [e.token_id for e in events] == gen.ids


@pytest.mark.parametrize("stream", [False, True])
def test_engine_failures_are_engine_errors(stream):
    with VLLMFake("0.33.0") as fake:
        fake.fail_next = 503
        with pytest.raises(EngineError) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4), stream=stream))
        assert e.value.status == 503 and "paused" in str(e.value)
        fake.fail_next = 500
        with pytest.raises(EngineError) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4), stream=stream))
        assert e.value.status == 502
        with pytest.raises(EngineError) as e:
            run(generate(fake.url, SamplingParams(max_tokens=4, temperature=-1.0), stream=stream))
        assert e.value.status == 400 and "temperature" in str(e.value)


def test_an_error_inside_the_stream_keeps_the_tokens_before_it():
    with VLLMFake("0.33.0") as fake:
        fake.fail_mid_stream = 503
        got: list = []

        async def go() -> None:
            engine = make_engine("vllm", fake.url)
            await engine.start()
            try:
                async for ev in engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=1)):
                    got.append(ev)
            finally:
                await engine.close()

        with pytest.raises(EngineError) as e:
            run(go())
        assert e.value.status == 503
        assert got and not any(isinstance(ev, Finish) for ev in got)


def test_an_engine_side_abort_is_an_error_not_a_finish():
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.05

        async def go() -> None:
            engine = make_engine("vllm", fake.url)
            await engine.start()
            try:
                async for batch in engine.generate(PROMPT, SamplingParams(max_tokens=50, seed=1)):
                    if batch and len(fake.rec.sent) == 1 and not fake.rec.aborts:
                        fake.abort(list(fake.rec.sent))  # e.g. /pause?mode=abort
            finally:
                await engine.close()

        with pytest.raises(EngineError) as e:
            run(go())
        assert "abort" in str(e.value) and e.value.status == 503
