"""``turnstile.verify.recompute``: the logprob a call's recorded sampling and logprob mode
should have given, computed from the raw top N only. Truth: the whole distribution pushed
through the sampler's steps as vLLM 0.32's ``v1/sample/sampler.py`` orders them (bias,
presence/frequency penalties, temperature, min-p, top-k, top-p as ``apply_top_k_top_p``
masks an ascending sort's cumulative sum), over every token of the vocabulary. The interval
``recompute`` returns must hold the truth; the heavy module (tests/test_verify_vllm.py) holds
the same computation against real vLLM records."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from turnstile.engines.base import PROCESSED_LOGPROBS, RAW_LOGPROBS, SCALED_LOGPROBS
from turnstile.verify import BOUND, MASKED, Sampling, recompute

pytestmark = pytest.mark.unit


def _whole(logits: np.ndarray, s: Sampling, counts: dict[int, int]) -> np.ndarray:
    """The processed log-distribution over the whole vocabulary."""
    x = logits.astype(np.float64).copy()
    for t, b in s.logit_bias:
        x[t] += b
    if s.kind == PROCESSED_LOGPROBS:
        for t, c in counts.items():
            x[t] -= s.presence_penalty + s.frequency_penalty * c
    if s.greedy:
        return x - np.logaddexp.reduce(x)
    x = x / s.temperature
    if s.kind == PROCESSED_LOGPROBS and s.min_p > 0:
        p = np.exp(x - np.logaddexp.reduce(x))
        x[p < s.min_p * p.max()] = -np.inf
    if s.kind == PROCESSED_LOGPROBS and s.top_k > 0:
        x[x < np.sort(x)[::-1][s.top_k - 1]] = -np.inf
    if s.kind == PROCESSED_LOGPROBS and s.top_p < 1:
        order = np.argsort(x, kind="stable")
        xs = x[order]
        cum = np.cumsum(np.exp(xs - np.logaddexp.reduce(xs)))
        drop = cum <= 1 - s.top_p
        drop[-1] = False
        x[order[drop]] = -np.inf
    return x - np.logaddexp.reduce(x)


def _case(rng: np.random.Generator, vocab: int, s: Sampling, n: int = 20):
    logits = rng.standard_normal(vocab) * rng.uniform(1, 4)
    logits[rng.integers(0, vocab, 5)] += rng.uniform(2, 12)  # a peaked head, as an LM's
    counts = {int(t): int(rng.integers(1, 3)) for t in rng.integers(0, vocab, 4)}
    truth = _whole(logits, s, counts)
    p = np.exp(truth)
    target = int(rng.choice(vocab, p=p / p.sum()))  # what the sampler could have drawn
    raw = logits - np.logaddexp.reduce(logits)
    top = np.argsort(-raw)[:n]
    known = {int(t): float(raw[t]) for t in top}
    known[target] = float(raw[target])
    return known, float(raw[top[-1]]), target, counts, float(truth[target])


@pytest.mark.parametrize("seed", range(6))
def test_the_interval_holds_the_whole_distributions_value(seed):
    rng = np.random.default_rng(seed)
    vocab = 3000
    decided = 0
    for _ in range(150):
        s = Sampling(
            kind=PROCESSED_LOGPROBS,
            temperature=float(rng.choice([0.0, 0.7, 1.0, 1.3])),
            top_p=float(rng.choice([1.0, 0.9, 0.5])),
            top_k=int(rng.choice([0, 5, 50])),
            min_p=float(rng.choice([0.0, 0.05])),
            logit_bias=((1, -100.0), (7, -0.5)),
            presence_penalty=float(rng.choice([0.0, 0.5])),
            frequency_penalty=float(rng.choice([0.0, 0.2])),
        )
        known, floor, target, counts, truth = _case(rng, vocab, s)
        value, half = recompute(known, floor, target, s, counts, vocab=vocab)
        if math.isnan(value):
            continue  # an unknown token raised by the bias: refused, not guessed
        assert abs(value - truth) <= half + 1e-9, (s, value, half, truth)
        decided += half <= BOUND
    assert decided >= 30  # most cases are decided, not all left open


def test_raw_and_scaled_records_and_a_cut_token():
    rng = np.random.default_rng(1)
    raw_s = Sampling(kind=RAW_LOGPROBS, temperature=0.7, top_p=0.9)
    known, floor, target, counts, _ = _case(rng, 2000, raw_s)
    assert recompute(known, floor, target, raw_s) == (known[target], 0.0)
    scaled = Sampling(kind=SCALED_LOGPROBS, temperature=0.5, top_p=0.5)  # no cut in scaled
    known, floor, target, counts, truth = _case(rng, 2000, scaled)
    value, half = recompute(known, floor, target, scaled, vocab=2000)
    assert abs(value - truth) <= half + 1e-9
    # a token top-k 1 cuts: the recompute says it could not have been sampled
    cut = Sampling(kind=PROCESSED_LOGPROBS, temperature=1.0, top_k=1)
    second = sorted(known, key=known.__getitem__)[-2]
    assert recompute(known, floor, second, cut, vocab=2000) == (MASKED, 0.0)


def test_what_cannot_be_recomputed_is_refused_with_the_reason():
    info = {"logprob_kind": PROCESSED_LOGPROBS, "sampling": {"grammar": "root ::= x"}}
    assert "grammar" in (Sampling.of(info).refusal() or "")
    raw_grammar = {"logprob_kind": RAW_LOGPROBS, "sampling": {"grammar": "root ::= x"}}
    assert "grammar" in (Sampling.of(raw_grammar).refusal() or "")
    rep = {"logprob_kind": PROCESSED_LOGPROBS, "sampling": {"repetition_penalty": 1.1}}
    assert "repetition_penalty" in (Sampling.of(rep).refusal() or "")
    assert Sampling.of({"logprob_kind": "raw_logits"}).refusal()
    plain = {"logprob_kind": PROCESSED_LOGPROBS, "sampling": {"temperature": 0.7, "top_p": 0.9}}
    assert Sampling.of(plain).refusal() is None and Sampling.of(plain).needs_distribution


def test_every_engine_kind_has_a_scorer() -> None:
    """A new engine kind (``engines/kinds.py``) fails here until verify can score on it; its
    aliases reach the same scorer."""
    from turnstile.engines.kinds import ENGINE_KINDS
    from turnstile.verify import SCORERS, scorer

    assert {k.name for k in ENGINE_KINDS} == set(SCORERS)
    client = httpx.AsyncClient()  # never used: nothing is sent
    for k in ENGINE_KINDS:
        for name in (k.name, *k.aliases):
            assert scorer(name, client, "http://127.0.0.1:9").name == k.name
