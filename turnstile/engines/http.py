"""Plumbing the HTTP engine adapters share: one aiohttp session, JSON requests, an SSE reader,
engine error bodies turned into :class:`EngineError`, and aborts sent in the background.

An adapter's ``generate`` is an async generator. When its consumer stops early (the harness went
away: the task is cancelled, or the generator is closed) the request must not keep the engine
busy: :meth:`HTTPEngine._give_up` closes the connection at once and lets the adapter tell the
engine by request id, in the background, because a cancelled task cannot wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Protocol

import aiohttp
import orjson

from ..random_ids import random_hex
from .base import EngineBase, EngineError, Finish, SamplingParams, TokenBatch
from .connection import EnginePool, Response


class EngineUnusable(EngineError):
    """The engine answers, but not in any way this adapter can use (no route it can generate
    through): ``turnstile serve`` refuses to start with the reason instead of answering every
    call with a 502."""


def new_request_id() -> str:
    """A request id of our own, so a call can be aborted and found in engine logs."""
    return "turnstile-" + random_hex(16)


@functools.lru_cache(maxsize=64)  # asked for on every call, of one engine's version
def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.33.0"``, ``"0.11.1rc2.dev3+gabc"`` → ``(0, 33, 0)`` / ``(0, 11, 1)``."""
    if not version:
        return None
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", version.strip())
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())


def error_message(raw: bytes) -> str:
    """The human part of an engine's error body, whatever its shape: ``{"error": {"message"}}``
    (vLLM, SGLang), ``{"error": "..."}`` (SGLang contract errors), ``{"message"}`` (SGLang's
    OpenAI ErrorResponse), ``{"detail"}`` (FastAPI defaults), or plain text."""
    text = raw.decode(errors="replace").strip()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return text[:500] or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:2000]
        if isinstance(err, str) and err:
            return err[:2000]
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])[:2000]
    return text[:500]


def json_object(raw: bytes, who: str, where: str = "") -> dict:
    """An engine's JSON object, or EngineError (502) saying ``who`` sent what instead."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EngineError(f"{who} sent invalid JSON{where}: {raw[:200]!r}", 502) from exc
    if not isinstance(obj, dict):
        raise EngineError(f"{who} sent {type(obj).__name__}{where}, not an object", 502)
    return obj


def gateway_status(engine_status: int) -> int:
    """The status to give the harness for an engine's HTTP status.

    The gateway builds every engine request from the harness's request, so an engine 4xx about
    the request (bad sampling value, prompt + max_tokens over the context) is the harness's 400;
    overload and pauses stay 503 (retryable); anything else is the gateway's upstream failing
    (502)."""
    if engine_status in (400, 413, 422):
        return 400
    if engine_status in (429, 503):
        return 503
    return 502


class SSEPayloads:
    """The ``data`` payloads of server-sent events, out of a byte stream fed chunk by chunk.

    Lines may be of any length (aiohttp's line reader refuses lines over its buffer size, and an
    SGLang cumulative stream resends every logprob so far in each event). Comments
    (``: keep-alive``) and ``event:``/``id:`` lines are skipped; several ``data`` lines of one
    event are joined with newlines. Lines end in LF or CRLF. ``until_done``: a ``[DONE]``
    event ends the stream (not included; ``done`` is then set)."""

    def __init__(self, until_done: bool = True) -> None:
        self.until_done = until_done
        self.done = False
        self._buf = bytearray()
        self._data: list[bytes] = []  # the data lines of the event not yet ended

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events that ``chunk`` completed."""
        buf = self._buf
        buf += chunk
        out: list[bytes] = []
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            self._line(bytes(buf[start:nl]).rstrip(b"\r"), out)
            start = nl + 1
        del buf[:start]
        return out

    def end(self) -> list[bytes]:
        """The payload of a last event that the stream did not end with a blank line."""
        out: list[bytes] = []
        self._line(bytes(self._buf).rstrip(b"\r"), out)  # no LF in it: feed took the lines
        self._buf.clear()
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._data:
                payload = b"\n".join(self._data)
                self._data = []
                self._payload(payload, out)
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)

    def _payload(self, payload: bytes, out: list[bytes]) -> None:
        if self.done:
            return
        if self.until_done and payload.strip() == b"[DONE]":
            self.done = True
        else:
            out.append(payload)


