"""The toy model the engine fakes sample from: deterministic pseudo-logits over a 96-token
vocabulary, sampled like an engine (logit bias, temperature, top-p, seeded per request).

It is a fake's "truth": every token a fake sends is generated here, with the logprobs and top-k
alternatives of the distribution the fake's engine would report, so a test compares an
adapter's events with what the fake really sent (``Recorder.sent``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

VOCAB = 96
EOS = 95  # the model's own end-of-sequence token
IM_END = 94  # a chat template's end-of-turn token (a stop token only when the request says so)


def token_text(tid: int) -> str:
    return f"<{tid}>"


@dataclass
class Step:
    """One sampled token as a fake engine reports it."""

    token_id: int
    logprob: float  # in the fake's logprob mode
    rank: int  # 1-based, in that distribution
    top: list[tuple[int, float]]  # best first, len = the requested k
    version: str = "default"
    # the sampler's kept set (most probable first) and the sampled token's logprob under the
    # distribution it was drawn from (renormalised over that set), whatever the logprob mode
    kept: list[int] | None = None
    kept_logprobs: list[float] | None = None  # each kept token's, in that distribution
    sampling_logprob: float | None = None


@dataclass
class Generation:
    steps: list[Step]
    reason: str  # "stop" | "length" | "abort"
    stop_token: int | None = None
    stop_string: str | None = None

    @property
    def ids(self) -> list[int]:
        return [s.token_id for s in self.steps]


def _logits(context: list[int]) -> list[float]:
    """Deterministic pseudo-logits for the next token; EOS is unlikely unless biased."""
    rng = random.Random(hash((tuple(context[-2:]), len(context))) & 0xFFFFFFFF)
    out = [rng.gauss(0.0, 2.0) for _ in range(VOCAB)]
    out[EOS] -= 6.0
    out[IM_END] -= 3.0
    return out


def _log_softmax(xs: list[float]) -> list[float]:
    finite = [x for x in xs if x != -math.inf]
    m = max(finite)
    s = math.log(sum(math.exp(x - m) for x in finite))
    return [x - m - s if x != -math.inf else -math.inf for x in xs]


class ToyModel:
    """Samples like an engine: logit bias, temperature, top-p; seeded per request."""

    def __init__(self, logprob_mode: str = "raw_logprobs"):
        # raw_logprobs | processed_logprobs | scaled_logprobs (SGLang) | raw_logits
        self.logprob_mode = logprob_mode

    def step(
        self,
        context: list[int],
        temperature: float,
        top_p: float,
        logit_bias: dict[int, float],
        rng: random.Random,
        k: int,
        top_k: int = 0,
    ) -> Step:
        raw = _logits(context)
        biased = [x + logit_bias.get(i, 0.0) for i, x in enumerate(raw)]
        greedy = temperature == 0
        scaled = biased if greedy else [x / temperature for x in biased]
        lp = _log_softmax(scaled)
        order = sorted(range(VOCAB), key=lambda i: -lp[i])
        keep = set(order)
        if top_k > 0 and not greedy:  # the top_k most probable, then top-p among them
            order = order[:top_k]
            keep = set(order)
        if top_p < 1.0 and not greedy:
            keep, acc = set(), 0.0
            for i in order:
                keep.add(i)
                acc += math.exp(lp[i])
                if acc >= top_p:
                    break
        processed = _log_softmax([lp[i] if i in keep else -math.inf for i in range(VOCAB)])
        if greedy:
            tid = order[0]
        else:
            r, acc, tid = rng.random(), 0.0, order[-1]
            for i in order:
                if i in keep:
                    acc += math.exp(processed[i])
                    if r < acc:
                        tid = i
                        break
        if self.logprob_mode == "processed_logprobs" and not greedy:
            report = processed
        elif self.logprob_mode == "scaled_logprobs" and not greedy:
            report = lp
        elif self.logprob_mode == "raw_logits":
            report = raw
        else:
            report = _log_softmax(raw)
        ranked = sorted(range(VOCAB), key=lambda i: -report[i])
        rank = ranked.index(tid) + 1
        top = [(i, report[i]) for i in ranked[:k]]
        kept = [tid] if greedy else [i for i in order if i in keep]
        kept_lps = [0.0] if greedy else [processed[i] for i in kept]
        own = 0.0 if greedy else processed[tid]
        return Step(
            tid, report[tid], rank, top, kept=kept, kept_logprobs=kept_lps, sampling_logprob=own
        )

    def generate(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        logit_bias: dict | None = None,
        ignore_eos: bool = False,
        k: int = 0,
        version: Callable[[int], str] = lambda i: "default",
    ) -> Generation:
        """The whole generation at once (streaming fakes replay it step by step)."""
        rng = random.Random(seed) if seed is not None else random.Random()
        bias = {int(t): float(v) for t, v in (logit_bias or {}).items()}
        stops = set(stop_token_ids or ())
        if not ignore_eos:
            stops.add(EOS)
        ctx, text = list(prompt), ""
        steps: list[Step] = []
        for _ in range(max_tokens):
            s = self.step(ctx, temperature, top_p, bias, rng, k, top_k)
            s.version = version(len(steps))
            steps.append(s)
            ctx.append(s.token_id)
            if s.token_id in stops:
                return Generation(steps, "stop", stop_token=s.token_id)
            text += token_text(s.token_id)
            for st in stop or ():
                if st in text:
                    return Generation(steps, "stop", stop_string=st)
        return Generation(steps, "length")
