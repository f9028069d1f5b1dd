"""The OpenAPI 3.1 document of Turnstile's routes (served at ``GET /openapi.json`` to the trainer,
and what the fuzzer in tests/test_fuzz.py and benchmarks/fuzz.py generates requests from).

One entry per route in :data:`ROUTES`; app.py's route table must match it (checked by
tests/test_fuzz.py). Bodies are described as the validators in app.py and requests.py accept
them, so schema-conforming requests are meant to succeed and the rest to get a 400 naming the
field."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..dialects import DIALECTS
from ..dialects.base import Dialect
from .openapi_schemas import SCHEMAS, STR

TRAINER, HARNESS, OPEN = "trainer", "harness", "open"


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    access: str
    summary: str
    body: str | None = None  # a SCHEMAS name
    body_required: bool = True
    query: dict[str, dict] = field(default_factory=dict)  # name -> schema
    streams: bool = False
    media: str = "application/json"  # of the 200 answer


_LIST_Q: dict[str, dict] = {
    "group": STR,
    "group_id": STR,
    "status": {"enum": ["open", "closed"]},
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "after": STR,
    "exported": {"enum": ["true", "false"]},
}

_NUM = {"type": "number"}
_VIEWER_Q: dict[str, dict] = {
    "group": STR,
    "status": {"enum": ["open", "closed"]},
    "model": STR,
    "min_reward": _NUM,
    "max_reward": _NUM,
    "new_segments": {"enum": ["true", "false"]},
    "since": _NUM,
    "until": _NUM,
    "sort": {"enum": ["created", "reward", "calls", "errors", "segments", "sampled", "length"]},
    "order": {"enum": ["asc", "desc"]},
    "limit": {"type": "integer", "minimum": 1, "maximum": 5000},
    "offset": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
}

_SESSION_BASE = "/s/{capability}"  # the app's ``/s/{sid}``: a session's base URL


def dialect_ops(dialects: Iterable[type[Dialect]]) -> list[Op]:
    """Each dialect's declared routes, as the app mounts them: under each of its prefixes,
    under a session's base URL and bare (the session then from the credential, or the
    trainer's ``X-Session-Id``)."""
    bare = (
        "for the session of the capability sent as the API key (or, with the trainer's "
        "token, the one X-Session-Id names)"
    )
    out = []
    for dialect in dialects:
        for route in dialect.routes:
            streams = route.kind == "call" and route.stream is not False
            for prefix in route.prefixes or dialect.prefixes:
                for base, where in (
                    (_SESSION_BASE, "for the session of this base URL"),
                    ("", bare),
                ):
                    out.append(
                        Op(
                            route.method,
                            base + prefix + route.path,
                            HARNESS,
                            f"{route.summary} ({dialect.name}), {where}",
                            route.body,
                            streams=streams,
                        )
                    )
    return out


ROUTES: list[Op] = [
    *dialect_ops(DIALECTS),
    Op("GET", "/s/{capability}/v1/models", HARNESS, "The model list, for a session"),
    Op("GET", "/v1/models", HARNESS, "The model list (capability or trainer token)"),
    Op(
        "POST",
        "/v1/sessions",
        TRAINER,
        "Open a session; returns its id and base_url",
        "SessionCreate",
        body_required=False,
    ),
    Op("GET", "/v1/sessions", TRAINER, "List sessions in creation order", query=_LIST_Q),
    Op("GET", "/v1/sessions/{sid}", TRAINER, "A session with its rewards"),
    Op("DELETE", "/v1/sessions/{sid}", TRAINER, "Delete a session with its calls"),
    Op("POST", "/v1/sessions/{sid}/rewards", TRAINER, "Attach rewards", "Rewards"),
    Op(
        "POST",
        "/v1/sessions/{sid}/close",
        TRAINER,
        "Close a session (its running calls are aborted; they and later calls get 409)",
        "Close",
        body_required=False,
    ),
    Op("GET", "/v1/sessions/{sid}/calls", TRAINER, "One record per engine call"),
    Op(
        "GET",
        "/v1/sessions/{sid}/calls/{cid}/body",
        TRAINER,
        "A call's raw request/response (serve --keep-bodies)",
    ),
    Op(
        "GET",
        "/v1/sessions/{sid}/images/{sha256}",
        TRAINER,
        "The bytes of an image the session's calls hold, by its sha256 (trajectories' images)",
    ),
    Op(
        "GET",
        "/v1/sessions/{sid}/trajectories",
        TRAINER,
        "Stitched trajectories",
        query={
            "mode": {"enum": ["merged", "per_call"]},
            "lineages": {"enum": ["all", "main", "side"]},
            # masks for calls weight updates reached (docs/weight_sync.md)
            "mask_stale_versions": {"type": "boolean"},
            "max_preemptions": {"type": "integer", "minimum": 0},
        },
    ),
    Op(
        "POST",
        "/v1/sessions/{sid}/verify",
        TRAINER,
        "Re-feed the session's trajectories to the engine that served them: recorded "
        "logprobs against its recompute, beside the naive (re-tokenized) version",
    ),
    Op("GET", "/health", OPEN, "Engine reachable (200) or not (503)"),
    Op("GET", "/api/hello", OPEN, "The connectivity probe Claude Code sends (200)"),
    Op(
        "GET",
        "/s/{capability}/api/hello",
        OPEN,
        "The connectivity probe Claude Code sends to its base URL (200)",
    ),
    Op(
        "POST",
        "/admin/pause",
        TRAINER,
        "Pause new calls (drain, abort or hold running ones)",
        "Pause",
        body_required=False,
    ),
    Op(
        "POST",
        "/admin/resume",
        TRAINER,
        "Resume, optionally under a new weight version",
        "Resume",
        body_required=False,
    ),
    Op("GET", "/admin/status", TRAINER, "Paused?, calls in flight, weight version, replicas"),
    Op("GET", "/openapi.json", TRAINER, "This document"),
    Op(
        "GET",
        "/metrics",
        TRAINER,
        "Prometheus metrics of this gateway (text format)",
        media="text/plain",
    ),
    Op(
        "GET",
        "/ui",
        OPEN,
        "The trajectory viewer (asks for the trainer's token)",
        media="text/html",
    ),
    Op("GET", "/ui/viewer.js", OPEN, "The viewer's script", media="text/javascript"),
    Op("GET", "/ui/viewer.css", OPEN, "The viewer's style sheet", media="text/css"),
    Op(
        "GET",
        "/v1/viewer/sessions",
        TRAINER,
        "Sessions with their calls summed up (calls, errors, new segments, tokens, models), "
        "filtered, counted and sorted",
        query=_VIEWER_Q,
    ),
    Op(
        "GET",
        "/v1/viewer/sessions/{sid}/trajectories",
        TRAINER,
        "Stitched trajectories with each token's text piece and where a segment diverged",
        query={"mode": {"enum": ["merged", "per_call"]}},
    ),
    Op(
        "GET",
        "/v1/viewer/sessions/{sid}/trajectories.parquet",
        TRAINER,
        "The session's trajectories as one Parquet file (the export's trajectories schema)",
        query={"mode": {"enum": ["merged", "per_call"]}},
        media="application/vnd.apache.parquet",
    ),
]

