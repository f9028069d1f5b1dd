"""SGLang's sampler logprobs (issue 42): a sampled call under a finite top-k asks SGLang 0.5.23
for its sampling mask ("selected"), and the record then holds the sampler's own logprob of each
sampled token (kind ``processed_logprobs``, exact, as vLLM's processed mode) and the kept set's
mass per token (``kept_mass``); a call SGLang would refuse the mask for (top-p alone) is not
asked and its verdict says why; an answer that lacks a token's value is not called exact.

The truth is the fake's sampler (its kept set, renormalised: ``toy_model``), whose answer
lists are SGLang's (``tests/test_sglang_kept_set_source.py`` runs SGLang's own ``to_lists``
on them); a real SGLang's answer: docs/sampler-provenance.md."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest

from turnstile.engines import SamplingParams, make_engine
from turnstile.engines.base import PROCESSED_LOGPROBS, SCALED_LOGPROBS, Finish
from turnstile.engines.sglang import SGLangEngine, _Reader
from turnstile.store.trajectories import stitch
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.tokens import tokens
from turnstile.testing.toy_model import _log_softmax, _logits

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
PROMPT = [3, 1, 4, 1, 5]
# a real SGLang 0.5.23 on this CPU (SmolLM2-135M), recorded this round: top_k 3 with the mask
# (selected, support) and a top-p request asking for it (refused)
GOLDEN = json.loads(
    (Path(__file__).parent / "fakes/golden/sglang-0.5.23-sampling-mask.json").read_text()
)["cases"]


async def _generate(url: str, params: SamplingParams, stream: bool):
    engine = make_engine("sglang", url)
    await engine.start()
    try:
        out = [b async for b in engine.generate(PROMPT, params, stream=stream)]
    finally:
        await engine.close()
    return tokens(out)


def _kept_mass(context: list[int], kept: list[int], temperature: float) -> float:
    """The kept set's probability under the temperature-scaled distribution, from the toy
    model's logits (what SGLang's scaled logprobs are of)."""
    lp = _log_softmax([x / temperature for x in _logits(context)])
    return sum(math.exp(lp[i]) for i in kept)


@pytest.mark.parametrize(
    ("params", "asked"),
    [
        (SamplingParams(max_tokens=4, temperature=0.8, top_k=5), True),
        (SamplingParams(max_tokens=4, temperature=1.0, top_k=1), True),
        (SamplingParams(max_tokens=4, temperature=0.8, top_k=5, top_p=0.9, min_p=0.1), True),
        (SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9), False),  # SGLang refuses
        (SamplingParams(max_tokens=4, temperature=0.0, top_k=5), False),  # greedy
        (SamplingParams(max_tokens=4, temperature=0.8, top_k=4096), False),  # no headroom
    ],
)
def test_the_mask_is_asked_only_where_sglang_gives_it(params, asked) -> None:
    engine = SGLangEngine("http://127.0.0.1:9")
    engine.version = "0.5.23"
    body = engine.request_body(PROMPT, params, False, "r")
    assert body.get("return_sampling_mask", False) is asked
    assert ("sampling_logprobs_mode" in body) is asked
    if asked:
        assert body["sampling_logprobs_mode"] == "selected"
        assert engine.logprob_warning(params) is None
    engine.version = "0.5.22"  # an older server: nothing it may not know is sent
    assert "return_sampling_mask" not in engine.request_body(PROMPT, params, False, "r")
    engine.version = None
    assert "return_sampling_mask" not in engine.request_body(PROMPT, params, False, "r")


def test_the_fake_refuses_the_mask_without_a_top_k_as_sglangs_scheduler_does() -> None:
    with SGLangFake() as fake:
        import httpx

        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0.8, "top_p": 0.9},
            "return_sampling_mask": True,
        }
        r = httpx.post(fake.url + "/generate", json=body)
        assert r.status_code == 400 and "requires top_k=1" in r.text


@pytest.mark.parametrize(
    ("stream", "options"),
    [(False, {}), (True, {}), (True, {"skip_events": 1}), (True, {"incremental": True})],
)
def test_the_calls_logprobs_are_the_samplers(stream, options) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=6, top_p=0.95, seed=5)
    with SGLangFake(**options) as fake:
        events, finish = asyncio.run(_generate(fake.url, params, stream))
        gen = next(iter(fake.rec.sent.values()))
        body = fake.rec.bodies("/generate")[-1]
    assert body["return_sampling_mask"] is True
    assert [e.token_id for e in events] == gen.ids and len(gen.ids) >= 2
    for e, step in zip(events, gen.steps, strict=True):
        assert e.logprob == pytest.approx(step.sampling_logprob, abs=1e-6)  # float32 on the wire
        assert e.logprob != pytest.approx(step.logprob, abs=1e-6)  # not the scaled one
    assert finish.logprob_kind == PROCESSED_LOGPROBS
    kept = finish.arrays["kept_mass"]
    assert kept.start == len(PROMPT) and kept.values.dtype == np.float32
    ctx = list(PROMPT)
    for mass, step in zip(kept.values.tolist(), gen.steps, strict=True):
        assert 0 < mass <= 1
        assert mass == pytest.approx(_kept_mass(ctx, step.kept, 0.7), rel=1e-5)
        ctx.append(step.token_id)
    assert finish.asked["kept_mass"] == {"asked": True, "mode": "selected", "rows": len(gen.ids)}


def test_without_a_top_k_the_scaled_logprobs_stay_and_are_not_exact() -> None:
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=5)
    with SGLangFake() as fake:
        events, finish = asyncio.run(_generate(fake.url, params, False))
        gen = next(iter(fake.rec.sent.values()))
        assert "return_sampling_mask" not in fake.rec.bodies("/generate")[-1]
    assert [e.logprob for e in events] == pytest.approx([s.logprob for s in gen.steps])
    assert finish.logprob_kind == SCALED_LOGPROBS and "kept_mass" not in finish.arrays
    engine = SGLangEngine("http://127.0.0.1:9")
    engine.version = "0.5.23"
    assert "top_p 0.9" in engine.logprob_warning(params)


def test_an_answer_missing_a_tokens_value_is_not_called_exact() -> None:
    engine = SGLangEngine("http://127.0.0.1:9")
    engine.version = "0.5.23"
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3)
    reader = _Reader(engine, params, len(PROMPT), PROMPT, True)
    reader.feed(
        {
            "output_ids": [7, 8, 9],
            "meta_info": {
                "finish_reason": {"type": "length", "length": 3},
                "output_token_logprobs": [[-2.0, 7, None], [-2.5, 8, None], [-1.0, 9, None]],
                # the second token's value is missing, the third's kept set lacks it
                "output_token_sampling_logprobs": [-0.5, None, -0.2],
                "output_token_sampling_mask": [[7, 1], [8, 2], [4, 5]],
                "completion_tokens": 3,
            },
        },
        cumulative=True,
    )
    batch = reader.take()
    assert batch.logprobs == [-0.5, -2.5, -1.0]
    finish: Finish = reader.finish()
    assert finish.logprob_kind == SCALED_LOGPROBS and "kept_mass" not in finish.arrays
    assert "1 of 3" in finish.asked["kept_mass"]["note"]


def test_the_record_says_exact_and_the_trajectory_carries_the_kept_mass(tiny_qwen2, tmp_path):
    from turnstile.app.wiring import build_gateway
    from turnstile.dialects.chat.request import parse_chat_request

    async def session(url: str) -> None:
        engine = make_engine("sglang", url)
        await engine.start()
        gw.engine = engine
        msgs = [{"role": "user", "content": "list the files"}]
        try:
            for extra in ({"top_k": 5, "temperature": 0.8}, {"top_p": 0.9, "temperature": 0.8}):
                body = {"messages": msgs, "max_tokens": 6, "seed": 1, **extra}
                answer = await gw.complete("s", parse_chat_request(body))
                msgs = [*msgs, answer.message, {"role": "user", "content": "go"}]
        finally:
            await engine.close()

    with SGLangFake() as fake:
        gw = build_gateway(fake.url, str(tiny_qwen2), tmp_path / "d", audit_template=False)
        gw.store.create_session({}, "s")
        asyncio.run(session(fake.url))
        calls = gw.store.calls("s")
    first, second = (c.info["behaviour_logprobs"] for c in calls)
    assert first == {"exact": True, "kind": PROCESSED_LOGPROBS, "why": None}
    assert second["exact"] is False and "top_p 0.9" in second["why"]
    assert calls[0].info["logprob_kind"] == PROCESSED_LOGPROBS
    assert calls[0].info["arrays_asked"]["kept_mass"]["rows"] == len(calls[0].completion_ids)
    (traj,) = stitch(calls)
    assert [t["behaviour_exact"] for t in traj.turns] == [True, False]
    mass, present = traj.arrays["kept_mass"], traj.present["kept_mass"].astype(bool)
    turn = traj.turns[0]
    on = np.zeros(len(traj.token_ids), dtype=bool)
    on[turn["completion_start"] : turn["completion_end"]] = True
    assert (present == on).all()  # the first call's sampled tokens only
    assert np.isnan(mass[~present]).all() and (mass[present] > 0).all()
    assert (mass[present] <= 1).all()
    # the Parquet export carries the array and its mask as columns (null where absent)
    import pyarrow.parquet as pq

    from turnstile.store.export import export

    res = export(tmp_path / "d", tmp_path / "out", batch="b")
    (row,) = [r for f in res.files["trajectories"] for r in pq.read_table(f).to_pylist()]
    assert row["kept_mass_present"] == present.astype(int).tolist()
    got = np.array([np.nan if v is None else v for v in row["kept_mass"]], dtype=np.float32)
    assert np.array_equal(got, mass, equal_nan=True)


def test_the_reader_on_a_real_sglang_answer() -> None:
    """The recorded answer of a real SGLang: its "selected" values become the logprobs, each
    the support's value at the sampled token, and the kept mass is ``exp(scaled - selected)``
    (the support's probabilities sum to 1 there)."""
    case = GOLDEN["selected"]
    body, meta = case["body"], case["body"]["meta_info"]
    engine = SGLangEngine("http://127.0.0.1:9")
    engine.version = "0.5.23"
    prompt = case["request"]["input_ids"]
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=3)
    assert engine.asks_kept_set(params)
    reader = _Reader(engine, params, len(prompt), prompt, True)
    reader.feed(body, cumulative=True)
    batch, finish = reader.take(), reader.finish()
    assert batch.ids == body["output_ids"]
    assert batch.logprobs == meta["output_token_sampling_logprobs"]
    assert finish.logprob_kind == PROCESSED_LOGPROBS
    scaled = [x[0] for x in meta["output_token_logprobs"]]
    want = [math.exp(a - b) for a, b in zip(scaled, batch.logprobs, strict=True)]
    assert finish.arrays["kept_mass"].values.tolist() == pytest.approx(want, rel=1e-6)
    support = GOLDEN["support"]["body"]["meta_info"]
    for mask, row in zip(
        support["output_token_sampling_mask"],
        support["output_token_sampling_logprobs"],
        strict=True,
    ):
        assert len(mask) == len(row) == 3
        assert sum(math.exp(v) for v in row) == pytest.approx(1.0, abs=1e-5)


def test_the_fake_answers_as_the_real_one_does() -> None:
    """The same requests to the fake: the mask keys, their shapes, and the refusal's words."""
    import httpx

    with SGLangFake() as fake:
        for name in ("selected", "support", "top_p_only"):
            case = GOLDEN[name]
            body = {**case["request"], "input_ids": PROMPT}
            r = httpx.post(fake.url + "/generate", json=body)
            assert r.status_code == case["status"], name
            if r.status_code != 200:
                assert r.json() == case["body"]
                continue
            got, real = r.json()["meta_info"], case["body"]["meta_info"]
            mask_keys = {k for k in real if "sampling" in k}
            assert {k for k in got if "sampling" in k} == mask_keys
            n = len(r.json()["output_ids"])
            assert got["output_token_sampling_mask_length"] == n
            assert all(len(m) == 3 for m in got["output_token_sampling_mask"])
            assert all(len(m) == 3 for m in real["output_token_sampling_mask"])
            lps = got["output_token_sampling_logprobs"]
            assert all(isinstance(v, list if name == "support" else float) for v in lps)
