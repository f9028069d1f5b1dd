"""The SGLang fake answers in the structure a real SGLang 0.5.23 does (no SGLang needed).

``tests/fakes/golden/sglang-0.5.23.json`` holds a real SGLang's answers (its CPU run here,
torch_native attention, SmolLM2; ``tests/fakes/record_sglang_golden.py``); this asks the fake
the same requests and compares status, media type, keys, nesting, types and SSE framing
(``fakes/vllm_golden.py``'s comparison), never sampled values. The opt-in
``tests/test_sglang_real.py`` checks a live server against the same file.
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
