"""Who may call a route, and which session a harness request acts on.

The trainer's token opens every route; a session's capability (the key in its base URL, or
sent as the API key) opens only chat completions and the model list of that session.
Credentials are minted in turnstile/auth.py.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import Request
from starlette.responses import Response

from ..dialects.base import Credential
from ..errors import APIError
from .context import context
from .error_log import note_session

DEFAULT_SESSION = "default"

Handler = Callable[[Request], Awaitable[Response]]


def bearer(request: Request, places: Iterable[Credential] = ()) -> str | None:
    """The credential sent: ``Authorization: Bearer``, or ``x-api-key`` as the Anthropic SDK
    sends its API key, or where the route's dialect declares its SDKs put it (``places``:
    Google's ``x-goog-api-key`` header or ``?key=``), the first found in that order."""
    scheme, _, cred = request.headers.get("authorization", "").partition(" ")
    cred = cred.strip()
    if scheme.lower() == "bearer" and cred:
        return cred
    found = request.headers.get("x-api-key", "").strip()
    for where, name in places:
        if found:
            break
        source = request.headers if where == "header" else request.query_params
        found = (source.get(name) or "").strip()
    return found or None


def is_trainer(request: Request, places: Iterable[Credential] = ()) -> bool:
    token = context(request).token
    if token is None:
        return True
    cred = bearer(request, places)
    return cred is not None and hmac.compare_digest(cred.encode(), token.encode())


def require_trainer(request: Request) -> None:
    if is_trainer(request):
        return
    if bearer(request) is None:
        raise APIError(
            401,
            "This route needs the trainer's token: Authorization: Bearer "
            "<token> (turnstile serve writes it to turnstile.token under "
            "--data).",
            code="missing_token",
            type_="authentication_error",
        )
    raise APIError(
        403,
        "This credential does not allow this route: a session's "
        "capability allows only chat completions and the model list on "
        "its own base URL.",
        code="forbidden",
        type_="permission_error",
    )


def require_json(request: Request) -> None:
    """POSTs carry JSON and say so: a browser page can send a form or text/plain cross-site
    without asking, but not application/json."""
    if request.method != "POST":
        return
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise APIError(
            415,
            f"Content-Type must be application/json (got {media or 'none'!r}).",
            "Content-Type",
            code="unsupported_media_type",
            type_="invalid_request_error",
        )


def trainer(handler: Handler) -> Handler:
    """``handler`` for the trainer only (its token; a JSON body on POST)."""

    async def guarded(request: Request) -> Response:
        require_trainer(request)
        require_json(request)
        return await handler(request)

    return guarded


async def harness_session(request: Request, places: Iterable[Credential] = ()) -> str | None:
    """The session a harness-facing request acts on (None: a model list as the trainer).
    The key in ``/s/<key>/...`` is a capability (the trainer may also use a session id);
    on a bare route the session is the credential's capability (read from ``places`` too: the
    route's dialect's), or, for the trainer, the one ``X-Session-Id`` names (created on first
    use). Noted for the request's log line."""
    sid = await _harness_session(request, tuple(places))
    if sid is not None:
        note_session(sid)
    return sid


async def _harness_session(request: Request, places: tuple[Credential, ...]) -> str | None:
    sessions = context(request).sessions
    key = request.path_params.get("sid")
    if key is not None:
        sid = sessions.session_for(key)
        if sid is not None:
            return sessions.require(sid)
        if is_trainer(request, places):
            return sessions.require(key)
        # Same answer for a wrong key as for a deleted session: nothing to probe.
        raise APIError(
            404,
            "No session at this base URL (ask the trainer for the session's base_url).",
            code="session_not_found",
        )
    if is_trainer(request, places):
        if request.scope["path"].endswith("/models"):  # (request.url builds a URL: ~40 us)
            return None
        named = request.headers.get("x-session-id") or DEFAULT_SESSION
        if "/" in named or named in (".", ".."):  # ids must be addressable
            raise APIError(
                400,
                "Invalid 'X-Session-Id': a session id has no '/' and is not '.' or '..'.",
                "X-Session-Id",
            )
        return await sessions.ensure(named)
    cred = bearer(request, places)
    sid = sessions.session_for(cred) if cred else None
    if sid is None:
        raise APIError(
            401,
            "Use the session's base URL (/s/<capability>/v1) or send its "
            "capability as the API key (Authorization: Bearer "
            "<capability>).",
            code="invalid_api_key",
            type_="authentication_error",
        )
    claimed = request.headers.get("x-session-id")
    if claimed is not None and claimed != sid:
        raise APIError(
            403,
            "X-Session-Id names another session than this capability's.",
            "X-Session-Id",
            code="forbidden",
            type_="permission_error",
        )
    return sessions.require(sid)
