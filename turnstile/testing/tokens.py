"""An adapter's answer read back token by token, for tests that compare it with what a fake
engine sent: the batches' columns checked (never empty, of one length), then one row per
token."""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.base import Finish, TokenBatch


@dataclass(frozen=True)
class Token:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None  # None: the batch had no top-k column


def tokens(items: list[TokenBatch | Finish]) -> tuple[list[Token], Finish]:
    """``items`` as an adapter yielded them (batches, then one Finish) -> tokens and Finish."""
    *batches, finish = items
    assert isinstance(finish, Finish), finish
    out = []
    for b in batches:
        assert isinstance(b, TokenBatch) and b.ids and len(b.logprobs) == len(b.ids), b
        assert b.top is None or len(b.top) == len(b.ids), b
        out += [
            Token(t, b.logprobs[i], None if b.top is None else b.top[i])
            for i, t in enumerate(b.ids)
        ]
    return out, finish