# the bare call routes, where the trainer names a session with X-Session-Id
_BARE_CALLS = frozenset(
    p + r.path
    for d in DIALECTS
    for r in d.routes
    if r.kind == "call"
    for p in r.prefixes or d.prefixes
)

_ERRORS = {
    "400": "a field is invalid (param names it)",
    "401": "no or unknown credential",
    "403": "this credential does not allow the route",
    "404": "no such session/call (or route)",
    "409": "the session is closed",
    "413": "body over --max-body-mb",
    "415": "Content-Type is not application/json",
    "502": "engine failure",
    "503": "engine unavailable, or paused with abort",
}


def _operation(op: Op) -> dict:
    params = [
        {"name": name, "in": "path", "required": True, "schema": STR}
        for name in re.findall(r"\{([^}]+)\}", op.path)
    ]
    params += [
        {"name": k, "in": "query", "required": False, "schema": v} for k, v in op.query.items()
    ]
    if op.path in _BARE_CALLS:
        params.append({"name": "X-Session-Id", "in": "header", "required": False, "schema": STR})
    out: dict = {
        "summary": op.summary,
        "operationId": (
            op.method.lower() + re.sub(r"[/.:]", "_", op.path.replace("{", "").replace("}", ""))
        ),
        "security": {
            TRAINER: [{"trainer": []}],
            OPEN: [],
            HARNESS: [{"capability": []}, {"trainer": []}],
        }[op.access],
        "responses": {
            "200": {
                "description": "OK",
                "content": {
                    op.media: {
                        "schema": {"type": "object"} if op.media == "application/json" else STR
                    },
                    **({"text/event-stream": {"schema": STR}} if op.streams else {}),
                },
            },
            **{
                code: {
                    "description": what,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
                for code, what in _ERRORS.items()
            },
        },
    }
    if op.method == "POST" and op.path == "/v1/sessions":
        out["responses"]["201"] = out["responses"].pop("200")
    if params:
        out["parameters"] = params
    if op.body:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{op.body}"}}
            },
        }
    return out


def document(version: str, server_url: str | None = None) -> dict:
    paths: dict[str, dict] = {}
    for op in ROUTES:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    doc: dict[str, object] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Turnstile",
            "version": version,
            "description": (
                "OpenAI-compatible gateway that records the exact tokens a policy saw and "
                "sampled. Harnesses hold a session's base URL (/s/<capability>/v1); every "
                "other route needs the trainer's token."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {**SCHEMAS, **{k: v for d in DIALECTS for k, v in d.schemas.items()}},
            "securitySchemes": {
                "trainer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The trainer's token (DATA/turnstile.token, --token, "
                    "or $TURNSTILE_TOKEN).",
                },
                "capability": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A session's capability: in its base URL "
                    "(/s/<capability>/v1) or as the API key.",
                },
            },
        },
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
