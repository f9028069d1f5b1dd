"""A held call's seams (``gateway/token_in/resume.py``), on generated cases: the version spans
joined over chunks give each token the version of the chunk (or the engine's span) that sampled
it; the resubmission's penalties carried as logit_bias are the penalties the engine would have
applied to those tokens; a stop string across the seam is found where the joined text completes
it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.engines.base import SamplingParams, token_versions
from turnstile.gateway.token_in.resume import BIAS_LIMIT, Chunk, Seams, seam_stop

pytestmark = pytest.mark.unit


@st.composite
def chunked(draw: st.DrawFn) -> tuple[Seams, list[str | None]]:
    """Chunks of a completion, each under a policy version or with engine spans of its own;
    and, built token by token, the version each token must get."""
    seams = Seams(SamplingParams(max_tokens=1000))
    truth: list[str | None] = []
    at = 0
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 12))
        c = Chunk(at, 10 + at, {}, draw(st.sampled_from([None, "1", "2", "x"])), end=at + n)
        if n and draw(st.booleans()):  # the engine's own spans, chunk-relative
            cut = draw(st.integers(0, n))
            a, b = draw(st.sampled_from(["1", "2", "3"])), draw(st.sampled_from(["1", "3"]))
            c.spans = [
                {"version": a, "start": 0, "end": cut},
                # an engine may report tokens past what the call kept (a cut at a seam)
                {"version": b, "start": cut, "end": n + draw(st.integers(0, 3))},
            ]
            truth += [a] * cut + [b] * (n - cut)
        else:
            truth += [c.version] * n
        seams.chunks.append(c)
        at += n
    return seams, truth


@given(chunked())
def test_spans_give_each_token_the_version_that_sampled_it(case):
    seams, truth = case
    spans = seams.spans()
    assert token_versions(spans, len(truth)) == (truth or None)
    # contiguous, in order, no empty span, no two neighbours with one version
    assert all(s["start"] < s["end"] for s in spans)
    assert all(
        a["end"] == b["start"] and a["version"] != b["version"]
        for a, b in zip(spans, spans[1:], strict=False)
    )


@given(
    st.lists(st.integers(0, 30), max_size=60),
    st.floats(-2, 2),
    st.floats(-2, 2),
    st.dictionaries(st.integers(0, 30), st.floats(-100, 100), max_size=5),
)
def test_penalties_carried_as_the_bias_the_engine_would_have_applied(sampled, pres, freq, bias):
    seams = Seams(
        SamplingParams(
            max_tokens=100, presence_penalty=pres, frequency_penalty=freq, logit_bias=bias
        )
    )
    out = seams.resumed(sampled)
    assert out.max_tokens == 100 - len(sampled)
    counts = Counter(sampled)
    for t in set(bias) | set(counts):
        want = bias.get(t, 0.0) - (pres + freq * counts[t] if counts[t] and (pres or freq) else 0.0)
        assert out.logit_bias.get(t, 0.0) == pytest.approx(max(-BIAS_LIMIT, min(BIAS_LIMIT, want)))
    assert seams.params.logit_bias == bias  # the call's own sampling is left as asked


def _decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


@settings(max_examples=300)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=30), st.data())
def test_a_stop_string_across_the_seam_is_found_where_the_text_completes_it(ids, data):
    seam = data.draw(st.integers(1, len(ids) - 1))
    a = data.draw(st.integers(0, seam - 1))
    b = data.draw(st.integers(seam + 1, len(ids)))
    stop = _decode(ids[a:b])
    text = _decode(ids)
    got = seam_stop(_decode, ids, seam, [stop])
    first = text.find(stop)
    if first + len(stop) <= seam:
        # wholly before the seam: the first chunk's engine would have stopped there, not ours
        assert got is None or got[0] == text.find(stop, max(0, seam - len(stop) + 1)) + len(stop)
        return
    if first >= seam:  # wholly after: the engine sees it itself
        assert got is None
        return
    assert got == (first + len(stop), stop)  # one token per character: ends at that token


@given(st.lists(st.integers(0, 3), min_size=3, max_size=30), st.data())
def test_a_stop_string_wholly_after_the_seam_is_the_engines_to_find(ids, data):
    seam = data.draw(st.integers(1, len(ids) - 2))
    a = data.draw(st.integers(seam, len(ids) - 1))
    stop = _decode(ids[a : data.draw(st.integers(a + 1, len(ids)))])
    if _decode(ids).find(stop) >= seam:
        assert seam_stop(_decode, ids, seam, [stop]) is None
