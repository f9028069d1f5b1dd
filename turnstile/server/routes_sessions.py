"""Trainer routes on sessions: open, read, list, reward, close, delete; their calls, kept
bodies and trajectories."""

from __future__ import annotations

import asyncio

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..errors import APIError
from ..gateway import record
from ..store.trajectories import LINEAGES, MODES, stitch
from ..verify import NotSupported, summary, verify_sessions
from .canary import canary_of
from .context import AppContext, context, json_response, read_json
from .held_query import hold_options
from .validation import int_param, number, session_fields

CLOSE_WAIT_S = 30.0  # how long a close waits for the calls it aborted to be recorded


async def session_json(ctx: AppContext, sid: str, s: dict | None = None) -> dict:
    """A session as the API shows it, with the base URL to give its harness: on turnstile.app.ray
    with direct replicas, the owning replica's own address, and the public URL (Serve's proxy,
    any replica) as ``fallback_base_url`` for when that replica is gone."""
    s = s or ctx.store.get_session(sid)
    if s is None:  # deleted meanwhile
        raise APIError(404, f"No session {sid!r}.", "session_id", code="session_not_found")
    cap = ctx.sessions.capabilities([sid]).get(sid, sid)
    public = f"{ctx.public_url}/s/{cap}"
    # the Anthropic SDK adds /v1 itself: its base URL is the same without it
    out = {**s, "object": "session", "base_url": f"{public}/v1", "anthropic_base_url": public}
    canary = canary_of(ctx.store)
    if canary is not None:  # serve --canary-fraction: would a text pipeline's IDs differ?
        out["canary"] = canary.session(sid)
    origin = await ctx.session_origin(cap) if ctx.session_origin is not None else None
    if origin:
        out.update(
            base_url=f"{origin}/s/{cap}/v1",
            anthropic_base_url=f"{origin}/s/{cap}",
            fallback_base_url=f"{public}/v1",
            fallback_anthropic_base_url=public,
        )
    return out


async def create_session(request: Request) -> Response:
    ctx = context(request)
    body = await read_json(request, ctx.max_body, required=False) or {}
    if not isinstance(body, dict):
        raise APIError(400, 'The body must be a JSON object: {"metadata": {...}}.', "metadata")
    fields = session_fields(body)
    if "metadata" in body:
        meta = body["metadata"]
    else:
        meta = {k: v for k, v in body.items() if k != "id" and k not in fields}
    if not isinstance(meta, dict):
        raise APIError(400, "Invalid 'metadata': expected an object.", "metadata")
    try:  # stored and served as JSON (inside a list page): refused here if it cannot be
        orjson.dumps([[[[meta]]]])
    except orjson.JSONEncodeError as exc:
        raise APIError(
            400,
            f"Invalid 'metadata': {exc} (JSON nested at most 250 "
            "levels deep, integers within 64 bits).",
            "metadata",
        ) from None
    sid = body.get("id")
    if sid is not None and (
        not isinstance(sid, str) or not sid or "/" in sid or sid in (".", "..")
    ):  # ids must be addressable in a path
        raise APIError(
            400,
            "Invalid 'id': expected a non-empty string without '/' (and not '.' or '..').",
            "id",
        )
    sid = await record.create_session(ctx.store, meta, sid, **fields)
    # an id that exists already keeps its state: a closed rollout stays closed
    ctx.sessions.uncache(sid)
    ctx.sessions.require(sid)
    return json_response(await session_json(ctx, sid), 201)


async def session(request: Request) -> Response:
    """GET or DELETE one session."""
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    if request.method == "DELETE":
        forget_here(ctx, sid)
        if ctx.peers:  # the other workers (--workers) forget it too
            await ctx.peers.send({"op": "forget", "session": sid})
        if not ctx.store.delete_session(sid):
            raise APIError(404, f"No session {sid!r}.", "session_id", code="session_not_found")
        return json_response({"id": sid, "object": "session.deleted", "deleted": True})
    return json_response(await session_json(ctx, sid))


