"""Several replicas of one engine behind the same contract.

Sessions stick to one replica, so its prefix cache stays warm for the whole rollout. A
background task health-checks every replica; a replica that fails a call or a check stops
getting new sessions, and the sessions that were on it move to a healthy one on their next
call (their recorded tokens do not depend on the replica). A call that was running on a
replica when it died fails with 502 like any engine failure and is recorded as an error;
the session's tree is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from .base import (
    EngineAdapter,
    EngineControl,
    EngineError,
    Finish,
    SamplingParams,
    Sent,
    TokenBatch,
)


class Replica(EngineControl, Protocol):
    """What a pool needs of each replica: an engine at a URL (token-in adapters and capture
    engines alike)."""

    @property
    def url(self) -> str | None: ...


R = TypeVar("R", bound=Replica)


class ReplicaPool(Generic[R]):
    """Replicas of one engine, as one engine (:class:`~.base.EngineControl`; over token-in
    adapters, a token-in :class:`~.base.Engine`)."""

    def __init__(self, replicas: Sequence[R], check_every: float = 2.0):
        if not replicas:
            raise ValueError("a replica pool needs at least one engine URL")
        self.replicas = list(replicas)
        self.name = replicas[0].name
        self.healthy = [True] * len(replicas)
        self._sticky: dict[str, int] = {}
        self._check_every = check_every
        self._checker: asyncio.Task | None = None

    @property
    def context_length(self) -> int:
        known = [r.context_length for r in self.replicas if r.context_length]
        return min(known) if known else 0

    async def start(self) -> None:
        await asyncio.gather(*(r.start() for r in self.replicas))
        await self.check()
        self._checker = asyncio.get_running_loop().create_task(self._check_forever())

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        await asyncio.gather(*(r.close() for r in self.replicas))

    async def refresh(self) -> None:
        errors = await asyncio.gather(*(r.refresh() for r in self.replicas), return_exceptions=True)
        if all(isinstance(e, Exception) for e in errors):
            raise EngineError(f"no replica is reachable: {errors[0]}", 503)

    async def check(self) -> None:
        self.healthy = list(await asyncio.gather(*(r.health() for r in self.replicas)))

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self._check_every)
            await self.check()

    async def health(self) -> bool:
        return any(self.healthy)

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        return self.replicas[0].logprob_warning(params)

    def sampling_notes(self, params: SamplingParams) -> list[str]:
        return self.replicas[0].sampling_notes(params)

    def sent_sampling(self, params: SamplingParams) -> dict[str, Sent]:
        return self.replicas[0].sent_sampling(params)

    def end_ids(self, vocab: Mapping[str, int]) -> frozenset[int]:
        return frozenset().union(*(r.end_ids(vocab) for r in self.replicas))

    def replica_health(self) -> list[tuple[str | None, bool]] | None:
        return [(r.url, ok) for r, ok in zip(self.replicas, self.healthy, strict=True)]

    def pick(self, session_id: str) -> Bound[R]:
        """The replica for this session: its sticky one while healthy, else the healthy
        replica that rendezvous hashing ranks first for it (stable as replicas come and go)."""
        i = self._sticky.get(session_id)
        if i is None or not self.healthy[i]:
            ranked = sorted(
                range(len(self.replicas)),
                key=lambda j: hashlib.blake2b(
                    f"{session_id}|{self.replicas[j].url}".encode(), digest_size=8
                ).digest(),
            )
            alive = [j for j in ranked if self.healthy[j]]
            if not alive:
                raise EngineError("no healthy engine replica; retry when one is back", 503)
            i = self._sticky[session_id] = alive[0]
        return Bound(self, i)

    def forget(self, session_id: str) -> None:
        self._sticky.pop(session_id, None)

    async def pause(self, mode: str) -> str:
        said = await asyncio.gather(*(r.pause(mode) for r in self.replicas), return_exceptions=True)
        return "; ".join(f"{r.url}: {s}" for r, s in zip(self.replicas, said, strict=True))

    async def resume(self) -> str:
        said = await asyncio.gather(*(r.resume() for r in self.replicas), return_exceptions=True)
        return "; ".join(f"{r.url}: {s}" for r, s in zip(self.replicas, said, strict=True))


class Bound(Generic[R]):
    """One replica chosen for one call; marks it unhealthy when the call cannot reach it. Over
    token-in adapters it is the :class:`~.base.Generator` that serves the call."""

    def __init__(self, pool: ReplicaPool[R], index: int):
        self.pool, self.index = pool, index
        self.engine: R = pool.replicas[index]
        self.url = self.engine.url

    async def generate(
        self: Bound[EngineAdapter],
        prompt_ids: Sequence[int],
        params: SamplingParams,
        stream: bool = True,
    ) -> AsyncIterator[TokenBatch | Finish]:
        try:
            async for batch in self.engine.generate(prompt_ids, params, stream=stream):
                yield batch
        except EngineError as exc:
            if exc.status in (502, 503):
                self.pool.healthy[self.index] = False  # until the next health check passes
            raise
