"""The live mismatch monitor (``serve --verify-fraction F``): calls are scored again by an
engine in the background and the agreement is exported per weight version. Against the engine
that sampled them, exact records agree; against another engine's weights (a stale weight sync,
as a trainer would have it after a failed update) every call parts, and that is logged once.
Truth: the engine's own recompute, read through Prometheus' parser from ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

import turnstile_testbed as testbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _series(ts) -> dict[tuple[str, tuple], float]:
    return ts.series("turnstile_verify")


def _calls(ts, n: int, no_end_bias: dict) -> None:
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "Tell me about Oslo."}]
    for seed in range(n):
        r = client.chat.completions.create(
            model="t", messages=msgs, max_tokens=12, seed=seed, logit_bias=no_end_bias
        )
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "More."},
        ]


def _wait(ts, name: str, labels: tuple, value: float) -> dict:
    return ts.wait_series("turnstile_verify", name, labels, value)


NONE = (("weight_version", "none"),)


def test_exact_records_agree_with_the_engine_that_sampled_them(
    llama_tiny, tiny_qwen2, turnstile_factory, no_end_bias
):
    ts = turnstile_factory(llama_tiny, tiny_qwen2, extra=("--verify-fraction", "1"))
    _calls(ts, 3, no_end_bias)
    got = _wait(ts, "turnstile_verify_calls_total", NONE, 3)
    assert got.get(("turnstile_verify_parted_calls_total", NONE), 0) == 0
    # every call's worst token within llama.cpp's own noise: bit for bit when the engine
    # scores it as it sampled it; its CPU kernels vary with the batch shape, so a slot whose
    # cache holds other prompts can differ in the last digits (seen: one call of three past
    # 1e-6 in the full suite)
    below = got[("turnstile_verify_max_abs_delta_bucket", (("le", "0.001"), *NONE))]
    assert below == 3
    assert "parts from the engine's recompute" not in ts.log.read_text()


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory) -> Iterator[str]:
    """The same architecture and vocabulary with other random weights."""
    model = testbed.tiny_model("qwen2", "Qwen-Qwen2.5-7B-Instruct", seed=1)
    log = tmp_path_factory.mktemp("other") / "llama-server.log"
    with testbed.llama_server(model, ctx=2048, parallel=1, log=log) as url:
        yield url


def test_stale_weights_show_as_parted_calls_logged_once(
    llama_tiny, tiny_qwen2, turnstile_factory, no_end_bias, other_weights
):
    ts = turnstile_factory(
        llama_tiny,
        tiny_qwen2,
        extra=("--verify-fraction", "1", "--verify-engine-url", other_weights),
    )
    _calls(ts, 2, no_end_bias)
    got = _wait(ts, "turnstile_verify_parted_calls_total", NONE, 2)
    assert got[("turnstile_verify_calls_total", NONE)] == 2
    assert ts.log.read_text().count("parts from the engine's recompute") == 1


def test_no_fraction_no_verification(llama_tiny, tiny_qwen2, turnstile_factory, no_end_bias):
    ts = turnstile_factory(llama_tiny, tiny_qwen2)
    _calls(ts, 1, no_end_bias)
    assert not any(v for (name, _), v in _series(ts).items() if name.endswith("_total"))
