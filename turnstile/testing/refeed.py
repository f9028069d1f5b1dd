"""What a fake engine answers for a re-feed's prompt logprobs (``turnstile.verify``): the toy
model's raw distribution after each prefix, as both fakes report it. ``weights``: a nonzero
value scores with other pseudo-weights (a stale weight sync in verify's tests)."""

from __future__ import annotations

from .toy_model import VOCAB, _log_softmax, _logits

OUTSIDE = -100.0  # the logprob of an id outside the toy vocabulary (a real template token)


def distribution(prefix: list[int], weights: int = 0) -> list[float]:
    """Raw logprobs of the next token after ``prefix``."""
    return _log_softmax(_logits(prefix + ([VOCAB + weights] if weights else [])))


def logprob(lp: list[float], tid: int) -> float:
    return lp[tid] if 0 <= tid < VOCAB else OUTSIDE


def ranked(lp: list[float], k: int) -> list[int]:
    """The ``k`` best ids, best first."""
    return sorted(range(VOCAB), key=lambda i: -lp[i])[:k]
