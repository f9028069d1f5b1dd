"""The record's ``sampling_applied`` over generated requests, for every token-in adapter: it
is exactly the sampler fields of the body the adapter sends (the wire), complete (every field
the engine's sampler reads has a value, so none is left to the engine's or the model's
defaults), and each value's origin is right (the request's own, or the neutral value)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from turnstile.engines.base import RAW_LOGPROBS, SamplingParams, logprob_unfitness
from turnstile.engines.llamacpp import LlamaCppEngine
from turnstile.engines.sglang import SGLangEngine
from turnstile.engines.vllm import VLLMEngine
from turnstile.engines.vllm_reader import COMPLETIONS, GENERATE
from turnstile.gateway.token_in.sampling import (
    applied_sampling,
    behaviour_logprobs,
    sampling_params,
)
from turnstile.parsing.detect import FormatChoice
from turnstile.request import ChatRequest

pytestmark = pytest.mark.unit

# What each engine's sampler reads, from the engines' own code (the pinned packages):
# llama-server's default sampler chain (common/common.h, its /completion fields), vLLM's
# SamplingParams as its sampler and generation_config defaults touch them
# (ModelConfig.get_diff_sampling_param), SGLang's SamplingParams (sampling_params.py).
ENGINE_SAMPLERS = {
    "llama": {
        "n_predict", "temperature", "dynatemp_range", "top_k", "top_p", "min_p", "typical_p",
        "xtc_probability", "top_n_sigma", "mirostat", "dry_multiplier", "repeat_penalty",
        "frequency_penalty", "presence_penalty",
    },
    "vllm": {
        "max_tokens", "min_tokens", "temperature", "top_k", "top_p", "min_p",
        "repetition_penalty", "presence_penalty", "frequency_penalty",
    },
    "sglang": {
        "max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "min_p",
        "repetition_penalty", "presence_penalty", "frequency_penalty",
    },
}  # fmt: skip
# The no-op value of each field a request may leave out, as each engine spells it.
NEUTRAL = {
    "llama": {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
    "vllm": {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0},
    "sglang": {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
}
PARAM_ON_WIRE = {  # the request's name → each engine's
    "top_k": {"llama": "top_k", "vllm": "top_k", "sglang": "top_k"},
    "min_p": {"llama": "min_p", "vllm": "min_p", "sglang": "min_p"},
    "repetition_penalty": {
        "llama": "repeat_penalty",
        "vllm": "repetition_penalty",
        "sglang": "repetition_penalty",
    },
    "temperature": {"llama": "temperature", "vllm": "temperature", "sglang": "temperature"},
    "top_p": {"llama": "top_p", "vllm": "top_p", "sglang": "top_p"},
}


def _wire(engine: str, route: str, prompt: list[int], params: SamplingParams) -> tuple:
    """(the adapter's engine object, the sampler part of the body it would post)."""
    if engine == "llama":
        e = LlamaCppEngine("http://x")
        return e, e.request_body(prompt, params)
    if engine == "sglang":
        s = SGLangEngine("http://x")
        return s, s.request_body(prompt, params, False, "r")["sampling_params"]
    v = VLLMEngine("http://x")
    v.route = route
    body = v.request_body(prompt, params, False, "r", route)
    return v, body["sampling_params"] if route == GENERATE else body


maybe = st.none() | st.floats(0.0, 2.0)
# each field often left at its neutral value, so the cases where nothing moves the
# distribution (and a single field that does) come up, not only the all-changed ones
requests = st.builds(
    ChatRequest,
    messages=st.just([{"role": "user", "content": "hi"}]),
    max_tokens=st.none() | st.integers(1, 64),
    temperature=st.just(1.0) | st.floats(0.0, 2.0),
    top_p=st.just(1.0) | st.floats(0.01, 1.0),
    seed=st.none() | st.integers(0, 2**31),
    frequency_penalty=st.none() | maybe,
    presence_penalty=st.none() | maybe,
    repetition_penalty=st.none() | st.just(1.0) | st.floats(0.5, 2.0),
    top_k=st.none() | st.none() | st.integers(1, 100),
    min_p=st.none() | st.none() | st.floats(0.01, 1.0),
    logit_bias=st.just({}) | st.dictionaries(st.integers(0, 1000), st.floats(-100, 100)),
)


@settings(max_examples=150, deadline=None)
@given(
    req=requests,
    engine=st.sampled_from(["llama", "vllm", "sglang"]),
    route=st.sampled_from([GENERATE, COMPLETIONS]),
    default=st.none() | st.integers(1, 32),
)
def test_applied_record_is_the_wire_complete_with_origins(
    req: ChatRequest, engine: str, route: str, default: int | None
) -> None:
    params = sampling_params(req, 10, 200, [2], FormatChoice(None, False, None), "", default)
    adapter, wire = _wire(engine, route, [1, 2, 3], params)
    rec = applied_sampling(adapter.sent_sampling(params), req, params, default)
    # what the record says was sent is what the body holds, key for key
    assert rec["wire"] == {k: wire[k] for k in rec["wire"]}
    # complete: the engine's sampler has a value for every field it reads
    missing = ENGINE_SAMPLERS[engine] - rec["wire"].keys()
    assert not missing
    assert rec["from"].keys() == rec["wire"].keys()
    for name, on_wire in PARAM_ON_WIRE.items():
        key, asked = on_wire[engine], getattr(req, name)
        if asked is None:
            assert rec["wire"][key] == NEUTRAL[engine][key]
            assert rec["from"][key] == "neutral"
        elif name in ("temperature", "top_p") and asked == 1.0:
            assert rec["from"][key] == "neutral"  # OpenAI's default, not named in raw
        else:
            assert rec["wire"][key] == asked
            assert rec["from"][key] == "request"
    budget = {"llama": "n_predict", "vllm": "max_tokens", "sglang": "max_new_tokens"}[engine]
    assert rec["wire"][budget] == params.max_tokens
    want = "request" if req.max_tokens else ("default" if default else "context")
    assert rec["from"][budget] == want


@given(req=requests)
# each field alone, besides the generated mixes
@example(req=ChatRequest(messages=[]))
@example(req=ChatRequest(messages=[], top_k=5))
@example(req=ChatRequest(messages=[], top_p=0.9))
@example(req=ChatRequest(messages=[], min_p=0.1))
@example(req=ChatRequest(messages=[], temperature=0.7))
@example(req=ChatRequest(messages=[], logit_bias={3: 1.0}))
@example(req=ChatRequest(messages=[], frequency_penalty=0.5))
@example(req=ChatRequest(messages=[], presence_penalty=0.5))
@example(req=ChatRequest(messages=[], repetition_penalty=1.1))
@settings(max_examples=200, deadline=None)
def test_behaviour_verdict_is_the_unfitness_as_data(req: ChatRequest) -> None:
    params = sampling_params(req, 10, 200, [2], FormatChoice(None, False, None))
    why = logprob_unfitness(RAW_LOGPROBS, params)
    got = behaviour_logprobs(RAW_LOGPROBS, why)
    # raw logprobs are the sampler's only at temperature 1 with nothing moving the distribution
    plain = (
        req.temperature == 1.0
        and req.top_p >= 1.0
        and not req.top_k
        and not req.min_p
        and not req.logit_bias
        and not req.frequency_penalty
        and not req.presence_penalty
        and req.repetition_penalty in (None, 1.0)
    )
    assert got["exact"] is plain
    assert got["kind"] == RAW_LOGPROBS
    assert (got["why"] is None) is plain
