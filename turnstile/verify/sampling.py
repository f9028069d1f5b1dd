"""The recorded sampler, and a processed logprob recomputed from raw ones.

A call is scored under its own recorded sampling (:class:`Sampling`, read from its
``info``). Engines score with raw logprobs; where the recorded mode includes the sampler's
work (bias, penalties, temperature, min-p, top-k, top-p), :func:`recompute` redoes it from
the raw logprob and its top N alternatives, the unknown tail kept as an interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..engines.base import PROCESSED_LOGPROBS, RAW_LOGPROBS, SCALED_LOGPROBS

# A recomputed processed logprob is known to within ± its half-width (the tail past the top N
# bounds it); past this the token is left out as undecided (counted, never silently).
BOUND = 0.02
MASKED = -100.0  # the recompute's logprob for a token the recorded sampling could not sample
VOCAB_BOUND = 2**18  # at most this many tokens in a vocabulary (bounds a tail at T > 1)
_GREEDY_EPS = 1e-5  # vLLM: a temperature below this is greedy


@dataclass(frozen=True)
class Sampling:
    """What one recorded call was sampled under (its record's ``info.sampling`` and
    ``info.logprob_kind``), which decides what its recorded logprobs should equal."""

    kind: str = RAW_LOGPROBS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    constrained: bool = False  # a grammar or JSON schema masked the distribution
    start: int = 0  # where the call's completion starts in the scored sequence (penalties)

    @classmethod
    def of(cls, info: dict, start: int = 0) -> Sampling:
        sp = info.get("sampling") or {}
        return cls(
            kind=info.get("logprob_kind") or RAW_LOGPROBS,
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k") or 0),
            min_p=float(sp.get("min_p") or 0.0),
            logit_bias=tuple(
                sorted((int(k), float(v)) for k, v in (sp.get("logit_bias") or {}).items())
            ),
            presence_penalty=float(sp.get("presence_penalty") or 0.0),
            frequency_penalty=float(sp.get("frequency_penalty") or 0.0),
            repetition_penalty=float(sp.get("repetition_penalty") or 1.0),
            constrained=bool(sp.get("grammar") or sp.get("json_schema")),
            start=start,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def needs_distribution(self) -> bool:
        """Does the recorded logprob depend on more than the token's own raw logprob?"""
        if self.kind == RAW_LOGPROBS:
            return False
        cut = not self.greedy and (self.top_p < 1 or self.top_k > 0 or self.min_p > 0)
        scaled = not self.greedy and not math.isclose(self.temperature, 1.0)
        pen = self.kind == PROCESSED_LOGPROBS and (self.presence_penalty or self.frequency_penalty)
        return bool(self.logit_bias or pen or scaled or (self.kind == PROCESSED_LOGPROBS and cut))

    def refusal(self) -> str | None:
        """Why this call's logprobs cannot be recomputed from the model's raw distribution."""
        if self.kind not in (RAW_LOGPROBS, SCALED_LOGPROBS, PROCESSED_LOGPROBS):
            return f"its logprobs are {self.kind}, not logprobs of a distribution"
        if self.constrained:
            return (
                "a grammar-forced call: the engine masked its distribution (raw and processed "
                "logprobs alike) with a grammar state that is not recomputed here"
            )
        if self.kind == PROCESSED_LOGPROBS and self.repetition_penalty != 1.0:
            return (
                "repetition_penalty in processed_logprobs mode: it scales logits by their sign, "
                "which logprobs do not keep"
            )
        if self.kind == PROCESSED_LOGPROBS and (
            self.presence_penalty < 0 or self.frequency_penalty < 0
        ):
            return "a negative presence/frequency penalty raises tokens past the known top N"
        return None


