"""``turnstile view --data DIR``: the viewer over a record store, with no engine, read-only.

It serves the page and the trainer's read routes (sessions, calls, kept bodies, trajectories,
images) from the store; every other route of ``turnstile serve`` (harness, admin, writes)
answers 503 saying why, in the API's error shape. Records are read through the store's read
paths and the viewer's read-only connection; nothing is written (a store written by an older
Turnstile is migrated on open, as by serve)."""

from __future__ import annotations

from typing import cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..chat.loaded_tokenizer import LoadedTokenizer
from ..errors import APIError
from ..gateway.contract import AppGateway
from ..server.access import trainer
from ..server.app import ROUTES as SERVE_ROUTES
from ..server.context import AppContext
from ..server.error_handlers import EXCEPTION_HANDLERS
from ..server.limits import Limits
from ..server.routes_sessions import (
    call_body,
    calls,
    image,
    list_sessions,
    session,
    trajectories,
)
from ..server.session_index import SessionIndex
from ..store.store import Store
from .routes import viewer_routes


async def read_only(request: Request) -> Response:
    raise APIError(
        503,
        "turnstile view serves recorded sessions read-only: no engine is behind "
        "it and nothing can be written here. Run turnstile serve for chat "
        "completions, rewards and session changes.",
        code="read_only_viewer",
        type_="server_error",
    )


_READ = [
    Route("/v1/sessions", trainer(list_sessions), methods=["GET"]),
    Route("/v1/sessions/{sid}", trainer(session), methods=["GET"]),
    Route("/v1/sessions/{sid}/calls", trainer(calls), methods=["GET"]),
    Route("/v1/sessions/{sid}/calls/{cid}/body", trainer(call_body), methods=["GET"]),
    Route("/v1/sessions/{sid}/trajectories", trainer(trajectories), methods=["GET"]),
    # the bytes of the session's images (the token view shows each at its block)
    Route("/v1/sessions/{sid}/images/{sha256}", trainer(image), methods=["GET"]),
]
# The read routes first; every other route turnstile serve has (harness, admin, writes)
# answers read_only. The viewer's own routes are mounted beside them (create_viewer_app).
ROUTES = [
    *_READ,
    *(
        Route(r.path, read_only, methods=sorted((r.methods or set()) - {"HEAD"}))
        for r in SERVE_ROUTES
        if isinstance(r, Route)
    ),
]


def create_viewer_app(
    store: Store, public_url: str, *, token: str | None, tokenizer: LoadedTokenizer | None = None
) -> Starlette:
    """The viewer over ``store``; ``token`` as for ``create_app`` (None: open). The page names
    ``tokenizer``'s model by the name of the file or directory ``--model`` gave."""
    ctx = AppContext(
        # No route mounted here reaches the gateway (harness, admin and write routes are
        # read_only above); the context's type wants one.
        gateway=cast(AppGateway, None),
        store=store,
        public_url=public_url,
        max_body=1 << 20,
        token=token,
        limits=Limits(),
        sessions=SessionIndex(store),
        tokenizer=tokenizer,
    )
    app = Starlette(
        routes=[*viewer_routes(None), *ROUTES], exception_handlers=dict(EXCEPTION_HANDLERS)
    )
    app.state.turnstile = ctx
    return app
