"""Which sessions exist, which are closed, and each one's capability: cached before the store.

Every harness call checks its session; the store is asked once per session, then the cache
answers. A delete or a "session not found" from the gateway drops the entries again.
"""

from __future__ import annotations

from ..errors import APIError
from ..gateway.record import create_session
from ..random_ids import CAPABILITY_PREFIX
from ..store.contracts import SessionLookup


class SessionIndex:
    """The sessions the routes know of, in front of ``store`` (cached both ways for keys)."""

    def __init__(self, store: SessionLookup, closed: set[str] | None = None, shared: bool = False):
        """``closed``: the set the gateway's door reads (``PolicyControl.closed_sessions``),
        so a session marked closed here is refused there too. ``shared``: other processes
        close sessions in this store too (turnstile.app.ray's replicas, a PostgreSQL store): an
        open session's status is read from the store on each call, not from the cache."""
        self.store = store
        self.known: set[str] = set()
        self.closed: set[str] = set() if closed is None else closed
        self._session_of_cap: dict[str, str] = {}
        self._cap_of_session: dict[str, str] = {}
        self.shared = shared

    def require(self, sid: str) -> str:
        """``sid`` if the session exists (404 otherwise); notes whether it is closed."""
        if sid not in self.known:
            s = self.store.get_session(sid)
            if s is None:
                raise APIError(
                    404,
                    f"No session {sid!r}. Create one with POST /v1/sessions.",
                    "session_id",
                    code="session_not_found",
                )
            self.known.add(sid)
            if s.get("status") == "closed":
                self.closed.add(sid)
        return sid

    def require_open(self, sid: str) -> None:
        """409 for a closed session: its rollout has ended."""
        if self.shared and sid not in self.closed and self.store.session_status(sid) == "closed":
            self.closed.add(sid)
        if sid in self.closed:
            raise APIError(
                409,
                f"Session {sid!r} is closed: its rollout has ended. Open a new "
                "session for new calls.",
                "session_id",
                code="session_closed",
                type_="invalid_request_error",
            )

    async def ensure(self, sid: str) -> str:
        """The session ``sid``, created on first use (``X-Session-Id``) through the store's
        writer (its commit waits off the loop, grouped with the calls' records)."""
        if sid not in self.known:
            await create_session(self.store, {"created_by": "x-session-id"}, sid)
            self.require(sid)  # an existing one may be closed (e.g. before a restart)
        return sid

    def mark_closed(self, sid: str) -> None:
        self.closed.add(sid)

    def uncache(self, sid: str) -> None:
        """Forget what is known of ``sid`` (deleted, re-created, or gone meanwhile)."""
        self.known.discard(sid)
        self.closed.discard(sid)

    def capabilities(self, sids: list[str]) -> dict[str, str]:
        """Session id → its harness capability, for the sessions that have one."""
        missing = [s for s in sids if s not in self._cap_of_session]
        if missing:
            for sid, cap in self.store.capabilities(missing).items():
                self._cap_of_session[sid], self._session_of_cap[cap] = cap, sid
        return {s: self._cap_of_session[s] for s in sids if s in self._cap_of_session}

    def session_for(self, cap: str) -> str | None:
        """The session a capability belongs to, or None."""
        sid = self._session_of_cap.get(cap)
        if sid is None and cap.startswith(CAPABILITY_PREFIX):
            sid = self.store.session_for_capability(cap)
            if sid is not None:
                self._session_of_cap[cap], self._cap_of_session[sid] = sid, cap
        return sid

    def forget_capability(self, sid: str) -> None:
        cap = self._cap_of_session.pop(sid, None)
        if cap is not None:
            self._session_of_cap.pop(cap, None)
