"""The contract of a wire dialect, as the harness routes use it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar, Literal, Protocol, runtime_checkable

from ..errors import APIError
from ..request import Answer, ChatRequest, Streamed
from ..store.contracts import CallReader


class Served(Protocol):
    """What a dialect needs of the gateway behind it (it knows nothing else of it)."""

    @property
    def model_name(self) -> str: ...

    @property
    def store(self) -> CallReader:
        """The one thing a dialect reads from the store: a session's recorded calls (the
        Responses dialect resolves ``previous_response_id`` and item references)."""
        ...

    def parse_request(self, body: object) -> ChatRequest:
        """The internal request, validated as strictly as the gateway's mode needs."""
        ...


# What a dialect's route does, served by the harness edge (``server.routes_harness``): run a
# call, count a request's prompt tokens, or read back a stored response.
RouteKind = Literal["call", "count_tokens", "stored"]
Routes = tuple[tuple[str, str, RouteKind], ...]


class Dialect(Protocol):
    """One wire format a harness may speak. The gateway only ever sees the internal request
    and answers in the internal (Chat Completions) shape; a dialect translates both ways."""

    name: str
    # its routes under a session's base URL (and the bare ``/v1``): (method, path, kind); the
    # class declares them, the app's route table is built from the classes
    routes: ClassVar[Routes]

    # what a stream sends while it has nothing to say, given the last part it sent: what the
    # harness's idle timer counts (a data chunk its SDK yields, Anthropic's ping), not only
    # bytes on the wire (``server.streaming.EventStream``)
    def keepalive(self, last: bytes) -> bytes: ...

    # the top-level list a harness resends whole on every call (its history): the server
    # parses only what is new in it (``server.resent``)
    history_field: ClassVar[str]

    def __init__(self, gateway: Served) -> None: ...

    def parse(self, body: object, session_id: str) -> ChatRequest:
        """The internal request (APIError 400 naming the dialect's field otherwise)."""
        ...

    def reply(self, req: ChatRequest, answer: Answer) -> dict:
        """The dialect's whole answer, from the internal ``chat.completion``."""
        ...

    def stream(self, req: ChatRequest, chunks: Streamed) -> AsyncIterator[bytes]:
        """The dialect's server-sent events, from the internal chunks (errors in-band)."""
        ...

    def error(self, exc: APIError) -> dict:
        """An error body in the dialect's own shape."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """A dialect with a ``count_tokens`` route: the request as it would be sent now."""

    def count_request(self, body: object, session_id: str) -> ChatRequest: ...


@runtime_checkable
class StoresResponses(Protocol):
    """A dialect with a ``stored`` route: a response read back from the session's records."""

    def stored(self, session_id: str, rid: str) -> dict: ...
