"""Requests to one engine: a pool of keep-alive HTTP/1.1 connections on asyncio, the answers
parsed by httptools (the parser uvicorn serves with).

A generation is the hot path and needs little of a general client: one host, a JSON body,
the answer read whole or as a stream, the connection dropped when the caller gives up
(engines abort on it). aiohttp's client (now only capture mode's, which relays the harness's
own requests) spent ~0.2 ms of CPU more per call on its request and response machinery:
1.42 -> 1.25x the floor per call at concurrency 32, 1.25 -> 1.12x streamed
(benchmarks/README.md, round 12). The adapters' control requests (health, version, pause,
aborts) use the same pool."""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # bytes of a stream buffered unread before the socket is paused


class EngineUnreachable(ConnectionError):
    """No connection could be made (refused, unresolvable, or past the connect timeout)."""


class ConnectionDropped(ConnectionError):
    """The connection ended (or the engine sent something that is not HTTP) before the
    answer was complete."""


class Response:
    """An engine's answer: its status and headers (names in lower case) once they arrived, the
    body read whole (:meth:`read`) or as it comes (``content.iter_any()``)."""

    def __init__(self, conn: _Connection, timer: asyncio.TimerHandle) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content = self
        self._conn: _Connection | None = conn
        self._timer = timer
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> bytes:
        """The whole body (read on past the high-water mark: nothing else would resume it,
        and a whole answer with routed experts or top-k logprobs runs to megabytes)."""
        while not self._eof:
            if self._conn is not None:
                self._conn.resume()
            await self._wait()
        return b"".join(self._buf)

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body as it arrives: everything received since the last piece, joined."""
        while True:
            if self._buf:
                chunk = b"".join(self._buf)
                self._buf.clear()
                self._buffered = 0
                if self._conn is not None:
                    self._conn.resume()
                yield chunk
            elif self._eof:
                return
            else:
                await self._wait()

    def release(self) -> None:
        """Done with the answer: an unfinished one drops its connection."""
        self.close()

    def close(self) -> None:
        self._timer.cancel()
        conn, self._conn = self._conn, None
        if conn is not None and not self._eof:
            conn.drop()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None and not self._buf:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # called by the connection

    def _started(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        if not self._head.done():
            self._head.set_result(None)

    def _body(self, data: bytes) -> int:
        self._buf.append(data)
        self._buffered += len(data)
        self._wake()
        return self._buffered

    def _ended(self) -> None:
        self._eof = True
        self._timer.cancel()
        self._conn = None
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._eof:
            return
        self._error = error
        self._timer.cancel()
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: post() may have stopped waiting already
        self._wake()


class _Connection(asyncio.Protocol):
    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self._headers: dict[str, str] = {}
        self._name = ""

    # asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._lost(ConnectionDropped(f"the engine sent something that is not HTTP: {exc}"))
            self.drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.gone(self)
        r = self.response
        if r is not None and r._head.done() and exc is None and _ends_at_close(r.headers):
            self.on_message_complete()  # a body without a length ends with the connection
            return
        why = f": {exc}" if exc else ""
        self._lost(ConnectionDropped(f"the engine closed the connection{why}"))

    # httptools

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response._started(self.parser.get_status_code(), self._headers)
        self._headers = {}

    def on_body(self, body: bytes) -> None:
        if self.response is not None and self.response._body(body) > HIGH_WATER:
            if not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        response, self.response = self.response, None
        keep = self.parser.should_keep_alive()
        if response is not None:
            response._ended()
        self.resume()
        if keep and not self.closed:
            self.pool.idle(self)
        else:
            self.drop()

    # the pool and the response

    def send(self, head: bytes, body: bytes, response: Response) -> None:
        assert self.transport is not None
        self.response = response
        self.transport.write(head)
        self.transport.write(body)

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def drop(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()  # no FIN handshake: the engine sees the reset at once

    def _lost(self, error: BaseException) -> None:
        response, self.response = self.response, None
        if response is not None:
            response._fail(error)


def _ends_at_close(headers: dict[str, str]) -> bool:
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")


class EnginePool:
    """Keep-alive connections to the engine at ``url`` (http or https). A connection idle for
    ``keepalive_s`` is not reused (engines close theirs after 5 s; a request sent on one they
    are closing fails before any answer)."""

    def __init__(
        self, url: str, timeout: float, connect_timeout: float, keepalive_s: float
    ) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "localhost"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        default_port = self.port == (443 if self.tls else 80)
        self._host_header = self.host if default_port else f"{self.host}:{self.port}"
        self._idle: collections.deque[tuple[_Connection, float]] = collections.deque()
        self._all: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None

    async def post(self, path: str, body: bytes) -> Response:
        """POST ``body`` (JSON) to ``path``: :meth:`request`."""
        return await self.request("POST", path, body)

    async def request(
        self, method: str, path: str, body: bytes | None = None, timeout: float | None = None
    ) -> Response:
        """``method`` on ``path`` (``body``: JSON); the response once its status and headers
        came. The whole call (connecting, headers and body) must end within ``timeout``
        (default: the pool's): past it the response fails with TimeoutError and its
        connection is dropped. A connection that ends before any answer (a kept-alive one the
        engine closed just as the request went out) is tried once more on a fresh one.
        Raises :class:`EngineUnreachable` or :class:`ConnectionDropped`."""
        for attempt in (1, 2):
            try:
                return await self._send(method, path, body, timeout or self.timeout)
            except ConnectionDropped:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _send(self, method: str, path: str, body: bytes | None, timeout: float) -> Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = self._reused() or await self._connect(min(self.connect_timeout, timeout))
        timer = loop.call_at(deadline, self._expired, conn, timeout)
        response = Response(conn, timer)
        kind = "Content-Type: application/json\r\n" if body is not None else ""
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"{kind}Content-Length: {len(body or b'')}\r\n\r\n"
        ).encode("latin-1")
        conn.send(head, body or b"", response)
        try:
            await response._head
        except BaseException:
            response.close()
            raise
        return response

    def close(self) -> None:
        """Drop every connection (idle or in use)."""
        for conn in list(self._all):
            conn.drop()
        self._idle.clear()

    # connections

    def _reused(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn, since = self._idle.pop()
            if not conn.closed and now - since < self.keepalive_s:
                return conn
            conn.drop()
        return None

    async def _connect(self, within: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError as exc:
            raise EngineUnreachable(
                f"no connection to {self.host}:{self.port} within {within:g} s"
            ) from exc
        except OSError as exc:
            raise EngineUnreachable(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self._all.add(conn)
        return conn

    def idle(self, conn: _Connection) -> None:
        now = time.monotonic()
        while self._idle and (
            self._idle[0][0].closed or now - self._idle[0][1] >= self.keepalive_s
        ):
            self._idle.popleft()[0].drop()
        self._idle.append((conn, now))

    def gone(self, conn: _Connection) -> None:
        self._all.discard(conn)

    def _expired(self, conn: _Connection, timeout: float) -> None:
        response = conn.response
        if response is not None:
            response._fail(TimeoutError(f"the engine call ran past {timeout:g} s"))
        conn.drop()
