"""The SGLang fake answers in the structure a real SGLang 0.5.23 does (no SGLang needed).

``tests/fakes/golden/sglang-0.5.23.json`` holds a real SGLang's answers (its CPU run here,
torch_native attention, SmolLM2; ``tests/fakes/record_sglang_golden.py``); this asks the fake
the same requests and compares status, media type, keys, nesting, types and SSE framing
(``fakes/vllm_golden.py``'s comparison), never sampled values; and the counts inside each
answer (output IDs, logprob lists and their stated length, usage against the prompt sent,
each cumulative stream event), in the engine's answers and the fake's, and between the two.
The opt-in ``tests/test_sglang_real.py`` checks a live server against the same file.
"""

from __future__ import annotations

import json

import httpx
import pytest
from fakes import sglang_golden as g
from fakes import vllm_golden as compare

from turnstile.testing.fake_sglang import MODEL, SGLangFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NAMES = [c.name for c in g.cases(MODEL)]
CASES = {c.name: c for c in g.cases(MODEL)}
# token answers: the 200s of /generate (the refusals and the in-stream error carry no tokens)


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(g.GOLDEN.read_text())


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    with SGLangFake(context_len=g.CONTEXT) as fake, httpx.Client(timeout=30) as client:
        return {c.name: compare.answer(client, fake.url, c) for c in g.cases(MODEL)}


def test_the_golden_file_covers_every_case(golden):
    assert golden["sglang"] == "0.5.23"
    assert set(golden["cases"]) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_fake_answers_as_sglang_does(golden, answers, name):
    diffs = compare.differences(golden["cases"][name], answers[name], name)
    assert not diffs, "\n".join(diffs)


def test_the_engines_answers_agree_with_themselves(golden):
    read = {}
    for name, case in CASES.items():
        f = compare.golden_facts(golden["cases"][name], case)
        if f is None:
            continue
        assert f is not compare.CUT, f"{name}: its example was cut"
        assert not compare.inconsistencies(f), f"{name}: {compare.inconsistencies(f)}"
        read[name] = f
    # every 200 of /generate but the in-stream error: 6 answers, 2 of them streams
    assert sorted(read) == sorted(
        n
        for n, c in CASES.items()
        if c.path == "/generate"
        and golden["cases"][n]["status"] == 200
        and n != "generate_stream_bad_temperature"
    )
    assert len(read) == 6 and sum("events" in f for f in read.values()) == 2


@pytest.mark.parametrize("name", NAMES)
def test_the_fakes_counts_agree_with_themselves_and_the_engine(golden, answers, name):
    got = answers[name]["facts"]
    assert not compare.inconsistencies(got), f"{name}: {compare.inconsistencies(got)}"
    want = compare.golden_facts(golden["cases"][name], CASES[name])
    if want is not None and "events" in want:  # a cumulative stream: as many events as reads
        want = {k: v for k, v in want.items() if k != "events"}
        got = {k: v for k, v in (got or {}).items() if k != "events"}
    diffs = compare.fact_differences(want, got, CASES[name])
    assert not diffs, "\n".join(diffs)
