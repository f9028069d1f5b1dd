"""Session affinity inside Ray Serve: every call of a session goes to one gateway replica.

The routing runs in Serve's own request router (``RequestRouter``, here Ray's consistent-hash
ring, ``ray.serve.experimental.consistent_hash_router``), in Serve's HTTP proxy: no proxy of
ours in front of Serve. Ray's ring keys on the ``x-session-id`` header; harnesses do not send
one, so :class:`SessionRouter` keys on what they do send: the session's capability, in the
base URL (``/s/<capability>/v1/...``) or as the API key. A request naming neither (a trainer
route) goes to any replica. When a replica dies the ring walks on to the next replica, which
rebuilds the session's call tree from the store. A replica asks the same router which replica
owns a new session (the key as :data:`SESSION_KWARG`, through its own deployment handle) to
mint a base URL at that replica's direct address (``turnstile.app.ray.direct``).
"""

from __future__ import annotations

import pickle
import re
from typing import Any

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter

_CAPABILITY_PATH = re.compile(r"^/s/([^/]+)/")


def session_key(path: str, headers: list[tuple[bytes, bytes]] | Any) -> str | None:
    """The routing key of a request: its session capability (path, else a bearer or
    ``x-api-key`` ``cap_`` key), else the session id a trainer names in ``X-Session-Id``,
    else None."""
    m = _CAPABILITY_PATH.match(path)
    if m:
        return m.group(1)
    named = None
    for key, value in headers:
        k = key.lower()
        if k == b"authorization" and value[:7].lower() == b"bearer " and value[7:11] == b"cap_":
            return value[7:].decode("latin-1")
        if k == b"x-api-key" and value[:4] == b"cap_":  # the Anthropic SDK's key
            return value.decode("latin-1")
        if k == b"x-session-id":
            named = "id:" + value.decode("latin-1")
    return named


# A routing key handed to the router directly, as a keyword argument of
# ``DeploymentHandle.choose_replica``: the ring's replica for a session, without sending it a
# request. (A keyword, not a class of ours: the router class Serve loads may not share this
# module's classes.)
SESSION_KWARG = "turnstile_session"


def request_scope(arg: object) -> dict | None:
    """The ASGI scope of a request the HTTP proxy routes (it sends a pickled
    ``StreamingHTTPRequest``), or None for other callers."""
    if isinstance(arg, bytes):
        try:
            arg = pickle.loads(arg)  # made by Serve's own proxy, in this process
        except Exception:  # noqa: BLE001 - not an HTTP request: no session key
            return None
    scope = getattr(arg, "asgi_scope", None)
    return scope if isinstance(scope, dict) else None


class SessionRouter(ConsistentHashRouter):
    """Ray's consistent-hash router, keyed on the Turnstile session a request belongs to."""

    def _routing_key(self, pending_request: Any) -> str | None:
        if pending_request is None:
            return None
        named = (pending_request.kwargs or {}).get(SESSION_KWARG)
        if isinstance(named, str):
            return named
        if pending_request.args:
            scope = request_scope(pending_request.args[0])
            if scope is not None:
                key = session_key(scope.get("path", ""), scope.get("headers", []))
                if key is not None:
                    return key
        return super()._routing_key(pending_request)
