"""The harness-facing routes: chat completions and the model list, on a session's base URL.

They check the session's capability themselves (``access.harness_session``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .access import harness_session, require_json
from .context import context, json_response, read_json
from .errors import APIError
from .gateway import ClientGone
from .limits import check as check_limits
from .streaming import EventStream, disconnect_watch


async def chat(request: Request) -> Response:
    require_json(request)
    ctx = context(request)
    gateway = ctx.gateway
    sid = harness_session(request)
    assert sid is not None
    ctx.sessions.require_open(sid)
    body = await read_json(request, ctx.max_body)
    check_limits(body, ctx.limits)  # before anything is built from it
    req = gateway.parse_request(body)  # each mode validates as strictly as it needs
    try:
        if not req.stream:
            try:
                return json_response(await gateway.complete(sid, req,
                                                            disconnect_watch(request)))
            except ClientGone:  # nobody to answer; the call is recorded as aborted
                return Response(status_code=499)
        chunks = await gateway.stream(sid, req)
    except APIError as exc:
        if exc.code == "session_not_found":  # deleted meanwhile (by another process too)
            ctx.sessions.uncache(sid)
        raise
    return EventStream(sse(chunks), chunks)


async def models(request: Request) -> Response:
    harness_session(request)
    gateway = context(request).gateway
    return json_response({"object": "list", "data": [{
        "id": gateway.model_name, "object": "model", "created": int(time.time()),
        "owned_by": "turnstile", "max_model_len": gateway.engine.context_length}]})


async def sse(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Server-sent events of ``chunks``, ending in ``[DONE]`` (an error is sent in-band)."""
    try:
        async for c in chunks:
            yield b"data: " + orjson.dumps(c) + b"\n\n"
    except APIError as exc:
        # Headers are gone already: report the failure in-band, as OpenAI's API does.
        yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
    yield b"data: [DONE]\n\n"
