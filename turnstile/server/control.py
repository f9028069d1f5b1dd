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


class Ticket:
    """One admitted call, counted in flight from admission until :meth:`PolicyControl.release`
    (whichever task ends it: a stream is admitted in the request's task, runs in the
    response's, and may be finalised by yet another when its client drops it)."""

    __slots__ = ("task", "abort", "released")

    def __init__(self, task: asyncio.Task | None):
        self.task = task
        self.abort = False  # pause(abort) came before the call had a task to cancel
        self.released = False


class PolicyControl:
    def __init__(self, version: str | None = None):
        self.version = version
        self._running = asyncio.Event()
        self._running.set()
        self._tickets: set[Ticket] = set()
        self._aborting: set[asyncio.Task] = set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    async def admit(self) -> Ticket:
        """Wait while paused, then count the call as running."""
        if not self._running.is_set():
            await self._running.wait()
        return self.enter()

    def enter(self) -> Ticket:
        ticket = Ticket(asyncio.current_task())
        self._tickets.add(ticket)
        return ticket

    def bind(self, ticket: Ticket) -> None:
        """The call now runs in the current task (what ``pause(abort)`` cancels). A ticket
        marked ``abort`` (paused before it had a running task) is the caller's to refuse."""
        ticket.task = asyncio.current_task()

    def release(self, ticket: Ticket) -> None:
        if not ticket.released:
            ticket.released = True
            self._tickets.discard(ticket)
        if ticket.task is not None:
            self._aborting.discard(ticket.task)

    def leave(self) -> None:
        """Release the current task's calls (for callers that do not keep their ticket)."""
        task = asyncio.current_task()
        for t in [t for t in self._tickets if t.task is task]:
            self.release(t)
        self._aborting.discard(task)

    def aborted(self) -> bool:
        """True (once) if the current task's cancellation came from ``pause(abort)``; the
        cancellation is then taken back so the call can answer its harness."""
        task = asyncio.current_task()
        if task in self._aborting:
            self._aborting.discard(task)
            task.uncancel()
            return True
        return False

    def close_door(self, mode: str = "drain") -> None:
        """Stop admitting calls at once (before any engine is told to pause: a call admitted
        after that would wait on a paused engine); with ``abort``, cancel the running ones."""
        self._running.clear()
        if mode == "abort":
            for t in list(self._tickets):
                if t.task is None or t.task.done():
                    t.abort = True
                elif t.task not in self._aborting:
                    self._aborting.add(t.task)
                    t.task.cancel()

    async def pause(self, mode: str = "drain", timeout: float = 600.0) -> int:
        """Stop admitting calls; drain or abort the running ones. Returns how many are still
        running when it gives up waiting (0 once drained)."""
        self.close_door(mode)
        deadline = time.monotonic() + timeout
        while self._tickets and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return len(self._tickets)

    def resume(self, version: str | None = None) -> None:
        if version is not None:
            self.version = version
        self._running.set()
