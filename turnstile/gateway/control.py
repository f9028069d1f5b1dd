"""Policy-version control for async RL: pause new generation, drain or abort what is running,
resume under a new weight version; and the end of a session's running calls when it closes.

A trainer calls ``POST /admin/pause`` before it updates the weights and ``POST /admin/resume``
after. While paused, new calls wait at the door (the harness sees a slow call, not an error);
``drain`` lets running calls finish, ``abort`` cancels them (their harness gets a 503 it can
retry, and the call is recorded as aborted), ``hold`` preempts them at a token boundary and
holds them until the resume, when each goes on from its prompt + the tokens sampled so far
(``token_in.call``; docs/weight_sync.md). Every call records the policy version it ran under.
``POST /v1/sessions/{id}/close`` cancels the session's running calls the same way, with its own
reason (a 409: the rollout has ended).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..errors import APIError


@dataclass(frozen=True)
class Abort:
    """Why a running call was cancelled: ``reason`` goes into its record, ``error()`` to its
    harness."""

    reason: str
    status: int
    code: str
    type: str

    def error(self) -> APIError:
        return APIError(self.status, self.reason, code=self.code, type_=self.type)


POLICY = Abort(
    "The call was aborted for a policy (weight) update; retry it.",
    503,
    "policy_update",
    "engine_unavailable",
)
# A hold preempts a call (its task is cancelled while it waits on the engine) without ending
# it: the call takes this back (:meth:`PolicyControl.preempted`) and resumes after the pause.
HOLD = Abort("The call was held for a policy (weight) update.", 503, "policy_update", "held")


@dataclass(frozen=True)
class HoldLimits:
    """How long a held call may wait and how often it may be preempted before it is aborted
    like ``abort`` does (serve --hold-preemptions, --hold-timeout); ``stream_whole``: whole
    calls read the engine as a stream, so a hold keeps what was sampled (an engine that
    answers whole, llama-server, re-samples the cut chunk)."""

    max_preemptions: int = 3
    max_held_s: float = 600.0
    stream_whole: bool = False


def hold_abort(why: str) -> Abort:
    """The abort a held call ends with when it cannot go on (a cap, a grammar): ``abort``'s
    503, with the reason named."""
    return Abort(
        f"The call was aborted for a policy (weight) update: {why}; retry it.",
        503,
        POLICY.code,
        POLICY.type,
    )


SESSION_CLOSED = Abort(
    "The session was closed while the call ran: its rollout has ended.",
    409,
    "session_closed",
    "invalid_request_error",
)


class Ticket:
    """One admitted call, counted in flight from admission until :meth:`PolicyControl.release`
    (whichever task ends it: a stream is admitted in the request's task, runs in the
    response's, and may be finalised by yet another when its client drops it)."""

    __slots__ = ("task", "session_id", "abort", "released")

    def __init__(self, task: asyncio.Task | None, session_id: str | None = None):
        self.task = task
        self.session_id = session_id
        # aborted before the call had a task to cancel (a pause, a close): the caller refuses it
        self.abort: Abort | None = None
        self.released = False


class PolicyControl:
    def __init__(self, version: str | None = None):
        self.version = version
        self._running = asyncio.Event()
        self._running.set()
        self._tickets: set[Ticket] = set()
        self._aborting: dict[asyncio.Task, Abort] = {}
        # Sessions closed (the app's session index adds to this set, the same object): a call
        # that waited at the door while its session was closed is refused when it is let in,
        # so no call of a closed session runs.
        self.closed_sessions: set[str] = set()
        # Hold mode: only a token-in gateway can resume a call (``can_hold``); the tasks now
        # waiting on their engine (what a hold preempts), the calls held until the resume.
        self.can_hold = False
        self.hold_limits = HoldLimits()
        self.holding = False
        self._in_engine: set[asyncio.Task] = set()
        self._held: set[asyncio.Task] = set()
        # the server is shutting down: a call cancelled from now on records that as its end
        self.stopping = False

    def stop(self) -> None:
        """The server's shutdown has begun (called by the ASGI server, before it waits)."""
        self.stopping = True

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    async def admit(self, session_id: str | None = None) -> Ticket:
        """Wait while paused, then count the call as running."""
        if not self._running.is_set():
            await self._running.wait()
        if session_id is not None and session_id in self.closed_sessions:
            raise SESSION_CLOSED.error()
        return self.enter(session_id)

    def enter(self, session_id: str | None = None) -> Ticket:
        ticket = Ticket(asyncio.current_task(), session_id)
        self._tickets.add(ticket)
        return ticket

    def bind(self, ticket: Ticket) -> None:
        """The call now runs in the current task (what an abort cancels). A ticket marked
        ``abort`` (aborted before it had a running task) is the caller's to refuse."""
        ticket.task = asyncio.current_task()

    def release(self, ticket: Ticket) -> None:
        if not ticket.released:
            ticket.released = True
            self._tickets.discard(ticket)
        if ticket.task is not None:
            self._aborting.pop(ticket.task, None)

    def leave(self) -> None:
        """Release the current task's calls (for callers that do not keep their ticket)."""
        task = asyncio.current_task()
        for t in [t for t in self._tickets if t.task is task]:
            self.release(t)
        if task is not None:
            self._aborting.pop(task, None)

    def aborted(self) -> Abort | None:
        """Why the current task was cancelled, if an abort (a pause, a session's close) did it:
        returned once, and the cancellation is then taken back so the call can answer its
        harness. None for any other cancellation."""
        task = asyncio.current_task()
        if task is None or task not in self._aborting:
            return None
        task.uncancel()
        return self._aborting.pop(task)

    def _abort(self, tickets: list[Ticket], why: Abort) -> int:
        """Cancel the calls of ``tickets`` (or mark those without a running task); returns how
        many this aborted (a call aborted already is not counted again)."""
        n = 0
        for t in tickets:
            if t.task is None or t.task.done():
                if t.abort is None:
                    t.abort = why
                    n += 1
            elif t.task not in self._aborting:
                self._aborting[t.task] = why
                t.task.cancel()
                n += 1
        return n

    def close_door(self, mode: str = "drain") -> int:
        """Stop admitting calls at once (before any engine is told to pause: a call admitted
        after that would wait on a paused engine); with ``abort``, cancel the running ones;
        with ``hold``, preempt those waiting on their engine (the others are preempted when
        they next wait on it: :meth:`engine_wait`). Returns how many calls this aborted or
        preempted."""
        self._running.clear()
        if mode == "abort":
            return self._abort(list(self._tickets), POLICY)
        if mode == "hold":
            self.holding = True
            n = 0
            for task in list(self._in_engine):
                if not task.done() and task not in self._aborting:
                    self._aborting[task] = HOLD
                    task.cancel()
                    n += 1
            return n
        return 0

    # hold mode: the call's side (``token_in.call``)

    def engine_wait(self) -> bool:
        """The current task now waits on its engine (a hold may preempt it there); False when
        a hold is on already: the call must stop here instead."""
        if self.holding:
            return False
        task = asyncio.current_task()
        if task is not None:
            self._in_engine.add(task)
        return True

    def engine_done(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._in_engine.discard(task)

    def preempted(self) -> bool:
        """Whether the current task's cancellation was a hold's: then it is taken back (the
        call goes on) and True returned; any other cancellation is left as it is."""
        task = asyncio.current_task()
        if task is None or self._aborting.get(task) is not HOLD:
            return False
        task.uncancel()
        del self._aborting[task]
        return True

    async def held(self) -> float | None:
        """Wait, counted as held (not running: the pause's wait does not wait for it), until the
        resume or ``hold_limits.max_held_s``; returns the seconds held, None past the limit."""
        task = asyncio.current_task()
        began = time.monotonic()
        if task is not None:
            self._held.add(task)
        try:
            async with asyncio.timeout(self.hold_limits.max_held_s):
                await self._running.wait()
        except TimeoutError:
            return None
        finally:
            self._held.discard(task)
        return time.monotonic() - began

    @property
    def held_calls(self) -> int:
        return len(self._held)

    def close_session(self, session_id: str) -> int:
        """Abort the running calls of a session that was just closed; returns how many."""
        return self._abort([t for t in self._tickets if t.session_id == session_id], SESSION_CLOSED)

    async def settled(self, timeout: float, session_id: str | None = None) -> int:
        """Wait until no call (of ``session_id``, else at all) is running, or ``timeout``
        seconds; returns how many still run."""
        deadline = time.monotonic() + timeout

        def running() -> int:
            return sum(
                (session_id is None or t.session_id == session_id) and t.task not in self._held
                for t in self._tickets
            )

        while running() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return running()

    async def pause(self, mode: str = "drain", timeout: float = 600.0) -> int:
        """Stop admitting calls; drain or abort the running ones. Returns how many are still
        running when it gives up waiting (0 once drained)."""
        self.close_door(mode)
        return await self.settled(timeout)

    def resume(self, version: str | None = None) -> None:
        if version is not None:
            self.version = version
        self.holding = False
        self._running.set()
