"""The harness-facing routes on a session's base URL: one handler runs a call in any wire
dialect (Chat Completions, Responses, Anthropic Messages); plus the model list and stored
responses. They check the session's capability themselves (``access.harness_session``)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from ..dialects.base import Dialect
from .access import harness_session, require_json
from .context import context, json_response, read_json
from .errors import APIError
from .gateway import ClientGone
from .limits import check as check_limits
from .streaming import EventStream, disconnect_watch


async def call(request: Request, dialect: Dialect) -> Response:
    """One call of a harness, in ``dialect``: its errors leave in the dialect's shape too."""
    request.state.error_body = dialect.error
    require_json(request)
    ctx = context(request)
    gateway = ctx.gateway
    sid = await harness_session(request)
    assert sid is not None
    ctx.sessions.require_open(sid)
    body = await read_json(request, ctx.max_body)
    check_limits(body, ctx.limits)  # before anything is built from it
    req = dialect.parse(body, sid)
    try:
        if not req.stream:
            try:
                done = await gateway.complete(sid, req, disconnect_watch(request))
            except ClientGone:  # nobody to answer; the call is recorded as aborted
                return Response(status_code=499)
            return json_response(dialect.reply(req, done))
        chunks = await gateway.stream(sid, req)
    except APIError as exc:
        if exc.code == "session_not_found":  # deleted meanwhile (by another process too)
            ctx.sessions.uncache(sid)
        raise
    return EventStream(dialect.stream(req, chunks), chunks, dialect.keepalive, ctx.keepalive)


async def chat(request: Request) -> Response:
    return await call(request, context(request).dialects["chat"])


async def responses(request: Request) -> Response:
    return await call(request, context(request).dialects["responses"])


async def messages(request: Request) -> Response:
    return await call(request, context(request).dialects["messages"])


async def count_tokens(request: Request) -> Response:
    """``POST …/v1/messages/count_tokens``: the prompt tokens the request would send now."""
    ctx = context(request)
    dialect = ctx.dialects["messages"]
    request.state.error_body = dialect.error
    require_json(request)
    sid = await harness_session(request)
    assert sid is not None
    body = await read_json(request, ctx.max_body)
    check_limits(body, ctx.limits)
    if isinstance(body, dict):
        body = {"max_tokens": 1, **body}  # not sampled: count_tokens takes none
    req = dialect.parse(body, sid)
    return json_response({"input_tokens": ctx.gateway.count_tokens(sid, req)})


async def models(request: Request) -> Response:
    await harness_session(request)
    gateway = context(request).gateway
    return json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": gateway.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "turnstile",
                    "max_model_len": gateway.engine.context_length,
                }
            ],
        }
    )


async def stored_response(request: Request) -> Response:
    """``GET …/v1/responses/{id}``: a response of this session, rebuilt from its record."""
    from ..dialects import responses as r

    ctx = context(request)
    sid = await harness_session(request)
    assert sid is not None
    rid = request.path_params["rid"]
    rec = next(
        (
            c
            for c in ctx.store.calls(sid)
            if c.id == r.call_id(rid) and c.info.get("dialect") == r.NAME
        ),
        None,
    )
    if rec is None:
        raise APIError(404, f"Response with id {rid!r} not found.", "response_id", code="not_found")
    return json_response(r.stored(rec, ctx.gateway.model_name))


async def no_websocket(websocket: WebSocket) -> None:
    """A WebSocket upgrade, on any path: refused with 426, which sends Codex (it tries the
    Responses API over a WebSocket first) to plain HTTP at once; a close, a 403 or a 404 cost
    it five retries with backoff on every run."""
    body = {
        "error": {
            "message": "WebSocket transport is not supported: send the request over HTTP.",
            "type": "invalid_request_error",
            "param": None,
            "code": "websocket_not_supported",
        }
    }
    await websocket.send_denial_response(JSONResponse(body, status_code=426))
