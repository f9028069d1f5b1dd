"""The SGLang adapter against a real SGLang 0.5.23 on this CPU (torch_native attention, no
AMX), serving SmolLM2-135M-Instruct: opt-in, ``TURNSTILE_SGLANG=1`` (the test bed builds
its venv, ``turnstile.testbed_sglang.sglang_python``, and starts the server) or
``TURNSTILE_SGLANG_URL=http://...`` (one already running).

Turnstile → the recording relay (``test_vllm_real.Relay``) → SGLang's ``/generate``: the
records are compared with what SGLang received and returned. Not in the default suite: its
venv is about 7 GB (torch 2.14.1's CUDA wheels from the registry, sglang, sglang-kernel) and
the server takes two to three minutes to start here, past the suite's time budget; the
README says how it was run. Without the variable the module is skipped, saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import Turnstile
from test_vllm_real import NO_END, Relay, _chat, _client, start_relay

from turnstile import testbed, testbed_sglang, testbed_vllm

URL = os.environ.get("TURNSTILE_SGLANG_URL")
START = os.environ.get("TURNSTILE_SGLANG") == "1"
pytestmark = [
    pytest.mark.heavy,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not (URL or START),
        reason="opt-in: TURNSTILE_SGLANG=1, or TURNSTILE_SGLANG_URL to a running SGLang (README)",
    ),
]
GENERATE = "/generate"


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if URL:
        yield URL
        return
    log = tmp_path_factory.mktemp("sglang-server") / "sglang.log"
    with testbed_sglang.sglang_server(testbed_vllm.vllm_model(), log=log) as url:
        yield url


@pytest.fixture(scope="module")
def relay(sglang: str) -> Iterator[Relay]:
    rel, server = start_relay(sglang, paths=(GENERATE,))
    yield rel
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def ts(relay: Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Turnstile]:
    tmp = tmp_path_factory.mktemp("sglang")
    template = testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    args = ("--engine", "sglang", "--chat-template", str(template))
    model = testbed_vllm.vllm_model()  # the same SmolLM2 directory SGLang serves
    t = Turnstile(relay.url, model, tmp / "data", tmp / "ts.log", args).start()
    yield t
    t.stop()


def _sampled(ex) -> tuple[list[int], list[float]]:
    """What SGLang sampled, as it said so (whole, or the last cumulative/incremental event)."""
    if ex.response is not None:
        parts = [ex.response]
    else:
        parts = ex.chunks
    ids: list[int] = []
    lps: list[float] = []
    for p in parts:
        meta = p["meta_info"]
        out = p["output_ids"]
        if len(out) == meta["completion_tokens"]:  # cumulative: everything so far
            ids, lps = list(out), [e[0] for e in meta["output_token_logprobs"]]
        else:
            ids += out
            lps += [e[0] for e in meta["output_token_logprobs"][-len(out) :]] if out else []
    return ids, lps


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_two_turns_are_recorded_as_sglang_sampled(ts, relay, stream):
    """Token IDs in and out through /generate, temperature 0.7 / top_p 0.9: each record is
    SGLang's prompt and sampled IDs and its logprobs; the second prompt extends the first by
    exactly what was sampled; the weight version is SGLang's."""
    session = ts.session(test="sglang")
    client = _client(session)
    before = len(relay.exchanges)
    msgs: list[dict] = [{"role": "user", "content": "Name a colour."}]
    for turn in range(2):
        text, entries, finish = _chat(
            client, stream, messages=msgs, max_tokens=6, temperature=0.7, top_p=0.9,
            seed=turn, logprobs=True, logit_bias=NO_END,
        )  # fmt: skip
        assert finish == "length"
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Another."}]
    exs = relay.wait(before + 2)[before:]
    assert [(e.path, e.status) for e in exs] == [(GENERATE, 200)] * 2
    sp = exs[0].request["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["max_new_tokens"]) == (0.7, 0.9, 6)
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls[1]["parent_id"] == calls[0]["id"]
    for c, ex in zip(calls, exs, strict=True):
        ids, lps = _sampled(ex)
        prompt = ex.request["input_ids"]
        assert c["reused_prefix_len"] + len(c["prompt_delta_ids"]) == len(prompt)
        assert prompt[c["reused_prefix_len"] :] == c["prompt_delta_ids"]
        assert c["completion_ids"] == ids and len(ids) == 6
        assert c["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
        assert c["weight_version"] == ["default"] * 6
    chained = exs[0].request["input_ids"] + _sampled(exs[0])[0]
    assert exs[1].request["input_ids"][: len(chained)] == chained


def test_the_live_sglang_still_answers_as_the_golden_file(sglang):
    """The answers the SGLang fake is held to (tests/fakes/golden, test_sglang_golden.py) are
    still this server's."""
    import json

    import httpx
    from fakes import sglang_golden as g
    from fakes import vllm_golden as compare

    golden = json.loads(g.GOLDEN.read_text())
    diffs: list[str] = []
    with httpx.Client(timeout=120) as client:
        model = client.get(sglang + "/v1/models").json()["data"][0]["id"]
        for case in g.cases(model):
            got = compare.answer(client, sglang, case)
            diffs += compare.differences(golden["cases"][case.name], got, case.name)
    assert not diffs, "\n".join(diffs)
