"""How exceptions become responses: OpenAI-shaped errors, never a traceback to the client."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..engines.base import EngineError
from ..errors import APIError
from ..store import database
from ..store.store import UnstorableText
from ..store.writes import SessionGone
from .context import context
from .error_log import note_error


def respond(request: Request, exc: APIError) -> Response:
    """``exc`` in the shape of the dialect the request spoke (OpenAI's unless a harness route
    said otherwise); noted for the request's log line (``server.error_log``)."""
    note_error(exc)
    shape = getattr(request.state, "error_body", None)
    if shape is None:
        return exc.response()
    return Response(orjson.dumps(shape(exc)), exc.status, media_type="application/json")


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    resp = respond(request, exc)
    if exc.status == 401:
        resp.headers["www-authenticate"] = 'Bearer realm="turnstile"'
    return resp


async def on_engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    return respond(request, APIError(exc.status, str(exc)))


async def on_http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    return respond(request, APIError(status, str(getattr(exc, "detail", "")) or "Not found"))


async def on_store_error(request: Request, exc: Exception) -> Response:
    # a locked or full store file: retryable, and nothing was half-written
    return respond(
        request,
        APIError(
            503,
            f"The record store is unavailable: {exc}. Retry.",
            code="store_busy",
            type_="server_error",
        ),
    )


async def on_unstorable_text(request: Request, exc: Exception) -> Response:
    field = exc.field if isinstance(exc, UnstorableText) else None
    return respond(request, APIError(400, str(exc), field))


async def on_session_gone(request: Request, exc: Exception) -> Response:
    context(request).sessions.uncache(str(exc))
    return respond(
        request,
        APIError(
            404,
            f"Session {exc} was deleted while the call ran; nothing was recorded.",
            "session_id",
            code="session_not_found",
        ),
    )


async def on_unexpected(request: Request, exc: Exception) -> Response:
    # logged with the route's template, never the path (it may hold a capability)
    route = getattr(request.scope.get("route"), "path", "?")
    print(
        f"turnstile: internal error on {request.method} {route}:\n"
        + "".join(traceback.format_exception(exc)),
        file=sys.stderr,
    )
    return respond(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))


EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
    APIError: on_api_error,
    EngineError: on_engine_error,
    HTTPException: on_http_error,
    **dict.fromkeys(database.ERRORS, on_store_error),
    SessionGone: on_session_gone,
    UnstorableText: on_unstorable_text,
    Exception: on_unexpected,
}