async def sse_batches(
    chunks: AsyncIterable[bytes], until_done: bool = True
) -> AsyncIterator[list[bytes]]:
    """The ``data`` payloads of server-sent events (:class:`SSEPayloads`), grouped by the
    network read that completed them, so that a burst of tokens is handled (and answered)
    once, not once per token."""
    events = SSEPayloads(until_done)
    async for chunk in chunks:
        if batch := events.feed(chunk):
            yield batch
        if events.done:
            return
    if batch := events.end():
        yield batch


async def fed_batches(
    payload_batches: AsyncIterator[list[bytes]],
    feed: Callable[[bytes], None],
    take: Callable[[], TokenBatch],
) -> AsyncIterator[TokenBatch]:
    """Feed each batch of stream payloads to an adapter's reader and yield the events it made.
    An engine error in the middle of a batch is raised after the tokens before it are out, so
    the call record keeps them."""
    async for payloads in payload_batches:
        failure: EngineError | None = None
        for payload in payloads:
            try:
                feed(payload)
            except EngineError as exc:
                failure = exc
                break
        if events := take():
            yield events
        if failure is not None:
            raise failure


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The ``data`` payload of each server-sent event, one by one (``[DONE]`` included)."""
    async for batch in sse_batches(resp.content.iter_any(), until_done=False):
        for payload in batch:
            yield payload


class GenerationReader(Protocol):
    """An adapter's reader of one generation: whole bodies or stream events in, batches of
    token batches and one :class:`Finish` out (engine failures raised as EngineError)."""

    def feed_whole(self, raw: bytes) -> None: ...

    def feed_event(self, payload: bytes) -> None: ...

    def take(self) -> TokenBatch: ...

    def finish(self) -> Finish: ...


KEEPALIVE_S = 2.0  # idle engine connections are reused for this long, well under 5 s
ENGINE_TIMEOUT_S = 600.0  # the longest one engine call may take (serve's --engine-timeout)
# How long a new connection to the engine may take (serve's --engine-connect-timeout). An engine
# refusing connections fails at once; this bounds only one that does not answer the handshake,
# which an engine whose accept loop is starved under load does for seconds: 5 s failed such
# calls with a 502 that a relay without a connect limit never gave.
CONNECT_TIMEOUT_S = 60.0


# What a failed request on the adapters' pool raises (connection.py): a ConnectionError, or
# TimeoutError past the engine timeout; both are OSErrors.
ENGINE_FAILURES: tuple[type[BaseException], ...] = (OSError,)


def timed_out(exc: BaseException) -> bool:
    """Whether a failed engine call ran past the adapter's timeout (the whole call's, or a
    read's), not into a connection that could not be made (aiohttp's connect timeout is a
    TimeoutError too, but means the engine is unreachable)."""
    return isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)


class HTTPEngine(EngineBase):
    """Session, JSON requests and background aborts for an engine reached over HTTP (the
    :class:`~.base.EngineControl` contract but the settings each adapter learns)."""

    name = "http"
    label = "engine"  # how messages name the engine

    url: str

    def __init__(
        self,
        url: str,
        timeout: float = ENGINE_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ):
        """``timeout``: seconds one generation may take, from sending it to its last byte;
        past it the call fails with 504 (:meth:`_failed`) and the engine is told to stop.
        ``connect_timeout``: seconds a new connection may take (within ``timeout``)."""
        if not timeout > 0:
            raise ValueError(f"the engine timeout must be a positive number of seconds: {timeout}")
        if not connect_timeout > 0:
            raise ValueError(
                f"the engine connect timeout must be a positive number of seconds: "
                f"{connect_timeout}"
            )
        self.url = url.rstrip("/")
        self.context_length = 0
        self._connect = min(connect_timeout, timeout)
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=self._connect)
        self._pool: EnginePool | None = None
        self._session: aiohttp.ClientSession | None = None  # capture mode's relay only
        self._background: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._pool = EnginePool(self.url, self._timeout.total or 0, self._connect, KEEPALIVE_S)
        try:
            await self.refresh()
        except EngineUnusable:
            raise
        except EngineError:
            pass  # not up yet: calls answer 503 until it is, and then pick up its settings

    async def refresh(self) -> None:  # pragma: no cover - every adapter overrides it
        raise NotImplementedError

    def logprob_warning(
        self, params: SamplingParams | None = None
    ) -> str | None:  # pragma: no cover - every adapter overrides it
        raise NotImplementedError

    async def close(self) -> None:
        """Let pending aborts reach the engine (briefly), then close the session."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=2)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @contextlib.asynccontextmanager
    async def post(self, path: str, body: bytes) -> AsyncIterator[Response]:
        """POST a JSON body (a generation); the response, released on exit."""
        resp = await self.pool.post(path, body)
        try:
            yield resp
        finally:
            resp.release()

    async def _generation(
        self,
        path: str,
        body: bytes,
        stream: bool,
        reader: GenerationReader,
        abort: Callable[[], Awaitable[object]] | None,
        refused: Callable[[int, bytes], None] | None = None,
    ) -> AsyncIterator[TokenBatch | Finish]:
        """The read loop every token-in adapter shares: POST ``body``, feed the whole answer
        (or each stream event) to ``reader``, yield its batches and its Finish. An error status
        goes to ``refused`` first (which may raise something else), then is raised as
        EngineError. A consumer that stops before the engine finished drops the connection and
        ``abort`` runs in the background."""
        resp: Response | None = None
        ended = False
        try:
            async with self.post(path, body) as resp:
                if resp.status != 200:
                    ended = True
                    raw = await resp.read()
                    if refused is not None:
                        refused(resp.status, raw)
                    raise self._error(path, resp.status, raw)
                if not stream or "event-stream" not in resp.headers.get("content-type", ""):
                    raw = await resp.read()
                    ended = True
                    reader.feed_whole(raw)
                    if events := reader.take():
                        yield events
                else:
                    async for events in fed_batches(
                        sse_batches(resp.content.iter_any()), reader.feed_event, reader.take
                    ):
                        yield events
                    ended = True
                yield reader.finish()
        except EngineError:
            ended = True
            raise
        except ENGINE_FAILURES as exc:
            raise self._failed(exc) from exc
        finally:
            if not ended:  # given up, timed out or failed: stop the engine's work too
                self._give_up(resp, abort)

    def _failed(self, exc: BaseException) -> EngineError:
        """A generation's transport failure as the harness's status: past the timeout a 504
        (the call is recorded as an error), any other failure a 502."""
        if timed_out(exc):
            return EngineError(
                f"{self.label} at {self.url} did not finish the call within "
                f"{self._timeout.total:g} s (the engine timeout, serve's --engine-timeout)",
                504,
            )
        return EngineError(f"{self.label} at {self.url} failed: {exc}", 502)

    async def _post_admin(self, path: str, body: object = None) -> str:
        status, raw = await self._request("POST", path, body, timeout=30)
        return f"{path}: {status} {error_message(raw) if status != 200 else 'ok'}"

    async def health(self) -> bool:
        try:
            status, _ = await self._request("GET", "/health", timeout=5)
        except EngineError:
            return False
        return status == 200

    @property
    def pool(self) -> EnginePool:
        if self._pool is None:
            raise EngineError(f"{self.label} adapter used before start()", 503)
        return self._pool

    @property
    def session(self) -> aiohttp.ClientSession:
        """An aiohttp session to the engine (capture mode relays the harness's requests on
        it), made on first use."""
        if self._pool is None:
            raise EngineError(f"{self.label} adapter used before start()", 503)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                # Engines close idle connections after 5 s (vLLM's and SGLang's uvicorn,
                # llama-server's httplib); reusing one they are closing fails the call.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
            )
        return self._session

    async def _request(
        self, method: str, path: str, body: object = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """One whole request; raises EngineError (503) only when the engine is unreachable."""
        raw = None if body is None else orjson.dumps(body)
        try:
            resp = await self.pool.request(method, path, raw, timeout)
            try:
                return resp.status, await resp.read()
            finally:
                resp.release()
        except ENGINE_FAILURES as exc:
            raise EngineError(f"{self.label} at {self.url} is unreachable: {exc}", 503) from exc

    async def _get_json(self, path: str, timeout: float | None = 30) -> dict | list | None:
        """GET a JSON document; None when the engine answers but has no such route."""
        status, raw = await self._request("GET", path, timeout=timeout)
        if status != 200:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    def _error(self, path: str, status: int, raw: bytes) -> EngineError:
        return EngineError(
            f"{self.label} {path} answered {status}: {error_message(raw)}", gateway_status(status)
        )

    def _in_background(self, make: Callable[[], Awaitable[object]]) -> None:
        """Run ``make()`` on the loop without waiting (used from a cancelled generator)."""

        async def run() -> None:
            with contextlib.suppress(Exception):
                await make()

        try:
            task = asyncio.get_running_loop().create_task(run())
        except RuntimeError:
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _give_up(
        self, resp: Response | None, abort: Callable[[], Awaitable[object]] | None
    ) -> None:
        """The consumer stopped before the engine finished: drop the connection (engines
        cancel on disconnect) and, where the engine has one, call its abort route too."""
        if resp is not None:
            resp.close()
        if abort is not None and self._pool is not None:
            self._in_background(abort)
