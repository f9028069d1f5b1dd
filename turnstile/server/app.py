"""HTTP routes. Harness-facing: ``/v1/chat/completions`` and ``/v1/models`` under a session's
base URL ``/s/<capability>/v1`` (or with the capability as the API key). Trainer-facing (the
trainer's token): sessions (open, list, reward, close, delete), their calls and trajectories
(merged or per call), admin, the OpenAPI document. Credentials: turnstile/auth.py.

This module wires the app; the handlers live in ``routes_harness``, ``routes_sessions`` and
``routes_admin``, access checks in ``access``, shared state in ``context``, the session cache
in ``session_index`` and the error responses in ``error_handlers``. The trajectory viewer sits
above this edge: whoever composes the app mounts its routes (``mounted``; ``wiring.py`` does
for ``turnstile serve``), so nothing here imports it."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route, WebSocketRoute

from ..chat.loaded_tokenizer import LoadedTokenizer
from ..dialects import DIALECTS
from ..dialects.base import Dialect
from ..gateway.contract import AppGateway
from .access import DEFAULT_SESSION, trainer
from .context import AppContext
from .error_handlers import EXCEPTION_HANDLERS
from .limits import Limits
from .metrics import Metrics, MetricsMiddleware, call_suffixes, metrics_route
from .monitor import Monitor, VerifyOptions
from .peers import PEER_PATH, Peers
from .routes_admin import admin_pause, admin_resume, admin_status, health, openapi, peer
from .routes_harness import dialect_routes, hello, models, no_websocket
from .routes_sessions import (
    call_body,
    calls,
    close,
    create_session,
    image,
    list_sessions,
    rewards,
    session,
    trajectories,
    verify_session,
)
from .session_index import SessionIndex

__all__ = ["DEFAULT_SESSION", "create_app"]

# Harness routes check the capability themselves; trainer() guards the rest; /health is
# open (engine up or not, for probes). Each route is described in openapi.py.
ROUTES = [
    *dialect_routes(DIALECTS),
    Route("/v1/models", models, methods=["GET"]),
    Route("/s/{sid}/v1/models", models, methods=["GET"]),
    Route("/api/hello", hello, methods=["GET"]),  # Claude Code's connectivity probe
    Route("/s/{sid}/api/hello", hello, methods=["GET"]),
    Route("/v1/sessions", trainer(create_session), methods=["POST"]),
    Route("/v1/sessions", trainer(list_sessions), methods=["GET"]),
    Route("/v1/sessions/{sid}", trainer(session), methods=["GET", "DELETE"]),
    Route("/v1/sessions/{sid}/rewards", trainer(rewards), methods=["POST"]),
    Route("/v1/sessions/{sid}/close", trainer(close), methods=["POST"]),
    Route("/v1/sessions/{sid}/calls", trainer(calls), methods=["GET"]),
    Route("/v1/sessions/{sid}/calls/{cid}/body", trainer(call_body), methods=["GET"]),
    Route("/v1/sessions/{sid}/images/{sha256}", trainer(image), methods=["GET"]),
    Route("/v1/sessions/{sid}/trajectories", trainer(trajectories), methods=["GET"]),
    Route("/v1/sessions/{sid}/verify", trainer(verify_session), methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/admin/pause", trainer(admin_pause), methods=["POST"]),
    Route("/admin/resume", trainer(admin_resume), methods=["POST"]),
    Route("/admin/status", trainer(admin_status), methods=["GET"]),
    Route("/openapi.json", trainer(openapi), methods=["GET"]),
    Route("/metrics", trainer(metrics_route), methods=["GET"]),
    WebSocketRoute("/{path:path}", no_websocket),  # any upgrade: 426, use HTTP
]


def create_app(
    gateway: AppGateway,
    public_url: str,
    max_body: int = 32 << 20,
    *,
    token: str | None,
    limits: Limits | None = None,
    tokenizer: LoadedTokenizer | None = None,
    replica: str | None = None,
    keepalive: float | None = 10.0,
    verify: VerifyOptions | None = None,
    session_origin: Callable[[str], Awaitable[str | None]] | None = None,
    shared: bool = False,
    peers: Peers | None = None,
    peer_route: bool = False,
    mounted: Sequence[BaseRoute] = (),
) -> Starlette:
    """``token``: the trainer's token (None: every route open, ``--no-auth``); ``tokenizer``:
    the viewer shows token IDs as its text pieces (None: as IDs); ``replica``: the
    ``replica`` label of its metrics (default: ``host:pid``); ``keepalive``: seconds of
    silence after which a stream sends a keep-alive (0/None: never); ``verify``: the live
    mismatch monitor's settings (None: off); ``session_origin``: where a session's base URL
    points, by capability (None: ``public_url``; see ``AppContext``); ``shared``: other
    gateways write this store too (a session's status is read from it per call); ``peers``:
    the other workers the front of ``--workers N`` sends its trainer's actions to;
    ``peer_route``: this gateway is one of those workers (it answers ``/internal/peer``);
    ``mounted``: routes of the layers above this edge, served beside its own (the viewer's:
    ``turnstile.viewer.routes.viewer_routes``)."""
    store = gateway.store
    metrics = Metrics(replica)
    if store is not None:  # every committed call feeds the metrics
        store.observe(metrics.committed)
    monitor = None
    if verify is not None and verify.fraction > 0 and store is not None:
        monitor = Monitor(
            store,
            verify.engine,
            verify.url,
            verify.fraction,
            metrics.registry,
            metrics.replica,
            verify.threshold,
        )
        store.observe(monitor.committed)
    ctx = AppContext(
        gateway=gateway,
        store=store,
        public_url=public_url,
        max_body=max_body,
        token=token,
        limits=limits or Limits(),
        sessions=SessionIndex(store, gateway.control.closed_sessions, shared),
        dialects=_dialects(gateway),
        tokenizer=tokenizer,
        keepalive=keepalive or None,
        session_origin=session_origin,
        peers=peers,
    )
    routes = [*ROUTES, *mounted]
    if peer_route:
        routes.append(Route(PEER_PATH, trainer(peer), methods=["POST"]))
    app = Starlette(
        routes=routes,
        lifespan=_lifespan,
        exception_handlers=dict(EXCEPTION_HANDLERS),
        middleware=[Middleware(MetricsMiddleware, metrics=metrics, calls=call_suffixes(DIALECTS))],
    )
    app.state.turnstile = ctx
    app.state.metrics = metrics
    app.state.monitor = monitor
    return app


def _dialects(gateway: AppGateway) -> dict[str, Dialect]:
    found: list[Dialect] = [cls(gateway) for cls in DIALECTS]
    return {d.name: d for d in found}


# New containers between young collections, young collections between middle ones, middle
# between full ones (Python's default: 700, 10, 10); see _lifespan.
GC_THRESHOLD = (10_000, 20, 10)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """Start the engine (and say what the records will lack), close it on shutdown."""
    gateway: AppGateway = app.state.turnstile.gateway
    await gateway.engine.start()
    monitor: Monitor | None = app.state.monitor
    if monitor is not None:
        await monitor.start()
    warning = gateway.engine.logprob_warning()
    if warning:
        print(f"turnstile: WARNING: {warning}", file=sys.stderr)
    if gateway.template_ignores_tools:
        print(
            "turnstile: WARNING: the chat template does not render 'tools': a request's "
            "tools never reach the model (each such call records it in info.warnings); "
            "serve with --chat-template FILE for a template that renders them",
            file=sys.stderr,
        )
    # Everything loaded by now (tokenizer, template, imports: ~100k objects) lives as long as
    # the server: out of the collector's sight, a full collection scans only what calls keep
    # (at 100k-token requests those ran every ~70 calls and cost ~4x as much with it).
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    # At 700 a young collection ran more than once per 100k-token request (its parsed body
    # alone is ~1,000 containers); at GC_THRESHOLD such turns took ~9% less CPU
    # (benchmarks/README.md, coding-agent sessions).
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.unfreeze()  # back to the collector (tests start many apps in one process)
        gc.set_threshold(*threshold)
    if monitor is not None:
        await monitor.close()
    peers = app.state.turnstile.peers
    if peers is not None:
        await peers.close()
    await gateway.engine.close()