async def list_sessions(request: Request) -> Response:
    ctx = context(request)
    q = request.query_params
    unknown = set(q) - {"group", "group_id", "status", "limit", "after", "exported"}
    if unknown:
        name = sorted(unknown)[0]
        raise APIError(
            400,
            f"Unknown query parameter {name!r}; use group, status, limit, after or exported.",
            name,
        )
    status = q.get("status")
    if status is not None and status not in ("open", "closed"):
        raise APIError(400, f"Invalid 'status' {status!r}: expected 'open' or 'closed'.", "status")
    limit = int_param(q.get("limit"), "limit", 100, 1, 1000)
    exported = q.get("exported")
    if exported is not None and exported not in ("true", "false"):
        raise APIError(400, "Invalid 'exported': expected true or false.", "exported")
    sessions, more = ctx.store.list_sessions(
        group_id=q.get("group", q.get("group_id")),
        status=status,
        limit=limit,
        after=q.get("after"),
        exported=None if exported is None else exported == "true",
    )
    ctx.sessions.capabilities([s["id"] for s in sessions])
    if ctx.session_origin is None:
        data = [await session_json(ctx, s["id"], s) for s in sessions]
    else:  # a router lookup each (turnstile.app.ray): at once
        data = list(await asyncio.gather(*(session_json(ctx, s["id"], s) for s in sessions)))
    return json_response(
        {
            "object": "list",
            "data": data,
            "has_more": more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


async def rewards(request: Request) -> Response:
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    body = await read_json(request, ctx.max_body)
    if not isinstance(body, dict):
        raise APIError(
            400,
            'The body must be a JSON object: {"reward": 1.0} or '
            '{"rewards": {"name": 1.0}}, optionally with "call_id".',
            "rewards",
        )
    for key in body:
        if key not in ("reward", "rewards", "call_id"):
            raise APIError(400, f"Unknown field {key!r}; expected reward, rewards or call_id.", key)
    named: dict[str, float] = {}
    if "rewards" in body:
        rw = body["rewards"]
        if not isinstance(rw, dict) or not rw:
            raise APIError(
                400,
                "Invalid 'rewards': expected a non-empty object of named "
                'numbers, e.g. {"correct": 1.0}.',
                "rewards",
            )
        for name, v in rw.items():
            if not name:
                raise APIError(400, "Invalid 'rewards': names must be non-empty.", "rewards")
            named[name] = number(v, f"rewards.{name}")
    if "reward" in body:
        named["reward"] = number(body["reward"], "reward")
    if not named:
        raise APIError(
            400, "Give 'reward' (a number) or 'rewards' (an object of named numbers).", "reward"
        )
    call_id = body.get("call_id")
    if call_id is not None:
        if not isinstance(call_id, str) or not call_id:
            raise APIError(400, "Invalid 'call_id': expected a call id string.", "call_id")
        if not ctx.store.has_call(sid, call_id):
            raise APIError(
                404, f"Session {sid!r} has no call {call_id!r}.", "call_id", code="call_not_found"
            )
    ctx.store.set_rewards(sid, named, call_id)
    return json_response(await session_json(ctx, sid))


async def close(request: Request) -> Response:
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    body = await read_json(request, ctx.max_body, required=False) or {}
    if not isinstance(body, dict):
        raise APIError(400, "The body must be a JSON object (or empty).", "termination_reason")
    for key in body:
        if key != "termination_reason":
            raise APIError(400, f"Unknown field {key!r}; expected termination_reason.", key)
    reason = body.get("termination_reason")
    if reason is not None and not isinstance(reason, str):
        raise APIError(
            400, "Invalid 'termination_reason': expected a string.", "termination_reason"
        )
    ctx.store.close_session(sid, reason)
    if ctx.peers:  # and on the other workers (--workers), at once
        await asyncio.gather(
            close_here(ctx, sid), ctx.peers.send({"op": "close", "session": sid}, CLOSE_WAIT_S)
        )
    else:
        await close_here(ctx, sid)
    return json_response(await session_json(ctx, sid))


async def close_here(ctx: AppContext, sid: str) -> int:
    """A closed session on this gateway: no call of it is admitted from here on, its running
    calls are aborted (recorded so, their harness told it is closed) and waited for, so the
    session's calls read next include them; its call tree is freed (rebuilt from the store if
    read again). Returns how many calls it aborted."""
    ctx.sessions.mark_closed(sid)
    aborted = ctx.gateway.control.close_session(sid)
    if aborted:
        await ctx.gateway.control.settled(CLOSE_WAIT_S, sid)
    ctx.gateway.closed(sid)
    ctx.forget_bodies(sid)
    return aborted


def forget_here(ctx: AppContext, sid: str) -> None:
    """A deleted session, forgotten by this gateway (a reused id starts empty)."""
    ctx.sessions.uncache(sid)
    ctx.sessions.forget_capability(sid)
    ctx.gateway.forget(sid)
    ctx.forget_bodies(sid)


async def calls(request: Request) -> Response:
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    return json_response({"object": "list", "data": [c.to_json() for c in ctx.store.calls(sid)]})


async def call_body(request: Request) -> Response:
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    cid = request.path_params["cid"]
    if not ctx.store.has_call(sid, cid):
        raise APIError(
            404, f"Session {sid!r} has no call {cid!r}.", "call_id", code="call_not_found"
        )
    body = ctx.store.body(cid)
    if body is None:
        raise APIError(
            404,
            f"No body kept for call {cid!r} (the store keeps raw bodies "
            "only when started with keep_bodies).",
            "call_id",
            code="body_not_kept",
        )
    return json_response({"object": "call.body", "call_id": cid, **body})


async def image(request: Request) -> Response:
    """The bytes of an image a session's calls hold, by its sha256 (the trajectories'
    ``images``): only that session's images, as they were sent."""
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    digest = str(request.path_params["sha256"]).lower()
    got = ctx.store.image(sid, digest)
    if got is None:
        raise APIError(
            404, f"Session {sid!r} holds no image {digest!r}.", "sha256", code="image_not_found"
        )
    return Response(got.data, media_type=got.mime, headers={"cache-control": "immutable"})


async def trajectories(request: Request) -> Response:
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    mode = request.query_params.get("mode", "merged")
    if mode not in MODES:
        raise APIError(
            400,
            f"Invalid 'mode' {mode!r}: expected 'merged' (one sample per "
            "root-to-leaf path) or 'per_call' (one sample per call).",
            "mode",
        )
    which = request.query_params.get("lineages", "all")
    if which not in LINEAGES:
        raise APIError(
            400,
            f"Invalid 'lineages' {which!r}: expected 'all', 'main' (the session's lineage "
            "with the most calls: the agent's own) or 'side' (titles, summaries, sub-agents).",
            "lineages",
        )
    hold = hold_options(request.query_params)  # masks for held calls (docs/weight_sync.md)
    s = ctx.store.get_session(sid)
    samples = stitch(ctx.store.calls(sid), mode, which, hold)
    return json_response(
        {
            "object": "list",
            "mode": mode,
            "lineages": which,
            "data": [t.with_session(s).to_json() for t in samples],
        }
    )


async def verify_session(request: Request) -> Response:
    """``POST /v1/sessions/{sid}/verify``: the session's trajectories scored again by the
    engine that served them (``turnstile.verify``)."""
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    calls = ctx.store.calls(sid)
    served = [c.info["engine_url"] for c in calls if c.info.get("engine_url")]
    if not served:
        raise APIError(409, f"Session {sid!r} has no call an engine served.", code="no_calls")
    url = served[-1]  # the session's replica
    try:
        results = await verify_sessions(
            ctx.store, ctx.gateway.engine.name, url, [sid], ctx.tokenizer
        )
    except NotSupported as exc:
        raise APIError(400, str(exc), code="verify_not_supported") from exc
    except httpx.HTTPError as exc:
        raise APIError(502, f"the engine did not answer: {exc!r}", code="engine_error") from exc
    return json_response(
        {"object": "list", "data": [r.to_json() for r in results], "summary": summary(results)}
    )
