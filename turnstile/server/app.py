"""HTTP routes. Harness-facing: ``/v1/chat/completions`` and ``/v1/models`` under a session's
base URL ``/s/<capability>/v1`` (or with the capability as the API key). Trainer-facing (the
trainer's token): sessions (open, list, reward, close, delete), their calls and trajectories
(merged or per call), admin, the OpenAPI document. Credentials: turnstile/auth.py."""

from __future__ import annotations

import contextlib
import hmac
import math
import re
import sqlite3
import sys
import time
import traceback
from collections.abc import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..auth import CAPABILITY_PREFIX
from ..engines.base import EngineError
from ..store.sqlite import INT32_MAX, SessionGone
from ..store.trajectories import MODES, stitch
from .errors import APIError
from .gateway import ClientGone, Gateway
from .limits import Limits
from .limits import check as check_limits
from .openapi import document as openapi_document
from .requests import parse_chat_request
from .streaming import EventStream, disconnect_watch

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


def create_app(gateway: Gateway, public_url: str, max_body: int = 32 << 20, *,
               token: str | None, limits: Limits | None = None) -> Starlette:
    """``token``: the trainer's token (None: every route open, ``--no-auth``)."""
    store = gateway.store
    limits = limits or Limits()
    # A gateway may validate requests its own way (passthrough leaves most to the engine).
    parse_request = getattr(gateway, "parse_request", parse_chat_request)
    known_sessions: set[str] = set()
    closed_sessions: set[str] = set()

    def require_session(sid: str) -> str:
        if sid not in known_sessions:
            s = store.get_session(sid)
            if s is None:
                raise APIError(404, f"No session {sid!r}. Create one with POST /v1/sessions.",
                               "session_id", code="session_not_found")
            known_sessions.add(sid)
            if s.get("status") == "closed":
                closed_sessions.add(sid)
        return sid

    def require_open(sid: str) -> None:
        if sid in closed_sessions:
            raise APIError(409, f"Session {sid!r} is closed: its rollout has ended. Open a new "
                                "session for new calls.", "session_id", code="session_closed",
                           type_="invalid_request_error")

    def ensure_session(sid: str) -> str:
        if sid not in known_sessions:
            store.create_session({"created_by": "x-session-id"}, sid)
            require_session(sid)  # an existing one may be closed (e.g. before a restart)
        return sid

    # credentials: the trainer's token, and each session's capability (cached both ways)
    session_of_cap: dict[str, str] = {}
    cap_of_session: dict[str, str] = {}

    def capabilities(sids: list[str]) -> dict[str, str]:
        missing = [s for s in sids if s not in cap_of_session]
        if missing:
            for sid, cap in store.capabilities(missing).items():
                cap_of_session[sid], session_of_cap[cap] = cap, sid
        return {s: cap_of_session[s] for s in sids if s in cap_of_session}

    def session_for(cap: str) -> str | None:
        sid = session_of_cap.get(cap)
        if sid is None and cap.startswith(CAPABILITY_PREFIX):
            sid = store.session_for_capability(cap)
            if sid is not None:
                session_of_cap[cap], cap_of_session[sid] = sid, cap
        return sid

    def forget_capability(sid: str) -> None:
        cap = cap_of_session.pop(sid, None)
        if cap is not None:
            session_of_cap.pop(cap, None)

    def is_trainer(request: Request) -> bool:
        if token is None:
            return True
        cred = _bearer(request)
        return cred is not None and hmac.compare_digest(cred.encode(), token.encode())

    def require_trainer(request: Request) -> None:
        if is_trainer(request):
            return
        if _bearer(request) is None:
            raise APIError(401, "This route needs the trainer's token: Authorization: Bearer "
                                "<token> (turnstile serve writes it to turnstile.token under "
                                "--data).", code="missing_token", type_="authentication_error")
        raise APIError(403, "This credential does not allow this route: a session's "
                            "capability allows only chat completions and the model list on "
                            "its own base URL.", code="forbidden", type_="permission_error")

    def trainer(handler):  # noqa: ANN001, ANN202
        async def guarded(request: Request) -> Response:
            require_trainer(request)
            _require_json(request)
            return await handler(request)
        return guarded

    def harness_session(request: Request) -> str | None:
        """The session a harness-facing request acts on (None: /v1/models as the trainer).
        The key in ``/s/<key>/v1`` is a capability (the trainer may also use a session id);
        on ``/v1/...`` the session is the bearer capability's, or, for the trainer, the one
        ``X-Session-Id`` names (created on first use)."""
        key = request.path_params.get("sid")
        if key is not None:
            sid = session_for(key)
            if sid is not None:
                return require_session(sid)
            if is_trainer(request):
                return require_session(key)
            # Same answer for a wrong key as for a deleted session: nothing to probe.
            raise APIError(404, "No session at this base URL (ask the trainer for the "
                                "session's base_url).", code="session_not_found")
        if is_trainer(request):
            if request.url.path.endswith("/models"):
                return None
            named = request.headers.get("x-session-id") or DEFAULT_SESSION
            if "/" in named or named in (".", ".."):  # ids must be addressable
                raise APIError(400, "Invalid 'X-Session-Id': a session id has no '/' and "
                                    "is not '.' or '..'.", "X-Session-Id")
            return ensure_session(named)
        cred = _bearer(request)
        sid = session_for(cred) if cred else None
        if sid is None:
            raise APIError(401, "Use the session's base URL (/s/<capability>/v1) or send its "
                                "capability as the API key (Authorization: Bearer "
                                "<capability>).", code="invalid_api_key",
                           type_="authentication_error")
        named = request.headers.get("x-session-id")
        if named is not None and named != sid:
            raise APIError(403, "X-Session-Id names another session than this capability's.",
                           "X-Session-Id", code="forbidden", type_="permission_error")
        return require_session(sid)

    async def chat(request: Request) -> Response:
        _require_json(request)
        sid = harness_session(request)
        assert sid is not None
        require_open(sid)
        body = await _read_json(request, max_body)
        check_limits(body, limits)  # before anything is built from it
        req = parse_request(body)
        try:
            if not req.stream:
                try:
                    if isinstance(gateway, Gateway):  # passthrough: no disconnect watch yet
                        return _json(await gateway.complete(sid, req,
                                                            disconnect_watch(request)))
                    return _json(await gateway.complete(sid, req))
                except ClientGone:  # nobody to answer; the call is recorded as aborted
                    return Response(status_code=499)
            chunks = await gateway.stream(sid, req)
        except APIError as exc:
            if exc.code == "session_not_found":  # deleted meanwhile (by another process too)
                known_sessions.discard(sid)
                closed_sessions.discard(sid)
            raise
        return EventStream(_sse(chunks), chunks)

    async def create_session(request: Request) -> Response:
        body = await _read_json(request, max_body, required=False) or {}
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object: {\"metadata\": {...}}.",
                           "metadata")
        fields = _session_fields(body)
        if "metadata" in body:
            meta = body["metadata"]
        else:
            meta = {k: v for k, v in body.items() if k != "id" and k not in fields}
        if not isinstance(meta, dict):
            raise APIError(400, "Invalid 'metadata': expected an object.", "metadata")
        try:  # stored and served as JSON (inside a list page): refused here if it cannot be
            orjson.dumps([[[[meta]]]])
        except orjson.JSONEncodeError as exc:
            raise APIError(400, f"Invalid 'metadata': {exc} (JSON nested at most 250 "
                                "levels deep, integers within 64 bits).", "metadata") from None
        sid = body.get("id")
        if sid is not None and (not isinstance(sid, str) or not sid or "/" in sid
                                or sid in (".", "..")):  # ids must be addressable in a path
            raise APIError(400, "Invalid 'id': expected a non-empty string without '/' (and "
                                "not '.' or '..').", "id")
        sid = store.create_session(meta, sid, **fields)
        # an id that exists already keeps its state: a closed rollout stays closed
        known_sessions.discard(sid)
        closed_sessions.discard(sid)
        require_session(sid)
        return _json(session_json(sid), 201)

    def session_json(sid: str, s: dict | None = None) -> dict:
        s = s or store.get_session(sid)
        if s is None:  # deleted meanwhile
            raise APIError(404, f"No session {sid!r}.", "session_id", code="session_not_found")
        cap = capabilities([sid]).get(sid, sid)
        return {**s, "object": "session", "base_url": f"{public_url}/s/{cap}/v1"}

    async def session(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        if request.method == "DELETE":
            known_sessions.discard(sid)
            closed_sessions.discard(sid)
            forget_capability(sid)
            gateway.forget(sid)
            if not store.delete_session(sid):
                raise APIError(404, f"No session {sid!r}.", "session_id",
                               code="session_not_found")
            return _json({"id": sid, "object": "session.deleted", "deleted": True})
        return _json(session_json(sid))

    async def list_sessions(request: Request) -> Response:
        q = request.query_params
        unknown = set(q) - {"group", "group_id", "status", "limit", "after", "exported"}
        if unknown:
            name = sorted(unknown)[0]
            raise APIError(400, f"Unknown query parameter {name!r}; use group, status, limit, "
                                "after or exported.", name)
        status = q.get("status")
        if status is not None and status not in ("open", "closed"):
            raise APIError(400, f"Invalid 'status' {status!r}: expected 'open' or 'closed'.",
                           "status")
        limit = _int_param(q.get("limit"), "limit", 100, 1, 1000)
        exported = q.get("exported")
        if exported is not None and exported not in ("true", "false"):
            raise APIError(400, "Invalid 'exported': expected true or false.", "exported")
        sessions, more = store.list_sessions(
            group_id=q.get("group", q.get("group_id")), status=status, limit=limit,
            after=q.get("after"), exported=None if exported is None else exported == "true")
        capabilities([s["id"] for s in sessions])
        data = [session_json(s["id"], s) for s in sessions]
        return _json({"object": "list", "data": data, "has_more": more,
                      "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None})

    async def rewards(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        body = await _read_json(request, max_body)
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object: {\"reward\": 1.0} or "
                                "{\"rewards\": {\"name\": 1.0}}, optionally with \"call_id\".",
                           "rewards")
        for key in body:
            if key not in ("reward", "rewards", "call_id"):
                raise APIError(400, f"Unknown field {key!r}; expected reward, rewards or "
                                    "call_id.", key)
        named: dict[str, float] = {}
        if "rewards" in body:
            rw = body["rewards"]
            if not isinstance(rw, dict) or not rw:
                raise APIError(400, "Invalid 'rewards': expected a non-empty object of named "
                                    "numbers, e.g. {\"correct\": 1.0}.", "rewards")
            for name, v in rw.items():
                if not name:
                    raise APIError(400, "Invalid 'rewards': names must be non-empty.",
                                   "rewards")
                named[name] = _number(v, f"rewards.{name}")
        if "reward" in body:
            named["reward"] = _number(body["reward"], "reward")
        if not named:
            raise APIError(400, "Give 'reward' (a number) or 'rewards' (an object of named "
                                "numbers).", "reward")
        call_id = body.get("call_id")
        if call_id is not None:
            if not isinstance(call_id, str) or not call_id:
                raise APIError(400, "Invalid 'call_id': expected a call id string.", "call_id")
            if not store.has_call(sid, call_id):
                raise APIError(404, f"Session {sid!r} has no call {call_id!r}.", "call_id",
                               code="call_not_found")
        store.set_rewards(sid, named, call_id)
        return _json(session_json(sid))

    async def close(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        body = await _read_json(request, max_body, required=False) or {}
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object (or empty).",
                           "termination_reason")
        for key in body:
            if key != "termination_reason":
                raise APIError(400, f"Unknown field {key!r}; expected termination_reason.", key)
        reason = body.get("termination_reason")
        if reason is not None and not isinstance(reason, str):
            raise APIError(400, "Invalid 'termination_reason': expected a string.",
                           "termination_reason")
        store.close_session(sid, reason)
        closed_sessions.add(sid)
        if isinstance(gateway, Gateway):
            gateway.closed(sid)  # its call tree is freed (rebuilt from the store if needed)
        return _json(session_json(sid))

    async def calls(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        return _json({"object": "list", "data": [c.to_json() for c in store.calls(sid)]})

    async def call_body(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        cid = request.path_params["cid"]
        if not store.has_call(sid, cid):
            raise APIError(404, f"Session {sid!r} has no call {cid!r}.", "call_id",
                           code="call_not_found")
        body = store.body(cid)
        if body is None:
            raise APIError(404, f"No body kept for call {cid!r} (the store keeps raw bodies "
                                "only when started with keep_bodies).", "call_id",
                           code="body_not_kept")
        return _json({"object": "call.body", "call_id": cid, **body})

    async def trajs(request: Request) -> Response:
        sid = require_session(request.path_params["sid"])
        mode = request.query_params.get("mode", "merged")
        if mode not in MODES:
            raise APIError(400, f"Invalid 'mode' {mode!r}: expected 'merged' (one sample per "
                                "root-to-leaf path) or 'per_call' (one sample per call).",
                           "mode")
        s = store.get_session(sid)
        return _json({"object": "list", "mode": mode, "data": [
            t.with_session(s).to_json() for t in stitch(store.calls(sid), mode)]})

    async def models(request: Request) -> Response:
        harness_session(request)
        return _json({"object": "list", "data": [{
            "id": gateway.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "turnstile", "max_model_len": gateway.engine.context_length}]})

    async def admin_pause(request: Request) -> Response:
        body = await _read_json(request, max_body, required=False) or {}
        if not isinstance(body, dict):
            raise APIError(400, "The body must be a JSON object: {\"mode\": \"drain\"}.", None)
        mode = body.get("mode", "drain")
        if mode not in ("drain", "abort"):
            raise APIError(400, f"Invalid 'mode' {mode!r}: expected 'drain' or 'abort'.", "mode")
        timeout = body.get("timeout", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise APIError(400, "Invalid 'timeout': expected seconds (a number >= 0).",
                           "timeout")
        # Turnstile stops admitting (and, for abort, cancels its own calls) before any engine
        # is told: a call admitted after the engine paused would wait on it (drain) or fail
        # there as an engine error (abort)
        gateway.control.close_door(mode)
        engines = await gateway.engine.pause(mode)
        left = await gateway.control.pause(mode, float(timeout))
        return _json({"paused": True, "mode": mode, "in_flight": left, "engines": engines})

    async def admin_resume(request: Request) -> Response:
        body = await _read_json(request, max_body, required=False) or {}
        version = body.get("weight_version") if isinstance(body, dict) else None
        if version is not None:
            _weight_version(version)
        engines = await gateway.engine.resume()
        gateway.control.resume(None if version is None else str(version))
        return _json({"paused": False, "weight_version": gateway.control.version,
                      "engines": engines})

    async def admin_status(request: Request) -> Response:
        c = gateway.control
        pool = getattr(gateway.engine, "replicas", None)
        return _json({"paused": c.paused, "in_flight": c.in_flight,
                      "weight_version": c.version,
                      "replicas": [{"url": r.url, "healthy": ok} for r, ok in
                                   zip(pool, gateway.engine.healthy, strict=True)]
                      if pool else None})

    async def openapi(request: Request) -> Response:
        return _json(openapi_document(__version__, public_url))

    async def health(request: Request) -> Response:
        ok = await gateway.engine.health()
        return _json({"status": "ok" if ok else "engine_unavailable", "engine": ok},
                     200 if ok else 503)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        resp = exc.response()
        if exc.status == 401:
            resp.headers["www-authenticate"] = 'Bearer realm="turnstile"'
        return resp

    async def on_engine_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        return APIError(exc.status, str(exc)).response()

    async def on_http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        return APIError(status, str(getattr(exc, "detail", "")) or "Not found").response()

    async def on_store_error(request: Request, exc: Exception) -> Response:
        # a locked or full store file: retryable, and nothing was half-written
        return APIError(503, f"The record store is unavailable: {exc}. Retry.",
                        code="store_busy", type_="server_error").response()

    async def on_session_gone(request: Request, exc: Exception) -> Response:
        known_sessions.discard(str(exc))
        closed_sessions.discard(str(exc))
        return APIError(404, f"Session {exc} was deleted while the call ran; nothing was "
                             "recorded.", "session_id", code="session_not_found").response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # logged with the route's template, never the path (it may hold a capability)
        route = getattr(request.scope.get("route"), "path", "?")
        print(f"turnstile: internal error on {request.method} {route}:\n"
              + "".join(traceback.format_exception(exc)), file=sys.stderr)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.engine.start()
        warning = gateway.engine.logprob_warning()
        if warning:
            print(f"turnstile: WARNING: {warning}", file=sys.stderr)
        if gateway.template_ignores_tools:
            print("turnstile: WARNING: the chat template does not render 'tools': a request's "
                  "tools never reach the model (each such call records it in info.warnings); "
                  "serve with --chat-template FILE for a template that renders them",
                  file=sys.stderr)
        yield
        await gateway.engine.close()

    # Harness routes check the capability themselves; trainer() guards the rest; /health is
    # open (engine up or not, for probes). Each route is described in openapi.py.
    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/s/{sid}/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/s/{sid}/v1/models", models, methods=["GET"]),
        Route("/v1/sessions", trainer(create_session), methods=["POST"]),
        Route("/v1/sessions", trainer(list_sessions), methods=["GET"]),
        Route("/v1/sessions/{sid}", trainer(session), methods=["GET", "DELETE"]),
        Route("/v1/sessions/{sid}/rewards", trainer(rewards), methods=["POST"]),
        Route("/v1/sessions/{sid}/close", trainer(close), methods=["POST"]),
        Route("/v1/sessions/{sid}/calls", trainer(calls), methods=["GET"]),
        Route("/v1/sessions/{sid}/calls/{cid}/body", trainer(call_body), methods=["GET"]),
        Route("/v1/sessions/{sid}/trajectories", trainer(trajs), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/admin/pause", trainer(admin_pause), methods=["POST"]),
        Route("/admin/resume", trainer(admin_resume), methods=["POST"]),
        Route("/admin/status", trainer(admin_status), methods=["GET"]),
        Route("/openapi.json", trainer(openapi), methods=["GET"]),
    ]
    from starlette.exceptions import HTTPException

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        APIError: on_api_error, EngineError: on_engine_error, HTTPException: on_http_error,
        sqlite3.Error: on_store_error, SessionGone: on_session_gone,
        Exception: on_unexpected})


def _bearer(request: Request) -> str | None:
    scheme, _, cred = request.headers.get("authorization", "").partition(" ")
    cred = cred.strip()
    return cred if scheme.lower() == "bearer" and cred else None


def _require_json(request: Request) -> None:
    """POSTs carry JSON and say so: a browser page can send a form or text/plain cross-site
    without asking, but not application/json."""
    if request.method != "POST":
        return
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise APIError(415, f"Content-Type must be application/json (got {media or 'none'!r}).",
                       "Content-Type", code="unsupported_media_type",
                       type_="invalid_request_error")


def _session_fields(body: dict) -> dict:
    """First-class session fields from a create body, validated (400 names the field)."""
    out: dict = {}
    for name in ("group_id", "task_id"):
        v = body.get(name)
        if v is not None and not (isinstance(v, str) and 0 < len(v) <= MAX_ID_LEN):
            raise APIError(400, f"Invalid {name!r}: expected a non-empty string of at most "
                                f"{MAX_ID_LEN} characters.", name)
        if name in body:
            out[name] = v
    if "sample_index" in body:
        v = body["sample_index"]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or
                              not 0 <= v <= INT32_MAX):
            raise APIError(400, f"Invalid 'sample_index': expected an integer in [0, "
                                f"{INT32_MAX}].", "sample_index")
        out["sample_index"] = v
    return out


MAX_ID_LEN = 256
WEIGHT_VERSION = re.compile(r"[A-Za-z0-9._:+/@-]{1,128}")


def _weight_version(v: object) -> None:
    """A weight version is a label (``step-12``, a hash) or an integer; an integer, or a
    string of digits and dashes, must be a plain int64 (it becomes the per-token
    ``versions`` value)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if -(2**63) <= v < 2**63:
            return
    elif isinstance(v, str) and WEIGHT_VERSION.fullmatch(v):
        if not set(v) <= set("0123456789-"):
            return
        if re.fullmatch(r"-?[0-9]+", v) and -(2**63) <= int(v) < 2**63:
            return
    raise APIError(400, "Invalid 'weight_version': expected an integer in int64 range or a "
                        "label of 1-128 letters, digits and ._:+/@- (not a malformed number).",
                   "weight_version")


def _number(v: object, param: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise APIError(400, f"Invalid {param!r}: expected a finite number, got {v!r}.", param)
    return float(v)


def _int_param(raw: str | None, name: str, default: int, lo: int, hi: int) -> int:
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = lo - 1
    if not lo <= v <= hi:
        raise APIError(400, f"Invalid {name!r} {raw!r}: expected an integer in [{lo}, {hi}].",
                       name)
    return v


async def _sse(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        async for c in chunks:
            yield b"data: " + orjson.dumps(c) + b"\n\n"
    except APIError as exc:
        # Headers are gone already: report the failure in-band, as OpenAI's API does.
        yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
    yield b"data: [DONE]\n\n"
