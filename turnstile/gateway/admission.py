"""The one door every recorded call goes through, whichever mode records it (token-in or
engine-rendered capture).

A call is admitted (it waits while a weight update has generation paused) and counted in flight
until it ends; ``pause(abort)`` cancels it, and the call answers its harness with the one
retryable :data:`POLICY_ABORT` error (a session's close likewise, with its own: ``control``'s
:class:`~.control.Abort` reasons). A stream is admitted in the request's task but runs in
the response's, so its ticket is bound there, and released by whoever ends it first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ..answer import Event
from ..errors import APIError
from .control import POLICY, PolicyControl, Ticket

T = TypeVar("T")

POLICY_ABORT = POLICY.reason


def policy_abort() -> APIError:
    """What the harness gets for a call a weight update aborted: a 503 it can retry."""
    return POLICY.error()


class Chunks:
    """A stream's events (``turnstile.answer``), and what ends the call when the response is
    over: also when the response never iterated them (its client went away first), which a
    plain async generator cannot tell (it runs no ``finally`` when it never started)."""

    def __init__(self, gen: AsyncGenerator[Event, None], end: Callable[[], None]):
        self._gen, self._end = gen, end

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> Event:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        try:
            await self._gen.aclose()
        finally:
            self._end()


@contextlib.asynccontextmanager
async def admitted(control: PolicyControl, session_id: str | None = None) -> AsyncIterator[Ticket]:
    """A whole (non-streamed) call of ``session_id``: admitted on entry, out of flight on exit."""
    ticket = await control.admit(session_id)  # waits while a weight update has paused us
    try:
        yield ticket
    finally:
        control.release(ticket)


def _nothing() -> None:
    pass


async def open_stream(
    control: PolicyControl,
    prepare: Callable[[], Awaitable[AsyncGenerator[Event, None]]],
    release: Callable[[], None] = _nothing,
    session_id: str | None = None,
) -> Chunks:
    """Admit a streamed call of ``session_id`` and prepare it (errors raised here are the
    harness's HTTP status); its chunks then run bound to the ticket, and the call ends
    (``release``, then out of flight) once, when the stream is over or dropped."""
    ticket = await control.admit(session_id)  # in flight from here until the stream ends

    def end() -> None:
        if not ticket.released:
            release()
            control.release(ticket)

    try:
        chunks = await prepare()
    except asyncio.CancelledError:
        end()
        why = control.aborted()
        if why is not None:
            raise why.error() from None
        raise
    except BaseException:
        end()
        raise

    async def run() -> AsyncGenerator[Event, None]:
        control.bind(ticket)  # pause(abort) cancels the task the stream runs in
        try:
            if ticket.abort:  # aborted before the stream began: nothing ran
                raise ticket.abort.error()
            async with contextlib.aclosing(chunks) as it:
                async for c in it:
                    yield c
        finally:
            end()

    return Chunks(run(), end)


CLIENT_GONE = "the client disconnected"
SERVER_STOPPED = "the server shut down before the call ended (--shutdown-grace)"


def cancelled_why(control: PolicyControl, default: str) -> str:
    """What a call cancelled by no pause or close records as its end: the server's shutdown,
    or ``default`` (its harness gone)."""
    return SERVER_STOPPED if control.stopping else default


class ClientGone(Exception):
    """The harness went away before its (non-streamed) answer was ready."""


async def watched(
    control: PolicyControl,
    ticket: Ticket,
    run: Callable[[], Awaitable[T]],
    disconnected: Callable[[], Awaitable[object]],
    gone: set[asyncio.Task],
) -> T:
    """``run()`` in the current task, bound to ``ticket``, while ``disconnected`` watches the
    harness in a task of its own. If the harness goes first, the current task is cancelled
    (its engine call is dropped, and the engine stops on the dropped connection) with the task
    in ``gone`` while it unwinds, so it records itself as aborted (``CLIENT_GONE``); then
    :class:`ClientGone` is raised. (One task per call, not two: the call runs where it was.)"""
    task = asyncio.current_task()
    assert task is not None
    control.bind(ticket)  # an abort (a pause, the session's close) cancels this task
    if ticket.abort:
        raise ticket.abort.error()
    running = True

    def left(watch: asyncio.Future) -> None:
        if watch.cancelled():
            return
        watch.exception()  # a watch that failed counts as the harness gone, as asyncio.wait did
        if running:
            gone.add(task)
            task.cancel()

    watch = asyncio.ensure_future(disconnected())
    watch.add_done_callback(left)
    try:
        return await run()
    except (asyncio.CancelledError, ClientGone, APIError) as exc:
        if task in gone:  # the cancel was ours (the call may have turned it into ClientGone)
            task.uncancel()
            raise ClientGone(ticket.session_id) from None
        if isinstance(exc, asyncio.CancelledError):
            why = control.aborted()  # aborted (a pause, a close) before the call had begun
            if why is not None:
                raise why.error() from None
        raise
    finally:
        running = False  # a watch ending from now on changes nothing
        gone.discard(task)
        watch.cancel()
