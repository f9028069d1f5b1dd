"""``turnstile.testing.MockEngine``: the handler's reply arrives as the engine's reads, and what
the gateway sent is kept."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnstile.engines.base import EngineAdapter, Finish, SamplingParams, TokenBatch
from turnstile.testing.mock_engine import MockEngine, Reply

pytestmark = pytest.mark.unit


async def _events(engine: MockEngine, prompt: list[int]) -> list[TokenBatch | Finish]:
    return [e async for e in engine.generate(prompt, SamplingParams(max_tokens=8))]


@given(ids=st.lists(st.integers(0, 1000), max_size=30), parts=st.integers(1, 8))
def test_a_reply_arrives_in_its_batches_then_one_finish(ids: list[int], parts: int) -> None:
    async def handler(prompt: list[int], params: SamplingParams) -> Reply:
        return Reply(ids, "length", batches=parts)

    engine = MockEngine(handler)
    events = asyncio.run(_events(engine, [1, 2, 3]))
    batches, finish = events[:-1], events[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    assert finish.prompt_tokens == 3
    assert [t for b in batches for t in b.ids] == ids  # type: ignore[union-attr]
    assert len(batches) == min(parts, len(ids))
    assert engine.received == [[1, 2, 3]] and engine.params[0].max_tokens == 8


def test_batch_sizes_must_cover_the_reply() -> None:
    engine = MockEngine(lambda prompt, params: Reply([1, 2, 3], batches=[1, 1]))
    with pytest.raises(AssertionError, match="add up"):
        asyncio.run(_events(engine, [0]))


def test_it_meets_the_engine_contract() -> None:
    engine: EngineAdapter = MockEngine(lambda prompt, params: Reply([]))  # mypy checks this
    assert engine.pick("s") is engine
