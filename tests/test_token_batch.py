"""TokenBatch, the columns an engine adapter hands the gateway: built token by token or batch by
batch, it reads back as the tokens that went in (a top-k list where one was given, [] where
none was, and no top column at all when no token had one)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnstile.engines.base import TokenBatch

pytestmark = pytest.mark.unit

top = st.none() | st.lists(st.tuples(st.integers(0, 1000), st.floats(-50, 0)), max_size=3)
token = st.tuples(st.integers(0, 1 << 20), st.floats(-50, 0) | st.just(math.nan), top)
batches = st.lists(st.lists(token, max_size=6), max_size=5)


def _read(b: TokenBatch) -> list[tuple]:
    return [
        (t, None if math.isnan(lp) else lp, tp)
        for t, lp, tp in zip(b.ids, b.logprobs, b.tops(), strict=True)
    ]


def _want(tokens: list[tuple]) -> list[tuple]:
    return [(t, None if math.isnan(lp) else lp, tp or []) for t, lp, tp in tokens]


@given(batches)
def test_added_or_extended_the_columns_read_back_as_the_tokens(parts: list[list[tuple]]):
    whole = TokenBatch()
    for part in parts:
        b = TokenBatch()
        for t, lp, tp in part:
            b.add(t, lp, tp)
        assert _read(b) == _want(part) and len(b) == len(part)
        assert (b.top is None) == all(tp is None for _, _, tp in part)
        whole.extend(b)
    tokens = [x for part in parts for x in part]
    assert _read(whole) == _want(tokens)
    assert (whole.top is None) == all(tp is None for _, _, tp in tokens)
    assert whole.top is None or len(whole.top) == len(whole.ids)
