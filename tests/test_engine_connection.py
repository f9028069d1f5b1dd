"""The adapters' connection pool (``engines.connection.EnginePool``) against real HTTP
servers: what the server received is what was posted, and what it sent (whole, chunked in
pieces of any size, or ended by closing) is what the caller reads, call after call on
kept-alive connections; plus its failures: a refused port, an answer past the timeout, a
connection dropped under a call, something that is not HTTP, an answer abandoned half-read
(the server sees it go)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.engines.connection import ConnectionDropped, EnginePool, EngineUnreachable

pytestmark = pytest.mark.integration

ANSWER = st.tuples(
    st.sampled_from([200, 400, 404, 503]),
    st.binary(max_size=3000),
    st.none() | st.lists(st.integers(1, 700), min_size=1, max_size=6),  # chunk sizes
)


class Recorder:
    """An aiohttp web server that notes each request (path, content type, body, connection)
    and answers the next planned (status, body, chunking)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes, int]] = []
        self.plan: list[tuple[int, bytes, list[int] | None]] = []
        self.gone = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        transport = request.transport
        self.seen.append((request.path, request.content_type, body, id(transport)))
        if request.path == "/slow":
            try:
                await asyncio.sleep(5)
            finally:
                self.gone.set()
        status, payload, chunks = self.plan.pop(0)
        if chunks is None:
            return web.Response(status=status, body=payload, content_type="application/json")
        resp = web.StreamResponse(status=status)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        at = 0
        for n in chunks:
            await resp.write(payload[at : at + n])
            at += n
        await resp.write(payload[at:])
        await resp.write_eof()
        return resp


async def _server(recorder: Recorder) -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client gone cancels
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(
        st.tuples(st.binary(max_size=200_000), ANSWER, st.booleans()), min_size=1, max_size=5
    )
)
def test_what_is_posted_arrives_and_what_is_answered_is_read(calls: list) -> None:
    async def go() -> None:
        rec = Recorder()
        runner, url = await _server(rec)
        pool = EnginePool(url + "/base", timeout=30, connect_timeout=5, keepalive_s=30)
        try:
            for n, (body, (status, payload, chunks), streamed) in enumerate(calls):
                rec.plan.append((status, payload, chunks))
                resp = await pool.post(f"/gen/{n}", body)
                if streamed:
                    got = b"".join([c async for c in resp.content.iter_any()])
                else:
                    got = await resp.read()
                resp.release()
                assert (resp.status, got) == (status, payload)
                path, ctype, received, _ = rec.seen[n]
                assert (path, ctype, received) == (f"/base/gen/{n}", "application/json", body)
        finally:
            pool.close()
            await runner.cleanup()
        assert len({conn for *_, conn in rec.seen}) == 1  # one kept-alive connection

    asyncio.run(go())


def test_a_refused_port_is_unreachable() -> None:
    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        pool = EnginePool(f"http://127.0.0.1:{port}", 5, 1, 2)
        with pytest.raises(EngineUnreachable):
            await pool.post("/x", b"{}")

    asyncio.run(go())


def test_past_the_timeout_the_call_fails_and_the_engine_sees_it_go() -> None:
    async def go() -> None:
        rec = Recorder()
        runner, url = await _server(rec)
        pool = EnginePool(url, timeout=0.3, connect_timeout=1, keepalive_s=30)
        try:
            rec.plan.append((200, b"late", None))
            with pytest.raises(TimeoutError):
                await pool.post("/slow", b"{}")
            await asyncio.wait_for(rec.gone.wait(), 3)  # the handler was cancelled
        finally:
            pool.close()
            await runner.cleanup()

    asyncio.run(go())


async def _raw_server(answer: bytes, close: bool) -> tuple[asyncio.Server, str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        if close:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    "answer, close, expect",
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end", True, b"to the end"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut", True, ConnectionDropped),
        (b"SMTP ready\r\n\r\n", False, ConnectionDropped),
        (b"", True, ConnectionDropped),
    ],
    ids=["ended-by-close", "cut-short", "not-http", "closed-unanswered"],
)
def test_bodies_ended_by_close_and_broken_answers(
    answer: bytes, close: bool, expect: bytes | type
) -> None:
    async def go() -> None:
        server, url = await _raw_server(answer, close)
        pool = EnginePool(url, 5, 1, 2)
        try:
            if isinstance(expect, bytes):
                resp = await pool.post("/x", b"{}")
                assert await resp.read() == expect
            else:
                with pytest.raises(expect):
                    resp = await pool.post("/x", b"{}")
                    await resp.read()
        finally:
            pool.close()
            server.close()

    asyncio.run(go())


def test_an_answer_abandoned_half_read_drops_its_connection() -> None:
    """The engine sees the caller go (that is how engines abort a generation), and the next
    call gets a fresh connection."""

    async def go() -> None:
        closed = asyncio.Event()
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            if await reader.read(1) == b"":
                closed.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        pool = EnginePool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", 5, 1, 30)
        try:
            resp = await pool.post("/x", b"{}")
            assert await resp.content.iter_any().__anext__() == b"abc"
            resp.release()
            await asyncio.wait_for(closed.wait(), 3)
            second = await pool.post("/x", b"{}")
            second.release()
            assert connections == 2
        finally:
            pool.close()
            server.close()

    asyncio.run(go())


def test_a_connection_idle_past_keepalive_is_not_reused() -> None:
    async def go() -> None:
        rec = Recorder()
        runner, url = await _server(rec)
        pool = EnginePool(url, timeout=5, connect_timeout=1, keepalive_s=0.2)
        try:
            for wait in (0, 0, 0.4):
                await asyncio.sleep(wait)
                rec.plan.append((200, b"{}", None))
                resp = await pool.post("/x", b"{}")
                await resp.read()
        finally:
            pool.close()
            await runner.cleanup()
        conns = [conn for *_, conn in rec.seen]
        assert conns[0] == conns[1] != conns[2]

    asyncio.run(go())


def test_a_stream_bigger_than_the_buffer_pauses_and_resumes_the_socket() -> None:
    """Read slowly, a 3 MiB answer is buffered up to its limit, then the socket is paused until
    the reader catches up; every byte arrives, in order."""

    async def go() -> None:
        rec = Recorder()
        runner, url = await _server(rec)
        pool = EnginePool(url, timeout=30, connect_timeout=1, keepalive_s=30)
        payload = bytes(range(256)) * (3 * 4096)
        try:
            rec.plan.append((200, payload, [65536] * 40))
            resp = await pool.post("/x", b"{}")
            got = []
            async for chunk in resp.content.iter_any():
                got.append(chunk)
                await asyncio.sleep(0.05)  # the server writes far faster
            assert b"".join(got) == payload
            assert max(map(len, got)) <= 2 << 20  # held back near the high-water mark
        finally:
            pool.close()
            await runner.cleanup()

    asyncio.run(go())
