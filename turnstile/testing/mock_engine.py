"""An in-process engine driven by a handler, as httpx's ``MockTransport`` is to its transports:
the handler sees each prompt's token IDs and sampling params and says what was sampled. The
engine keeps what it received, so a test checks what the gateway sent without HTTP.

    engine = MockEngine(lambda prompt, params: Reply([9707, 151645]))
    gateway.engine = engine
    ...
    assert engine.received[-1] == expected_prompt_ids

Use the HTTP fakes (``fake_vllm``, ``fake_sglang``) where the wire matters; this one is for
what happens above the adapter (rendering, parsing, recording, streaming).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from ..engines.base import PROCESSED_LOGPROBS, EngineBase, Finish, SamplingParams, TokenBatch


@dataclass
class Reply:
    """What the engine samples for one call: ``ids`` in ``batches`` reads (a count of equal
    parts, or the sizes of each), each with ``logprobs`` (-1.0 each when left out), then a
    ``Finish`` of ``finish`` and the rest of its fields (``finish_fields``)."""

    ids: Sequence[int]
    finish: str = "stop"
    logprobs: Sequence[float] | None = None
    batches: int | Sequence[int] = 1
    logprob_kind: str = PROCESSED_LOGPROBS
    finish_fields: dict = field(default_factory=dict)

    def sizes(self) -> list[int]:
        if not isinstance(self.batches, int):
            assert sum(self.batches) == len(self.ids), "batch sizes must add up to the ids"
            return list(self.batches)
        n, parts = len(self.ids), max(1, self.batches)
        return [n // parts + (i < n % parts) for i in range(parts)]


Handler = Callable[[list[int], SamplingParams], Reply | Awaitable[Reply]]


class MockEngine(EngineBase):
    """A token-in engine without HTTP (meets ``engines.base.EngineAdapter``): each ``generate``
    asks ``handler`` what to sample; ``received`` and ``params`` keep what each call sent."""

    def __init__(self, handler: Handler, name: str = "mock", context_length: int = 1 << 20):
        self.handler = handler
        self.name, self.context_length = name, context_length
        self.received: list[list[int]] = []
        self.params: list[SamplingParams] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def refresh(self) -> None: ...

    async def health(self) -> bool:
        return True

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        return None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = False
    ) -> AsyncIterator[TokenBatch | Finish]:
        prompt = list(prompt_ids)
        self.received.append(prompt)
        self.params.append(params)
        reply = self.handler(prompt, params)
        if inspect.isawaitable(reply):
            reply = await reply
        ids = list(reply.ids)
        lps = list(reply.logprobs) if reply.logprobs is not None else [-1.0] * len(ids)
        at = 0
        for size in reply.sizes():
            if size:
                yield TokenBatch(ids[at : at + size], lps[at : at + size])
            at += size
        yield Finish(
            reply.finish,
            prompt_tokens=len(prompt),
            logprob_kind=reply.logprob_kind,
            **reply.finish_fields,
        )
