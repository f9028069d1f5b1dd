"""The one door of both recording modes (``gateway.admission``): a call is in flight from
admission until it ends, exactly once, however it ends; ``pause(abort)`` reaches a running
stream as the retryable policy-update error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from turnstile.errors import APIError
from turnstile.gateway.admission import POLICY_ABORT, admitted, open_stream, policy_abort
from turnstile.gateway.control import PolicyControl

pytestmark = pytest.mark.unit


def run(coro):  # noqa: ANN001, ANN201 - a test helper
    return asyncio.run(coro)


async def _chunks(
    n: int, step: asyncio.Event | None = None, control: PolicyControl | None = None
) -> AsyncIterator[dict]:
    """A gateway's chunks: an abort cancels the task they run in, and they answer with the
    policy-update error (as both gateways do)."""
    try:
        for i in range(n):
            if step is not None:
                await step.wait()
            yield {"i": i}
    except asyncio.CancelledError:
        if control is not None and control.aborted():
            raise policy_abort() from None
        raise


def test_a_stream_never_iterated_still_ends_once():
    async def go() -> tuple[int, int]:
        control, ended = PolicyControl(), []

        async def prepare() -> AsyncIterator[dict]:
            return _chunks(3)

        chunks = await open_stream(control, prepare, lambda: ended.append(1))
        during = control.in_flight
        await chunks.aclose()  # the response went away before iterating
        await chunks.aclose()
        return during, len(ended) + 10 * control.in_flight

    assert run(go()) == (1, 1)


def test_a_failed_preparation_is_out_of_flight():
    async def go() -> tuple[int, int]:
        control, ended = PolicyControl(), []

        async def prepare() -> AsyncIterator[dict]:
            raise APIError(400, "bad", "messages")

        with pytest.raises(APIError):
            await open_stream(control, prepare, lambda: ended.append(1))
        return len(ended), control.in_flight

    assert run(go()) == (1, 0)


def test_pause_abort_reaches_a_running_stream():
    async def go() -> tuple[list[dict], str, int]:
        control, step = PolicyControl(), asyncio.Event()

        async def prepare() -> AsyncIterator[dict]:
            return _chunks(5, step, control)

        chunks = await open_stream(control, prepare)
        got: list[dict] = []

        async def consume() -> str:
            try:
                async for c in chunks:
                    got.append(c)
                    step.clear()
            except APIError as exc:
                return str(exc.code)
            return "finished"

        task = asyncio.get_running_loop().create_task(consume())
        step.set()
        while not got:  # the first chunk is out; the stream waits for the next step
            await asyncio.sleep(0)
        left = await control.pause("abort", timeout=5)
        return got, await task, left

    got, outcome, left = run(go())
    assert got == [{"i": 0}] and outcome == "policy_update" and left == 0


def test_admission_waits_while_paused():
    async def go() -> tuple[bool, bool, int]:
        control = PolicyControl()
        control.close_door("drain")
        entered = asyncio.Event()

        async def call() -> None:
            async with admitted(control):
                entered.set()

        task = asyncio.get_running_loop().create_task(call())
        for _ in range(20):
            await asyncio.sleep(0)
        waited = not entered.is_set() and control.in_flight == 0
        control.resume("7")
        await asyncio.wait_for(task, 5)
        return waited, entered.is_set(), control.in_flight

    assert run(go()) == (True, True, 0)
    assert "retry" in POLICY_ABORT


def test_an_abort_counts_each_call_once():
    """``close_door("abort")`` says how many calls it aborted: a running one (cancelled) and a
    stream admitted but not started (marked); closing again aborts nothing more."""

    async def go() -> tuple[int, int, str | None, int]:
        control, step = PolicyControl(), asyncio.Event()
        seen: list[str | None] = []

        async def running() -> None:
            async with admitted(control, "s"):
                try:
                    await step.wait()
                except asyncio.CancelledError:
                    why = control.aborted()
                    seen.append(why.code if why else None)

        task = asyncio.get_running_loop().create_task(running())
        await asyncio.ensure_future(control.admit("s"))  # its task is over: a stream not started
        while control.in_flight < 2:
            await asyncio.sleep(0)
        first, again = control.close_door("abort"), control.close_door("abort")
        await task
        return first, again, seen[0], control.in_flight

    assert run(go()) == (2, 0, "policy_update", 1)  # the unstarted stream's ticket stays


def test_closing_a_session_aborts_its_calls_and_refuses_those_at_the_door():
    async def go() -> tuple[int, list[str | None], str | None, int]:
        control = PolicyControl()
        closed = control.closed_sessions  # what the app's session index adds to
        step = asyncio.Event()
        seen: list[str | None] = []

        async def call(sid: str) -> None:
            async with admitted(control, sid):
                try:
                    await step.wait()
                    seen.append("done")
                except asyncio.CancelledError:
                    why = control.aborted()
                    seen.append(why.code if why else None)

        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(call(sid)) for sid in ("a", "a", "b")]
        while control.in_flight < 3:
            await asyncio.sleep(0)
        control.close_door("drain")  # a weight update: the next call of "a" waits at the door
        waiting = loop.create_task(call("a"))
        await asyncio.sleep(0)
        closed.add("a")
        n = control.close_session("a")
        control.resume()
        step.set()
        await asyncio.gather(*tasks)
        try:
            await waiting
            refused = None
        except APIError as exc:
            refused = exc.code
        return n, sorted(seen, key=str), refused, control.in_flight

    assert run(go()) == (2, ["done", "session_closed", "session_closed"], "session_closed", 0)
