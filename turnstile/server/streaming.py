"""The Server-Sent Events response of a streamed completion, and the watch that notices a
non-streaming harness going away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..answer import Event
from ..errors import APIError
from ..gateway.admission import Chunks
from .error_log import note_error


class Noted:
    """The gateway's events as a dialect reads them: an error that reaches the harness
    in-band, after the 200, is noted for the request's log line (``error_log``)."""

    def __init__(self, chunks: Chunks):
        self._chunks = chunks

    def __aiter__(self) -> Noted:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._chunks.__anext__()
        except APIError as exc:
            note_error(exc)
            raise

    async def aclose(self) -> None:
        await self._chunks.aclose()


class EventStream(StreamingResponse):
    """``text/event-stream`` of ``body`` (bytes), closing ``source`` (the gateway's chunks)
    however the response ends: finished, failed, cancelled by a disconnect, or never started
    because the client was gone first. That close ends the call's in-flight count.

    uvicorn drops a send to a closed connection without a word, so a gone client is watched
    for: one task waits for ``http.disconnect`` and cancels the sending. (Starlette's own
    watch opens an anyio task group per response: ~70 us more per call, measured.)

    While nothing has been sent for ``interval`` seconds (a long prefill, a paused engine),
    the same task sends ``keepalive`` (the dialect's: an SSE comment, Anthropic's ``ping``), so
    a harness that ends a silent stream after a few minutes (Claude Code: 300 s) does not
    leave and retry a call that is still running."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        source: Noted,
        keepalive: Callable[[bytes], bytes] = lambda last: b": keep-alive\n\n",
        interval: float | None = None,
    ):
        super().__init__(
            body, media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )
        self._source = source
        self._keepalive = keepalive
        self._interval = interval

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sending = asyncio.current_task()
        assert sending is not None
        loop = asyncio.get_running_loop()
        left = False
        last = 0.0  # when the last body part was sent (0: headers not sent yet)
        sent = b""  # the last body part the stream itself sent
        lock = asyncio.Lock()

        async def send_part(message: Any) -> None:
            nonlocal last, sent
            async with lock:
                await send(message)
                last = loop.time() if message.get("more_body") else 0.0
                if message.get("body"):
                    sent = message["body"]

        async def keep_alive(interval: float) -> None:
            nonlocal last
            while True:
                wait = interval if not last else last + interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif last:
                    async with lock:
                        body = self._keepalive(sent)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                        last = loop.time()
                else:
                    await asyncio.sleep(interval)

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            sending.cancel()

        watcher = asyncio.ensure_future(watch())
        pinger = asyncio.ensure_future(keep_alive(self._interval)) if self._interval else None
        try:
            await self.stream_response(send_part if pinger else send)
        except asyncio.CancelledError:
            if not left:
                raise
            sending.uncancel()  # the client left: the response is over, not the server
        finally:
            watcher.cancel()
            if pinger is not None:
                pinger.cancel()
            await self._source.aclose()


def disconnect_watch(request: Request) -> Callable[[], Any]:
    """A coroutine function that returns once the client has gone (its body already read)."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return watch
