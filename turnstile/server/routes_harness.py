"""The harness-facing routes on a session's base URL: one handler per route kind (a call, a
token count, a stored response, the model list) serves every wire dialect's declared routes
(``dialects.base.Route``), mounted under the dialect's prefix, bare and under a session's
``/s/{sid}``. They check the session's capability themselves (``access.harness_session``,
reading the credential where the dialect's SDKs put it)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.websockets import WebSocket

from ..dialects.base import (
    CountsTokens,
    Dialect,
    Edge,
    ListsModels,
    RouteKind,
    StoresResponses,
)
from ..dialects.base import Route as DialectRoute
from ..dialects.images import fetch_images
from ..errors import APIError
from ..gateway.admission import ClientGone
from ..media_fetch import using
from .access import harness_session, require_json
from .context import context, json_response, read_body, read_json
from .limits import check as check_limits
from .streaming import EventStream, Noted, disconnect_watch

Handler = Callable[[Request, Dialect, DialectRoute], Awaitable[Response]]


def edge(request: Request, dialect: Dialect, route: DialectRoute) -> Edge:
    """What the route gives the dialect beside the body (the credential's query parameter
    left out: it is nobody's business past the access check)."""
    secret = {name for where, name in dialect.credentials if where == "query"}
    params = {k: v for k, v in request.path_params.items() if k != "sid"}
    query = {k: v for k, v in request.query_params.items() if k not in secret}
    return Edge(params, query, route.stream)


async def call(request: Request, dialect: Dialect, route: DialectRoute) -> Response:
    """One call of a harness, in ``dialect``: its errors leave in the dialect's shape too."""
    request.state.error_body = dialect.error
    require_json(request)
    ctx = context(request)
    gateway = ctx.gateway
    sid = await harness_session(request, dialect.credentials)
    assert sid is not None
    ctx.sessions.require_open(sid)
    body = ctx.resent.parse(sid, dialect.history_field, await read_body(request, ctx.max_body))
    ctx.checked.check(sid, body)  # before anything is built from it (only what is new)
    with using(await fetch_images(body)):  # allowed image URLs: fetched off the loop
        req = dialect.parse(body, sid, edge(request, dialect, route))
    try:
        if not req.stream:
            try:
                done = await gateway.complete(sid, req, disconnect_watch(request))
            except ClientGone:  # nobody to answer; the call is recorded as aborted
                return Response(status_code=499)
            return json_response(dialect.reply(req, done))
        chunks = Noted(await gateway.stream(sid, req))
    except APIError as exc:
        if exc.code == "session_not_found":  # deleted meanwhile (by another process too)
            ctx.sessions.uncache(sid)
        raise
    return EventStream(dialect.stream(req, chunks), chunks, dialect.keepalive, ctx.keepalive)


async def count_tokens(request: Request, dialect: Dialect, route: DialectRoute) -> Response:
    """``POST …/count_tokens``: the prompt tokens the request would send now."""
    assert isinstance(dialect, CountsTokens)
    ctx = context(request)
    request.state.error_body = dialect.error
    require_json(request)
    sid = await harness_session(request, dialect.credentials)
    assert sid is not None
    body = await read_json(request, ctx.max_body)
    check_limits(body, ctx.limits)
    with using(await fetch_images(body)):
        req = dialect.count_request(body, sid, edge(request, dialect, route))
    return json_response(dialect.counted(ctx.gateway.count_tokens(sid, req)))


async def stored(request: Request, dialect: Dialect, route: DialectRoute) -> Response:
    """``GET …/{rid}``: a stored response of this session, rebuilt from its record."""
    assert isinstance(dialect, StoresResponses)
    request.state.error_body = dialect.error
    sid = await harness_session(request, dialect.credentials)
    assert sid is not None
    return json_response(dialect.stored(sid, request.path_params["rid"]))


async def model_list(request: Request, dialect: Dialect, route: DialectRoute) -> Response:
    """The served model, as the dialect lists models."""
    assert isinstance(dialect, ListsModels)
    request.state.error_body = dialect.error
    await harness_session(request, dialect.credentials)
    gateway = context(request).gateway
    return json_response(dialect.model_list(gateway.model_name, gateway.engine.context_length))


async def model(request: Request, dialect: Dialect, route: DialectRoute) -> Response:
    """One model by name, as the dialect describes one (any name: it is the served one)."""
    assert isinstance(dialect, ListsModels)
    request.state.error_body = dialect.error
    await harness_session(request, dialect.credentials)
    gateway = context(request).gateway
    asked = request.path_params.get("model", "")
    return json_response(dialect.model(gateway.model_name, gateway.engine.context_length, asked))


KINDS: dict[RouteKind, Handler] = {
    "call": call,
    "count_tokens": count_tokens,
    "stored": stored,
    "models": model_list,
    "model": model,
}

SESSION = "/s/{sid}"  # a session's base URL, in front of every dialect's prefix


def dialect_routes(dialects: Iterable[type[Dialect]]) -> list[Route]:
    """Each dialect's declared routes, under its prefix, bare and under a session's base URL."""
    routes = []
    for dialect in dialects:
        for declared in dialect.routes:
            endpoint = _endpoint(KINDS[declared.kind], dialect.name, declared)
            for prefix in declared.prefixes or dialect.prefixes:
                for base in ("", SESSION):
                    path = base + prefix + declared.path
                    routes.append(Route(path, endpoint, methods=[declared.method]))
    return routes


def _endpoint(
    handler: Handler, name: str, declared: DialectRoute
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await handler(request, context(request).dialects[name], declared)

    return endpoint


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


async def hello(request: Request) -> Response:
    """``GET``/``HEAD`` ``{base}/api/hello``: the connectivity probe Claude Code sends to its
    API base before a run (it wants a 200, as Anthropic's API answers it without a key). It
    says nothing about the session, so it asks for no credential."""
    return json_response({"ok": True})


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
