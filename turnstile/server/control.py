"""Policy-version control for async RL: pause new generation, drain or abort what is running,
resume under a new weight version.

A trainer calls ``POST /admin/pause`` before it updates the weights and ``POST /admin/resume``
after. While paused, new calls wait at the door (the harness sees a slow call, not an error);
``drain`` lets running calls finish, ``abort`` cancels them (their harness gets a 503 it can
retry, and the call is recorded as aborted). Every call records the policy version it ran
under.
"""

from __future__ import annotations

import asyncio
import time


class PolicyControl:
    def __init__(self, version: str | None = None):
        self.version = version
        self._running = asyncio.Event()
        self._running.set()
        self._in_flight: set[asyncio.Task] = set()
        self._aborting: set[asyncio.Task] = set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def admit(self) -> None:
        """Wait while paused, then count the current task as running."""
        if not self._running.is_set():
            await self._running.wait()
        self.enter()

    def enter(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)

    def leave(self) -> None:
        task = asyncio.current_task()
        self._in_flight.discard(task)  # type: ignore[arg-type]
        self._aborting.discard(task)  # type: ignore[arg-type]

    def aborted(self) -> bool:
        """True (once) if the current task's cancellation came from ``pause(abort)``; the
        cancellation is then taken back so the call can answer its harness."""
        task = asyncio.current_task()
        if task in self._aborting:
            self._aborting.discard(task)
            task.uncancel()  # type: ignore[union-attr]
            return True
        return False

    async def pause(self, mode: str = "drain", timeout: float = 600.0) -> int:
        """Stop admitting calls; drain or abort the running ones. Returns how many are still
        running when it gives up waiting (0 once drained)."""
        self._running.clear()
        if mode == "abort":
            for task in list(self._in_flight):
                self._aborting.add(task)
                task.cancel()
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return len(self._in_flight)

    def resume(self, version: str | None = None) -> None:
        if version is not None:
            self.version = version
        self._running.set()
