"""What every route handler shares, kept on the Starlette app (``app.state.turnstile``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..chat.loaded_tokenizer import LoadedTokenizer
from ..errors import APIError
from ..gateway.contract import AppGateway
from ..store.contracts import SessionStore
from .limits import Checked, Limits
from .resent import ResentBodies, parse_json
from .session_index import SessionIndex

if TYPE_CHECKING:
    from ..dialects.base import Dialect
    from .peers import Peers


@dataclass
class AppContext:
    """The gateway and store behind the routes, the server's settings and the session cache.

    ``token``: the trainer's token (None: every route open, ``--no-auth``). ``tokenizer``:
    what the viewer decodes token IDs with (None: it shows the IDs). ``session_origin``: where
    a session's harness should call, given its capability (``scheme://host:port``; None:
    ``public_url``): turnstile.app.ray names the replica that owns the session, so its calls skip
    Serve's proxy (``public_url`` stays the fallback).
    """

    gateway: AppGateway
    store: SessionStore
    public_url: str
    max_body: int
    token: str | None
    limits: Limits
    sessions: SessionIndex
    dialects: dict[str, Dialect] = field(default_factory=dict)  # by name: "chat", ...
    tokenizer: LoadedTokenizer | None = None
    # seconds of silence after which a stream sends its dialect's keep-alive (None: never)
    keepalive: float | None = 10.0
    session_origin: Callable[[str], Awaitable[str | None]] | None = None
    # the other workers of ``turnstile serve --workers N``, on the front (None: no others)
    peers: Peers | None = None
    # each session's last body that passed the size limits: a resent history is not walked again
    checked: Checked = field(init=False)
    # each session's last body: a resent history is not parsed again
    resent: ResentBodies = field(default_factory=ResentBodies)

    def __post_init__(self) -> None:
        self.checked = Checked(self.limits)

    def forget_bodies(self, session: str) -> None:
        """What was kept of a session's last body (it closed, or was deleted)."""
        self.checked.forget(session)
        self.resent.forget(session)


def context(request: Request) -> AppContext:
    """The context of the app serving ``request``."""
    return request.app.state.turnstile


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def read_body(request: Request, limit: int) -> bytearray:
    """The body's bytes, refused (413) as soon as they exceed ``limit``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(
            413,
            f"The request body is {length} bytes; the limit is {limit} "
            "(start turnstile with a larger --max-body-mb).",
            code="request_too_large",
        )
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(
                413,
                f"The request body exceeds the limit of {limit} bytes "
                "(start turnstile with a larger --max-body-mb).",
                code="request_too_large",
            )
    return body


async def read_json(request: Request, limit: int, required: bool = True) -> object:
    """The body as JSON, refused (413) as soon as it exceeds ``limit`` bytes."""
    body = await read_body(request, limit)
    if not body and not required:
        return None
    return parse_json(body)
