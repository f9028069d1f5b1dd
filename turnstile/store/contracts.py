"""The narrow views of the store that the layers above it are typed against.

The :class:`~.store.Store` has some thirty methods (writes, exports, bodies, pruning); a route
or a dialect needs a handful. Each caller names the view it uses, so a reader sees what it can
touch and a second store implementation knows what it must serve. The ``Store`` satisfies
every one (mypy checks it where the app is built).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

from ..media import Image
from .database import Database
from .records import CallRecord


class CallReader(Protocol):
    """A session's recorded calls, in order (the Responses dialect resolves
    ``previous_response_id`` from them; the live monitor re-scores them; verify stitches them)."""

    def calls(self, session_id: str) -> list[CallRecord]: ...


class SessionOpener(Protocol):
    """Create a session through the store's writer (committed with the calls beside it)."""

    def open_session(
        self,
        metadata: dict,
        session_id: str | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
    ) -> tuple[asyncio.Future, str]: ...


class SessionLookup(SessionOpener, Protocol):
    """What the server's session index reads: a session, its status, its capability."""

    def get_session(self, session_id: str) -> dict | None: ...

    def session_status(self, session_id: str) -> str | None: ...

    def capabilities(self, session_ids: Iterable[str]) -> dict[str, str]: ...

    def session_for_capability(self, capability: str) -> str | None: ...


class SessionStore(SessionLookup, CallReader, Protocol):
    """What the HTTP routes use: the trainer's session routes, the viewer, the metrics."""

    def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        after: str | None = None,
        exported: bool | None = None,
    ) -> tuple[list[dict], bool]: ...

    def delete_session(self, session_id: str) -> bool: ...

    def close_session(self, session_id: str, termination_reason: str | None = None) -> bool: ...

    def has_call(self, session_id: str, call_id: str) -> bool: ...

    def set_rewards(
        self, session_id: str, rewards: dict[str, float], call_id: str | None = None
    ) -> None: ...

    def body(self, call_id: str) -> dict | None: ...

    def image(self, session_id: str, sha256: str) -> Image | None:
        """An image's bytes, only if the session's calls hold it."""
        ...

    def reader(self) -> Database:
        """A read-only connection for the viewer's bulk reads."""
        ...

    def observe(self, observer: Callable[[CallRecord, float], None]) -> None: ...
