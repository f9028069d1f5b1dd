"""The contract of a wire dialect, as the harness routes use it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

from ..answer import Answer, CallReader, Relayed, Streamed
from ..errors import APIError
from ..request import ChatRequest


class Served(Protocol):
    """What a dialect needs of the gateway behind it (it knows nothing else of it)."""

    @property
    def model_name(self) -> str: ...

    @property
    def store(self) -> CallReader:
        """The one thing a dialect reads from the store: a session's recorded calls (the
        Responses dialect resolves ``previous_response_id`` and item references)."""
        ...

    @property
    def renders_prompt(self) -> bool:
        """Turnstile renders the prompt itself (token-in): a request is validated in full;
        False when the engine renders it (capture), which then checks what Turnstile does not."""
        ...


# What a dialect's route does, served by the harness edge (``server.routes_harness``): run a
# call, count a request's prompt tokens, read back a stored response, or list/describe the
# model (in the dialect's own shape).
RouteKind = Literal["call", "count_tokens", "stored", "models", "model"]


@dataclass(frozen=True)
class Route:
    """One route of a dialect, as data: the server mounts ``path`` under each of the dialect's
    ``prefixes`` (bare, and under a session's ``/s/{sid}``) and describes it in its OpenAPI
    document from ``summary`` and ``body`` (a schema name: the server's own, or one of the
    dialect's ``schemas``)."""

    method: str
    path: str  # after the prefix; ``{name}`` is a path parameter (Starlette's syntax)
    kind: RouteKind
    summary: str
    body: str | None = None
    # where the stream choice lives: None, the body's ``stream`` field; True/False, the route
    # itself (Gemini's ``:streamGenerateContent`` against ``:generateContent``)
    stream: bool | None = None
    # under which of the dialect's ``prefixes`` (None: all of them)
    prefixes: tuple[str, ...] | None = None


Routes = tuple[Route, ...]

# A place a harness puts its API key: ("header", name) or ("query", name). Every dialect's
# routes read ``Authorization: Bearer`` and ``x-api-key``; a dialect declares the others its
# SDKs use (``server.access`` reads them on its routes only; a query parameter is never
# logged or recorded: the log names the route's template, the record keeps the body).
Credential = tuple[Literal["header", "query"], str]


@dataclass(frozen=True)
class Edge:
    """What a request's route gave it beside its body: its path parameters, its query (the
    credential's parameter taken out) and the route's stream choice."""

    params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    stream: bool | None = None


NO_EDGE = Edge()


class Dialect(Protocol):
    """One wire format a harness may speak. The gateway only ever sees the internal request
    and answers with the typed answer (``turnstile.answer``); a dialect translates both ways."""

    # its name: the record's ``dialect``, the ``dialect`` label of its metrics
    name: str
    # its routes under each of ``prefixes`` (API versions), served under a session's base URL
    # (``/s/{sid}`` + prefix) and bare; the class declares them, the app's route table is
    # built from the classes
    prefixes: ClassVar[tuple[str, ...]]
    routes: ClassVar[Routes]
    # where its SDKs put the API key besides ``Authorization``/``x-api-key``
    credentials: ClassVar[tuple[Credential, ...]]
    # request-body schemas its routes name that the server does not know (OpenAPI components)
    schemas: ClassVar[Mapping[str, dict]]

    # what a stream sends while it has nothing to say, given the last part it sent: what the
    # harness's idle timer counts (a data chunk its SDK yields, Anthropic's ping), not only
    # bytes on the wire (``server.streaming.EventStream``)
    def keepalive(self, last: bytes) -> bytes: ...

    # the top-level list a harness resends whole on every call (its history): the server
    # parses only what is new in it (``server.resent``)
    history_field: ClassVar[str]

    def __init__(self, gateway: Served) -> None: ...

    def parse(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        """The internal request (APIError 400 naming the dialect's field otherwise); ``edge``
        what the route gave beside the body (path parameters, query, stream choice)."""
        ...

    def reply(self, req: ChatRequest, answer: Answer | Relayed) -> dict:
        """The dialect's whole answer (``Relayed``: capture mode's, which only Chat serves)."""
        ...

    def stream(self, req: ChatRequest, events: Streamed) -> AsyncIterator[bytes]:
        """The dialect's server-sent events, from the answer's events (errors in-band)."""
        ...

    def error(self, exc: APIError) -> dict:
        """An error body in the dialect's own shape."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """A dialect with a ``count_tokens`` route: the request as it would be sent now."""

    def count_request(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest: ...

    def counted(self, tokens: int) -> dict:
        """The answer to a ``count_tokens`` route."""
        ...


@runtime_checkable
class StoresResponses(Protocol):
    """A dialect with a ``stored`` route: a response read back from the session's records."""

    def stored(self, session_id: str, rid: str) -> dict: ...


@runtime_checkable
class ListsModels(Protocol):
    """A dialect with ``models``/``model`` routes: the one model, in the dialect's shape."""

    def model_list(self, name: str, context_length: int | None) -> dict: ...

    def model(self, name: str, context_length: int | None, asked: str) -> dict: ...