def recompute(
    known: dict[int, float],
    floor: float,
    target: int,
    s: Sampling,
    counts: dict[int, int] | None = None,
    vocab: int = VOCAB_BOUND,
) -> tuple[float, float]:
    """The logprob of ``target`` that the recorded call's mode should have given, from the raw
    logprobs ``known`` of the top N tokens (and the target); ``floor`` is the N-th best raw
    logprob, above which no unknown token lies. Follows vLLM's sampler (0.32, ``v1/sample``):
    logit bias, then presence/frequency penalties (``counts``: the call's output so far), then
    temperature, then min-p, top-k, top-p (kept: the tokens with less than p of the mass
    above them). The unknown tail is carried as bounds on its mass; returns the midpoint and
    the half-width of the interval the true value lies in (0 when decided exactly)."""
    if not s.needs_distribution:
        return known[target], 0.0
    if not math.isfinite(floor):
        return math.nan, math.inf  # no top N to bound the rest by
    toks = np.fromiter(known, dtype=np.int64, count=len(known))
    raw = np.fromiter(known.values(), dtype=np.float64, count=len(known))
    tail_raw = max(0.0, 1.0 - float(np.exp(raw).sum()))
    u = raw.copy()
    lowered = 0  # tail tokens pushed down (their mass may leave the tail)
    index = {int(t): i for i, t in enumerate(toks)}
    for tok, b in s.logit_bias:
        if tok in index:
            u[index[tok]] += b
        elif b > 0:
            return math.nan, math.inf  # an unknown token raised: it may lead
        else:
            lowered += 1
    if s.kind == PROCESSED_LOGPROBS:
        for tok, c in (counts or {}).items():
            pen = s.presence_penalty + s.frequency_penalty * c
            if pen and tok in index:
                u[index[tok]] -= pen
            elif pen:
                lowered += 1
    t = 1.0 if s.greedy else s.temperature
    w = u / t
    top = floor / t  # no unknown token scores above this
    # bounds on the tail's scaled mass, sum over unknown j of exp(a_j / t)
    low_raw = max(0.0, tail_raw - lowered * math.exp(floor))
    unknown = max(1, vocab - len(known))
    if t <= 1.0:
        hi = tail_raw * math.exp(floor * (1 / t - 1))
        lo = 0.0 if t < 1.0 else low_raw
    else:
        hi = min(tail_raw ** (1 / t) * unknown ** (1 - 1 / t), unknown * math.exp(top))
        lo = low_raw ** (1 / t)
    sure = np.ones(len(w), bool)  # known tokens certainly kept
    maybe = np.zeros(len(w), bool)  # known tokens perhaps kept
    tail = "all"  # the tail: all of it kept, "some", or "none"
    processed = s.kind == PROCESSED_LOGPROBS and not s.greedy
    if processed and s.min_p > 0:
        cut = float(w.max()) + math.log(s.min_p)
        sure &= w >= cut
        if top < cut:
            tail, hi, lo = "none", 0.0, 0.0
        else:
            tail, lo = "some", 0.0
    if processed and 0 < s.top_k < vocab:
        above = np.sort(w[sure & (w > top)])[::-1]
        if (tail == "none" or len(above) >= s.top_k) and sure.any():
            kth = np.sort(w[sure])[::-1][min(s.top_k, int(sure.sum())) - 1]
            sure &= w >= kth
            tail, hi, lo = "none", 0.0, 0.0
        else:
            low = sure & (w <= top)
            maybe |= low
            sure &= ~low
            tail, lo = "some", 0.0
    before_top_p = 0.0  # a lower bound on the mass top-p cuts from: it keeps at least p of it
    if processed and s.top_p < 1.0:
        e = np.exp(w)
        z_lo = before_top_p = float(e[sure].sum()) + lo
        z_hi = float(e[sure].sum() + e[maybe].sum()) + hi
        order = np.argsort(-w)
        mass = 0.0
        gone = False
        for i in order:
            if not (sure[i] or maybe[i]):
                continue
            if gone:
                sure[i] = maybe[i] = False
                continue
            if tail != "none" and w[i] <= top:
                sure[i], maybe[i] = False, True  # tail tokens may rank above it: open
                continue
            if mass >= s.top_p * z_hi:
                sure[i] = maybe[i] = False
                gone = True
            elif mass >= s.top_p * z_lo:
                sure[i], maybe[i] = False, True
            mass += float(e[i])
        if gone:
            tail, hi, lo = "none", 0.0, 0.0
        elif tail != "none":
            tail, lo = "some", 0.0
    ti = index[target]
    if not (sure[ti] or maybe[ti]):
        return MASKED, 0.0
    sure[ti], maybe[ti] = True, False  # it was sampled: it was kept
    e = np.exp(w)
    z_lo = float(e[sure].sum()) + lo
    z_hi = float(e[sure].sum() + e[maybe].sum()) + hi
    z_lo = max(z_lo, s.top_p * before_top_p)
    a, b = float(w[ti]) - math.log(z_hi), float(w[ti]) - math.log(z_lo)
    return (a + b) / 2, (b - a) / 2


def output_counts(ids: Sequence[int], s: Sampling, p: int) -> dict[int, int]:
    out: dict[int, int] = {}
    if s.kind == PROCESSED_LOGPROBS and (s.presence_penalty or s.frequency_penalty):
        for t in ids[s.start : p]:
            out[t] = out.get(t, 0) + 1
    return out
