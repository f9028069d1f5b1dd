"""The vLLM fake answers in the structure a real vLLM 0.32 does (no vLLM needed: every tier).

``tests/fakes/golden/vllm-0.32.0.json`` holds a real vLLM's answers to every request shape the
fake serves, recorded by ``tests/fakes/record_vllm_golden.py`` (the CPU build, SmolLM2); this
asks the fake, started as the real servers were, the same requests and compares status,
media type, keys, nesting, value types and SSE framing (``fakes/vllm_golden.py``), never
sampled values; and the counts inside each answer (token IDs, logprob entries, usage, echoed
prompt IDs, SSE events), which must agree with each other in both the engine's answers and
the fake's, and between the two where the request fixes them. The fake's default version is
the one recorded here. ``tests/test_vllm_real.py`` checks the live server still matches the
file.
"""

from __future__ import annotations

import json

import httpx
import pytest
from fakes import vllm_golden as g

from turnstile.testing.fake_vllm import MODEL, VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


# token-bearing answers whose recorded example the recorder cut (a 2040-token prompt echoed):
# their counts are not in the file until it is re-recorded (the recorder now stores them)
CUT = {"completions_to_the_context_end"}
CASES = {c.name: c for c in g.cases(MODEL)}
# the answers that carry tokens: the 200s of generate, completions and chat
TOKEN_CASES = [
    n for n, c in CASES.items() if c.path in g.TOKEN_PATHS and g.load()["cases"][n]["status"] == 200
]


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


def test_the_fakes_default_version_is_the_recorded_one():
    """What most tests run on (``VLLMFake()``) is the version a real engine's answers hold."""
    assert g.load()["vllm"].split("-")[0] == VLLMFake().version
    assert g.GOLDEN.name == f"vllm-{VLLMFake().version}.json"


def test_the_engines_answers_agree_with_themselves():
    """The recorded answers' own counts: one logprob entry per token ID, usage equal to the
    prompt sent and the tokens sampled, one event per token. All token-bearing cases are
    read (but the ones named cut), so the check cannot shrink unseen."""
    golden = g.load()["cases"]
    read = {}
    for name in TOKEN_CASES:
        f = g.golden_facts(golden[name], CASES[name])
        if f is g.CUT:
            continue
        assert f is not None, f"{name}: a token answer with no counts ({golden[name]['status']})"
        assert not g.inconsistencies(f), f"{name}: {g.inconsistencies(f)}"
        read[name] = f
    assert set(read) == set(TOKEN_CASES) - CUT
    assert len(read) == 15  # generate, completions and chat, whole and streamed
    streams = [f for f in read.values() if "events" in f]
    assert len(streams) >= 7 and all(f["events"] >= f["token_events"] + 1 for f in streams)


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_the_fakes_counts_agree_with_themselves_and_the_engine(answers, name):
    got = answers[name]["facts"]
    assert got is not None, f"{name}: the fake gave no token answer ({answers[name]['status']})"
    assert not g.inconsistencies(got), f"{name}: {g.inconsistencies(got)}"
    want = g.golden_facts(g.load()["cases"][name], CASES[name])
    if want is g.CUT:
        assert name in CUT
        return
    diffs = g.fact_differences(want, got, CASES[name])
    assert not diffs, "\n".join(diffs)


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


def test_the_counts_see_a_disagreement():
    """A logprob entry dropped, usage off by one, a token chunk missing, a second [DONE]:
    each is reported, inside one answer and against the engine's."""
    cases = g.load()["cases"]
    whole = json.loads(cases["generate_logprobs"]["example"])
    case = CASES["generate_logprobs"]
    dump = json.dumps

    def counts(body: dict) -> dict:
        f = g.facts(case, dump(body), "application/json", 200)
        assert f is not None
        return f

    good = counts(whole)
    assert not g.inconsistencies(good)
    dropped = json.loads(dump(whole))
    dropped["choices"][0]["logprobs"]["content"].pop()
    assert g.inconsistencies(counts(dropped))
    usage = json.loads(dump(whole))
    usage["usage"]["completion_tokens"] += 1
    assert g.inconsistencies(counts(usage))
    prompt = json.loads(dump(whole))
    prompt["usage"]["prompt_tokens"] = 3
    prompt["usage"]["total_tokens"] = 7
    assert g.inconsistencies(counts(prompt))
    scase = CASES["generate_stream_logprobs"]
    raw = cases["generate_stream_logprobs"]["example"]
    events = raw.split("\n\n")
    missing = "\n\n".join(events[1:])
    f = g.facts(scase, missing, "text/event-stream", 200)
    assert g.inconsistencies(f) and g.fact_differences(
        g.golden_facts(cases[scase.name], scase), f, scase
    )
    twice = raw + "data: [DONE]\n\n"
    assert g.inconsistencies(g.facts(scase, twice, "text/event-stream", 200))
