"""The contract of a wire dialect, as the harness routes use it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ..server.errors import APIError
from ..server.requests import ChatRequest


class Dialect(Protocol):
    """One wire format a harness may speak. The gateway only ever sees the internal request
    and answers in the internal (Chat Completions) shape; a dialect translates both ways."""

    name: str
    # what a stream sends while it has nothing to say (an SSE comment, Anthropic's ping)
    keepalive: bytes

    def parse(self, body: object, session_id: str) -> ChatRequest:
        """The internal request (APIError 400 naming the dialect's field otherwise)."""
        ...

    def reply(self, req: ChatRequest, completion: dict) -> dict:
        """The dialect's whole answer, from the internal ``chat.completion``."""
        ...

    def stream(self, req: ChatRequest, chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
        """The dialect's server-sent events, from the internal chunks (errors in-band)."""
        ...

    def error(self, exc: APIError) -> dict:
        """An error body in the dialect's own shape."""
        ...
