"""The viewer's routes: the page and its two static files (open: they hold no data; the script
asks for the trainer's token when a data route answers 401), and the trainer-only JSON the page
needs that no trainer route gives.

Whoever composes an app mounts them (:func:`viewer_routes`): ``wiring.py`` beside the gateway's
routes for ``turnstile serve``, :mod:`.app` for ``turnstile view``. The HTTP edge (``server/``)
never imports the viewer; the viewer uses the edge's context and checks below it."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import APIError
from ..server.access import trainer
from ..server.canary import canary_of
from ..server.context import AppContext, context, json_response
from ..server.validation import int_param
from ..store.records import CallRecord
from ..store.trajectories import MODES, Trajectory, stitch
from .summaries import SORTS, Query, select, summaries
from .tokens import divergence, parquet_bytes, pieces

# Nothing is loaded from anywhere but this server; the page cannot be framed.
_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src "
    "'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
_FILES = {
    "index.html": "text/html; charset=utf-8",
    "viewer.js": "text/javascript",
    "viewer.css": "text/css",
}
_LIST_PARAMS = (
    "group",
    "status",
    "model",
    "min_reward",
    "max_reward",
    "new_segments",
    "since",
    "until",
    "sort",
    "order",
    "limit",
    "offset",
)


@cache
def _static(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


def _file(name: str) -> Response:
    return Response(_static(name), media_type=_FILES[name], headers=_HEADERS)


async def ui_page(request: Request) -> Response:
    return _file("index.html")


async def ui_script(request: Request) -> Response:
    return _file("viewer.js")


async def ui_style(request: Request) -> Response:
    return _file("viewer.css")


def _float(raw: str | None, name: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise APIError(400, f"Invalid {name!r}: expected a finite number, got {raw!r}.", name)
    return v


def _choice(raw: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    if raw is None or raw == "":
        return None
    if raw not in allowed:
        raise APIError(
            400, f"Invalid {name!r} {raw!r}: expected one of {', '.join(allowed)}.", name
        )
    return raw


def list_query(params: dict[str, str]) -> Query:
    """The list's query string as a :class:`Query` (400 naming the parameter otherwise)."""
    unknown = sorted(set(params) - set(_LIST_PARAMS))
    if unknown:
        raise APIError(
            400,
            f"Unknown query parameter {unknown[0]!r}; use {', '.join(_LIST_PARAMS)}.",
            unknown[0],
        )
    segs = _choice(params.get("new_segments"), "new_segments", ("true", "false"))
    return Query(
        group=params.get("group") or None,
        status=_choice(params.get("status"), "status", ("open", "closed")),
        model=params.get("model") or None,
        min_reward=_float(params.get("min_reward"), "min_reward"),
        max_reward=_float(params.get("max_reward"), "max_reward"),
        new_segments=None if segs is None else segs == "true",
        since=_float(params.get("since"), "since"),
        until=_float(params.get("until"), "until"),
        sort=_choice(params.get("sort"), "sort", SORTS) or "created",
        descending=(_choice(params.get("order"), "order", ("asc", "desc")) or "desc") == "desc",
        limit=int_param(params.get("limit"), "limit", 200, 1, 5000),
        offset=int_param(params.get("offset"), "offset", 0, 0, 2**31 - 1),
    )


async def viewer_sessions(request: Request) -> Response:
    """Sessions with what their calls add up to, filtered, counted and sorted."""
    ctx = context(request)
    q = list_query(dict(request.query_params))
    rows = await run_in_threadpool(summaries, ctx.store)
    page = select(rows, q)
    canary = canary_of(ctx.store)
    if canary is not None:  # serve --canary-fraction: the drift column
        page["data"] = [{**row, "canary": canary.session(row["id"])} for row in page["data"]]
    return json_response(page)


def _mode(request: Request) -> str:
    mode = request.query_params.get("mode", "merged")
    if mode not in MODES:
        raise APIError(400, f"Invalid 'mode' {mode!r}: expected 'merged' or 'per_call'.", "mode")
    return mode


def _stitched(ctx: AppContext, sid: str, mode: str) -> tuple[list[Trajectory], list[CallRecord]]:
    calls = ctx.store.calls(sid)
    s = ctx.store.get_session(sid)
    return [t.with_session(s) for t in stitch(calls, mode)], calls


def _trajectories(model: str | None) -> Callable[[Request], Awaitable[Response]]:
    """The trajectories route, naming the tokenizer by ``model``."""

    async def viewer_trajectories(request: Request) -> Response:
        """The trajectories route's samples, each with the text piece of every token and, for
        a segment that left the recorded conversation, both sides of where it did."""
        ctx = context(request)
        sid = ctx.sessions.require(request.path_params["sid"])
        mode = _mode(request)
        tok = ctx.tokenizer

        def build() -> list[dict]:
            trajs, calls = _stitched(ctx, sid, mode)
            by_id = {c.id: c for c in calls}
            return [
                {
                    **t.to_json(),
                    "pieces": pieces(tok, t.token_ids),
                    "divergence": divergence(by_id[t.call_ids[0]], calls, tok),
                }
                for t in trajs
            ]

        data = await run_in_threadpool(build)
        # the model as its user named it, never the local path its tokenizer was loaded from
        named = (model or Path(tok.source).name) if tok else None
        return json_response({"object": "list", "mode": mode, "data": data, "tokenizer": named})

    return viewer_trajectories


async def viewer_parquet(request: Request) -> Response:
    """The session's trajectories as one Parquet file (the export's trajectories schema)."""
    ctx = context(request)
    sid = ctx.sessions.require(request.path_params["sid"])
    mode = _mode(request)

    def build() -> bytes:
        return parquet_bytes(_stitched(ctx, sid, mode)[0])

    blob = await run_in_threadpool(build)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in sid)
    return Response(
        blob,
        media_type="application/vnd.apache.parquet",
        headers={"content-disposition": f'attachment; filename="{safe}-{mode}.parquet"'},
    )


def viewer_routes(model: str | None) -> list[BaseRoute]:
    """The viewer's routes, to mount on an app: its page is open (no data in it), its data
    the trainer's. ``model``: the name the page gives the model whose tokenizer shows the
    tokens' text, as its user named it (``--served-model-name``, else the model file's or
    directory's name; None: that name)."""
    return [
        Route("/ui", ui_page, methods=["GET"]),
        Route("/ui/viewer.js", ui_script, methods=["GET"]),
        Route("/ui/viewer.css", ui_style, methods=["GET"]),
        Route("/v1/viewer/sessions", trainer(viewer_sessions), methods=["GET"]),
        Route(
            "/v1/viewer/sessions/{sid}/trajectories",
            trainer(_trajectories(model)),
            methods=["GET"],
        ),
        Route(
            "/v1/viewer/sessions/{sid}/trajectories.parquet",
            trainer(viewer_parquet),
            methods=["GET"],
        ),
    ]
