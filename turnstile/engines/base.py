"""The one contract every engine adapter meets: token IDs in, token IDs and logprobs out.

The rest of Turnstile never knows which engine it talks to. An adapter turns
``(prompt_ids, SamplingParams)`` into a stream of :class:`TokenEvent` followed by one
:class:`Finish`, and maps its engine's failures onto :class:`EngineError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """JSON-ready, for the call record."""
        out = {k: v for k, v in self.__dict__.items() if v not in (None, [], {})}
        if self.logit_bias:
            out["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return out


@dataclass
class TokenEvent:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] | None = None


@dataclass
class Finish:
    """How a generation ended. ``stop_token_id`` is set when the model sampled an
    end-of-generation token (which may or may not appear among the events)."""

    reason: str  # "stop" | "length"
    stop_token_id: int | None = None
    stop_string: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    engine_request_id: str | None = None
    weight_version: str | None = None
    logprob_kind: str = ""
    timings: dict = field(default_factory=dict)


class EngineError(Exception):
    """The engine could not serve the call. ``status`` is the HTTP status to give the harness."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


class Engine(Protocol):
    name: str
    context_length: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def refresh(self) -> None: ...

    def generate(self, prompt_ids: list[int], params: SamplingParams, stream: bool = True
                 ) -> AsyncIterator[TokenEvent | Finish]:
        """``stream`` is a hint: an adapter whose engine cannot stream exact token IDs
        returns them all at once."""
        ...

    async def health(self) -> bool: ...
