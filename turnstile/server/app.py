"""HTTP routes. Harness-facing: ``/v1/chat/completions`` (also under a session's base URL
``/s/<id>/v1``) and ``/v1/models``. Trainer-facing: sessions, their calls and trajectories."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..engines.base import EngineError
from ..store.trajectories import trajectories
from .errors import APIError
from .gateway import Gateway
from .requests import parse_chat_request

DEFAULT_SESSION = "default"


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def _read_json(request: Request, limit: int, required: bool = True) -> object:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"The request body is {length} bytes; the limit is {limit} "
                            "(start turnstile with a larger --max-body-mb).",
                       code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(413, f"The request body exceeds the limit of {limit} bytes "
                                "(start turnstile with a larger --max-body-mb).",
                           code="request_too_large")
    if not body and not required:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}",
                       code="invalid_json") from exc


def create_app(gateway: Gateway, public_url: str, max_body: int = 32 << 20) -> Starlette:
    store = gateway.store
    known_sessions: set[str] = set()

    def require_session(sid: str) -> str:
        if sid not in known_sessions:
            if store.get_session(sid) is None:
                raise APIError(404, f"No session {sid!r}. Create one with POST /v1/sessions.",
                               "session_id", code="session_not_found")
            known_sessions.add(sid)
        return sid

    def ensure_session(sid: str) -> str:
        if sid not in known_sessions:
            store.create_session({"created_by": "x-session-id"}, sid)
            known_sessions.add(sid)
        return sid

    async def chat(request: Request) -> Response:
        sid = request.path_params.get("sid")
        if sid is not None:
            require_session(sid)
        else:
            sid = ensure_session(request.headers.get("x-session-id") or DEFAULT_SESSION)
        req = parse_chat_request(await _read_json(request, max_body))
        if not req.stream:
            return _json(await gateway.complete(sid, req))
        chunks = await gateway.stream(sid, req)
        return StreamingResponse(_sse(chunks), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    async def create_session(request: Request) -> Response:
        body = await _read_json(request, max_body, required=False) or {}
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object: {\"metadata\": {...}}.",
                           "metadata")
        meta = body.get("metadata", {k: v for k, v in body.items() if k != "id"})
        if not isinstance(meta, dict):
            raise APIError(400, "Invalid 'metadata': expected an object.", "metadata")
        sid = body.get("id")
        if sid is not None and (not isinstance(sid, str) or not sid or "/" in sid):
            raise APIError(400, "Invalid 'id': expected a non-empty string without '/'.", "id")
        sid = store.create_session(meta, sid)
        known_sessions.add(sid)
        return _json(session_json(sid), 201)

    def session_json(sid: str) -> dict:
        s = store.get_session(sid)
        assert s is not None
        return {**s, "object": "session", "base_url": f"{public_url}/s/{sid}/v1"}

    async def get_session(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        return _json(session_json(sid))

    async def calls(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        return _json({"object": "list", "data": [c.to_json() for c in store.calls(sid)]})

    async def trajs(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        return _json({"object": "list", "data": trajectories(store.calls(sid))})

    async def models(request: Request) -> Response:
        if "sid" in request.path_params:
            require_session(request.path_params["sid"])
        return _json({"object": "list", "data": [{
            "id": gateway.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "turnstile", "max_model_len": gateway.engine.context_length}]})

    async def health(request: Request) -> Response:
        ok = await gateway.engine.health()
        return _json({"status": "ok" if ok else "engine_unavailable", "engine": ok},
                     200 if ok else 503)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    async def on_engine_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        return APIError(exc.status, str(exc)).response()

    async def on_http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        return APIError(status, str(getattr(exc, "detail", "")) or "Not found").response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.engine.start()
        yield
        await gateway.engine.close()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/s/{sid}/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/s/{sid}/v1/models", models, methods=["GET"]),
        Route("/v1/sessions", create_session, methods=["POST"]),
        Route("/v1/sessions/{sid}", get_session, methods=["GET"]),
        Route("/v1/sessions/{sid}/calls", calls, methods=["GET"]),
        Route("/v1/sessions/{sid}/trajectories", trajs, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    from starlette.exceptions import HTTPException

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: on_api_error, EngineError: on_engine_error, HTTPException: on_http_error,
        Exception: on_unexpected})


async def _sse(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        async for c in chunks:
            yield b"data: " + orjson.dumps(c) + b"\n\n"
    except APIError as exc:
        # Headers are gone already: report the failure in-band, as OpenAI's API does.
        yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
    yield b"data: [DONE]\n\n"
