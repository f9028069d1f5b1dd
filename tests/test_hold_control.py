"""The door's side of a hold (``gateway.control``): a pause in hold mode preempts only calls
waiting on their engine, takes the cancellation back for them, counts them held (the pause's
wait does not wait for them) until the resume or the hold limit; capture mode refuses it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from turnstile.errors import APIError
from turnstile.gateway.control import HoldLimits, PolicyControl
from turnstile.server.routes_admin import pause_mode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]


async def _call(
    control: PolicyControl, engine: asyncio.Future, log: list, busy: asyncio.Event | None = None
) -> None:
    """A call as ``token_in.call`` runs one: admitted, waits on its engine, held when preempted
    (``busy``: first it does something else, as a stream sends a chunk)."""
    ticket = await control.admit()
    try:
        if busy is not None:
            await busy.wait()
        while True:
            if not control.engine_wait():
                log.append("stopped before the engine")
            else:
                try:
                    await asyncio.shield(engine)
                    log.append("done")
                    return
                except asyncio.CancelledError:
                    if not control.preempted():
                        raise
                    log.append("preempted")
                finally:
                    control.engine_done()
            held = await control.held()
            log.append(("resumed", control.version) if held is not None else "too long")
            if held is None:
                return
    finally:
        control.release(ticket)


def test_a_hold_preempts_a_call_on_its_engine_and_it_goes_on_after_the_resume():
    async def go() -> tuple[list, dict]:
        control, engine, log = PolicyControl(), asyncio.get_running_loop().create_future(), []
        control.can_hold = True
        task = asyncio.ensure_future(_call(control, engine, log))
        await asyncio.sleep(0.01)
        preempted = control.close_door("hold")
        left = await control.settled(1.0)  # the held call is not waited for
        seen = {"preempted": preempted, "left": left, "held": control.held_calls}
        seen["in_flight"] = control.in_flight
        control.resume("v2")
        engine.set_result(None)
        await task
        seen["after"] = control.in_flight
        return log, seen

    log, seen = asyncio.run(go())
    assert log == ["preempted", ("resumed", "v2"), "done"]
    assert seen == {"preempted": 1, "left": 0, "held": 1, "in_flight": 1, "after": 0}


def test_a_call_off_its_engine_when_the_hold_comes_stops_at_its_next_wait():
    async def go() -> list:
        control, log, busy = PolicyControl(), [], asyncio.Event()
        engine = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(_call(control, engine, log, busy))
        await asyncio.sleep(0.01)
        assert control.close_door("hold") == 0  # nothing on its engine to preempt
        busy.set()  # the call asks its engine now: it stops there instead
        await asyncio.sleep(0.01)
        control.resume("v4")
        engine.set_result(None)
        await task
        return log

    assert asyncio.run(go()) == ["stopped before the engine", ("resumed", "v4"), "done"]


def test_a_call_held_past_the_limit_is_told_so():
    async def go() -> list:
        control, engine, log = PolicyControl(), asyncio.get_running_loop().create_future(), []
        control.hold_limits = HoldLimits(max_held_s=0.05)
        task = asyncio.ensure_future(_call(control, engine, log))
        await asyncio.sleep(0.01)
        control.close_door("hold")
        await task
        return log

    assert asyncio.run(go()) == ["preempted", "too long"]


def test_an_abort_reaches_a_held_call():
    """A second pause, with abort, ends a call held by the first (no hold to take back)."""

    async def go() -> tuple[list, bool]:
        control, engine, log = PolicyControl(), asyncio.get_running_loop().create_future(), []
        task = asyncio.ensure_future(_call(control, engine, log))
        await asyncio.sleep(0.01)
        control.close_door("hold")
        await asyncio.sleep(0.01)
        control.close_door("abort")
        with pytest.raises(asyncio.CancelledError):
            await task
        return log, control.in_flight == 0

    assert asyncio.run(go()) == (["preempted"], True)


def test_hold_needs_token_in_mode():
    control = PolicyControl()  # capture mode's: it cannot resubmit a partial output
    with pytest.raises(APIError) as err:
        pause_mode("hold", control)
    assert err.value.status == 400 and "token-in" in str(err.value)
    control.can_hold = True
    assert pause_mode("hold", control) == "hold"
    with pytest.raises(APIError):
        pause_mode("later", control)


def test_an_abort_of_a_call_on_its_engine_is_not_taken_for_a_hold():
    async def go() -> tuple[list, int]:
        control, engine, log = PolicyControl(), asyncio.get_running_loop().create_future(), []
        control.hold_limits = HoldLimits(max_held_s=0.1)  # a call taken for held ends soon
        task = asyncio.ensure_future(_call(control, engine, log))
        await asyncio.sleep(0.01)
        control.close_door("abort")
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return log, control.in_flight

    assert asyncio.run(go()) == ([], 0)
