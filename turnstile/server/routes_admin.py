"""Trainer routes that act on the server itself: pause and resume for a weight update, status,
the OpenAPI document; and the open health probe."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..errors import APIError
from .context import context, json_response, read_json
from .openapi import document as openapi_document
from .validation import weight_version


async def admin_pause(request: Request) -> Response:
    ctx = context(request)
    gateway = ctx.gateway
    body = await read_json(request, ctx.max_body, required=False) or {}
    if not isinstance(body, dict):
        raise APIError(400, 'The body must be a JSON object: {"mode": "drain"}.', None)
    mode = body.get("mode", "drain")
    if mode not in ("drain", "abort"):
        raise APIError(400, f"Invalid 'mode' {mode!r}: expected 'drain' or 'abort'.", "mode")
    timeout = body.get("timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise APIError(400, "Invalid 'timeout': expected seconds (a number >= 0).", "timeout")
    # Turnstile stops admitting (and, for abort, cancels its own calls) before any engine
    # is told: a call admitted after the engine paused would wait on it (drain) or fail
    # there as an engine error (abort)
    aborted = gateway.control.close_door(mode)
    engines = await gateway.engine.pause(mode)
    left = await gateway.control.settled(float(timeout))
    return json_response(
        {
            "paused": True,
            "mode": mode,
            "in_flight": left,  # still running when it stopped waiting (0: drained)
            "aborted": aborted,  # calls this pause aborted (their harnesses got a 503)
            "engines": engines,
        }
    )


async def admin_resume(request: Request) -> Response:
    ctx = context(request)
    gateway = ctx.gateway
    body = await read_json(request, ctx.max_body, required=False) or {}
    version = body.get("weight_version") if isinstance(body, dict) else None
    if version is not None:
        weight_version(version)
    engines = await gateway.engine.resume()
    gateway.control.resume(None if version is None else str(version))
    return json_response(
        {"paused": False, "weight_version": gateway.control.version, "engines": engines}
    )


async def admin_status(request: Request) -> Response:
    gateway = context(request).gateway
    c = gateway.control
    replicas = gateway.engine.replica_health()
    return json_response(
        {
            "paused": c.paused,
            "in_flight": c.in_flight,
            "weight_version": c.version,
            "replicas": [{"url": url, "healthy": ok} for url, ok in replicas] if replicas else None,
        }
    )


async def openapi(request: Request) -> Response:
    return json_response(openapi_document(__version__, context(request).public_url))


async def health(request: Request) -> Response:
    ok = await context(request).gateway.engine.health()
    return json_response(
        {"status": "ok" if ok else "engine_unavailable", "engine": ok}, 200 if ok else 503
    )
