"""Trainer routes that act on the server itself: pause and resume for a weight update, status,
the OpenAPI document; the open health probe; and, with ``--workers``, the step of a
fleet-wide action one worker takes on its own gateway (``peer``, see ``peers``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..errors import APIError
from .context import AppContext, context, json_response, read_json
from .openapi import document as openapi_document
from .peers import total
from .routes_sessions import close_here, forget_here
from .validation import weight_version


async def admin_pause(request: Request) -> Response:
    ctx = context(request)
    gateway = ctx.gateway
    body = await read_json(request, ctx.max_body, required=False) or {}
    if not isinstance(body, dict):
        raise APIError(400, 'The body must be a JSON object: {"mode": "drain"}.', None)
    mode = pause_mode(body.get("mode", "drain"), gateway.control)
    timeout = body.get("timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise APIError(400, "Invalid 'timeout': expected seconds (a number >= 0).", "timeout")
    # Turnstile stops admitting (and, for abort, cancels its own calls) before any engine
    # is told: a call admitted after the engine paused would wait on it (drain) or fail
    # there as an engine error (abort)
    # (with --workers: every worker's door, then the engines once)
    aborted = gateway.control.close_door(mode)
    peers = ctx.peers
    doors = await peers.send({"op": "pause", "mode": mode}) if peers else []
    engines = await gateway.engine.pause(mode)
    if peers:  # every worker drains at once, within the one timeout
        left, settled = await asyncio.gather(
            gateway.control.settled(float(timeout)),
            peers.send({"op": "pause", "mode": mode, "timeout": timeout}, timeout),
        )
        aborted += total(doors, "aborted")
        left += total(settled, "in_flight")
    else:
        left = await gateway.control.settled(float(timeout))
    out: dict[str, Any] = {
        "paused": True,
        "mode": mode,
        "in_flight": left,  # still running when it stopped waiting (0: drained)
        "aborted": aborted if mode != "hold" else 0,  # their harnesses got a 503
        "engines": engines,
    }
    if mode == "hold":  # preempted calls wait for the resume (their harnesses wait too)
        out["preempted"], out["held"] = aborted, gateway.control.held_calls
    if peers:
        out["workers"] = _workers(settled)
    return json_response(out)


async def admin_resume(request: Request) -> Response:
    ctx = context(request)
    gateway = ctx.gateway
    body = await read_json(request, ctx.max_body, required=False) or {}
    version = body.get("weight_version") if isinstance(body, dict) else None
    if version is not None:
        weight_version(version)
    engines = await gateway.engine.resume()
    gateway.control.resume(None if version is None else str(version))
    out: dict[str, Any] = {
        "paused": False,
        "weight_version": gateway.control.version,
        "engines": engines,
    }
    if ctx.peers:  # every worker's door opens under the same version
        op = {"op": "resume", "weight_version": gateway.control.version}
        out["workers"] = _workers(await ctx.peers.send(op))
    return json_response(out)


async def admin_status(request: Request) -> Response:
    ctx = context(request)
    gateway = ctx.gateway
    c = gateway.control
    replicas = gateway.engine.replica_health()
    out: dict[str, Any] = {
        "paused": c.paused,
        "in_flight": c.in_flight,
        "held": c.held_calls,  # of those in flight, held by a pause in hold mode
        "weight_version": c.version,
        "replicas": [{"url": url, "healthy": ok} for url, ok in replicas] if replicas else None,
    }
    if ctx.peers:
        states = await ctx.peers.send({"op": "status"})
        out["in_flight"] += total(states, "in_flight")
        out["workers"] = _workers(states)
    return json_response(out)


def pause_mode(mode: object, control: Any) -> str:
    """The pause's mode, checked: ``hold`` only where calls can go on from their partial
    output (token-in mode: capture mode's engine renders the prompt, Turnstile cannot resubmit
    what it sampled)."""
    if mode not in ("drain", "abort", "hold"):
        raise APIError(
            400, f"Invalid 'mode' {mode!r}: expected 'drain', 'abort' or 'hold'.", "mode"
        )
    if mode == "hold" and not control.can_hold:
        raise APIError(
            400,
            "'hold' needs token-in mode: in capture mode the engine renders the prompt and "
            "Turnstile cannot resubmit a call's partial output; pause with 'drain' or 'abort'.",
            "mode",
        )
    return str(mode)


def _workers(answers: list[dict]) -> list[dict]:
    """The other workers' answers as the trainer sees them (with --workers)."""
    return [{k: v for k, v in a.items() if k != "aborted"} for a in answers]


async def peer(request: Request) -> Response:
    """One step of a fleet-wide action, on this worker's gateway only (the front sends it)."""
    ctx = context(request)
    control = ctx.gateway.control
    op = await read_json(request, ctx.max_body)
    if not isinstance(op, dict) or not isinstance(op.get("op"), str):
        raise APIError(400, 'Expected {"op": ...}.', "op")
    kind = op["op"]
    if kind == "pause":
        mode, timeout = pause_mode(op.get("mode", "drain"), control), op.get("timeout", 0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise APIError(400, "Invalid 'timeout': expected seconds (a number >= 0).", "timeout")
        aborted = control.close_door(mode)
        left = await control.settled(float(timeout))
        if mode == "hold":
            return json_response({"aborted": 0, "preempted": aborted, "in_flight": left})
        return json_response({"aborted": aborted, "in_flight": left})
    if kind == "resume":
        version = op.get("weight_version")
        if version is not None:
            weight_version(version)
            version = str(version)
        control.resume(version)
        return json_response({"weight_version": control.version})
    if kind == "status":
        return json_response(local_state(ctx))
    sid = op.get("session")
    if not isinstance(sid, str):
        raise APIError(400, "Expected a 'session'.", "session")
    if kind == "close":
        return json_response({"aborted": await close_here(ctx, sid)})
    if kind == "forget":
        forget_here(ctx, sid)
        return json_response({})
    raise APIError(400, f"Unknown op {kind!r}.", "op")


def local_state(ctx: AppContext) -> dict:
    c = ctx.gateway.control
    return {
        "paused": c.paused,
        "in_flight": c.in_flight,
        "weight_version": c.version,
        "pid": os.getpid(),
    }


async def openapi(request: Request) -> Response:
    return json_response(openapi_document(__version__, context(request).public_url))


async def health(request: Request) -> Response:
    ok = await context(request).gateway.engine.health()
    return json_response(
        {"status": "ok" if ok else "engine_unavailable", "engine": ok}, 200 if ok else 503
    )
