"""The vLLM fake answers in the structure a real vLLM 0.32 does (no vLLM needed: every tier).

``tests/fakes/golden/vllm-0.32.0.json`` holds a real vLLM's answers to every request shape the
fake serves, recorded by ``tests/fakes/record_vllm_golden.py`` (the CPU build, SmolLM2); this
asks the fake, started as the real servers were, the same requests and compares status,
media type, keys, nesting, value types and SSE framing (``fakes/vllm_golden.py``), never
sampled values. ``tests/test_vllm_real.py`` checks the live server still matches the file.
"""

from __future__ import annotations

import httpx
import pytest
from fakes import vllm_golden as g

from turnstile.testing.fake_vllm import MODEL, VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    """The fake's answers, asked in the golden order (pause before resume...)."""
    main = VLLMFake("0.32.0", logprobs_mode="processed_logprobs", dev_mode=True, max_model_len=2048)
    defaults = VLLMFake("0.32.0", scale_out=False)
    out = {}
    with main, defaults, httpx.Client(timeout=30) as client:
        for case in g.cases(MODEL):
            base = main.url if case.server == g.MAIN else defaults.url
            out[case.name] = g.answer(client, base, case)
    return out


def test_the_golden_file_covers_every_case():
    golden = g.load()
    assert golden["vllm"].startswith("0.32.0")
    assert set(golden["cases"]) == {c.name for c in g.cases(MODEL)}


@pytest.mark.parametrize("name", [c.name for c in g.cases(MODEL)])
def test_the_fake_answers_as_vllm_does(answers, name):
    want = g.load()["cases"][name]
    assert not g.differences(want, answers[name], name), "\n".join(
        g.differences(want, answers[name], name)
    )


def test_the_comparison_sees_a_difference():
    """A field renamed, a type changed, a chunk left out: each is reported."""
    want = g.load()["cases"]["generate_stream_logprobs"]
    events = want["shape"]["events"]
    assert g.differences(want, {**want, "status": 500}, "x")
    assert g.differences(want, {**want, "shape": {**want["shape"], "events": events[1:]}}, "x")
    whole = g.load()["cases"]["generate_logprobs"]
    renamed = {k if k != "request_id" else "id": v for k, v in whole["shape"].items()}
    assert any(
        "request_id: missing" in d for d in g.differences(whole, {**whole, "shape": renamed}, "x")
    )
    retyped = {**whole["shape"], "created": "str"}
    assert g.differences(whole, {**whole, "shape": retyped}, "x")
