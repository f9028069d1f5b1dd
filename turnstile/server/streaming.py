"""The Server-Sent Events response of a streamed completion, and the watch that notices a
non-streaming harness going away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .admission import Chunks


class EventStream(StreamingResponse):
    """``text/event-stream`` of ``body`` (bytes), closing ``source`` (the gateway's chunks)
    however the response ends: finished, failed, cancelled by a disconnect, or never started
    because the client was gone first. That close ends the call's in-flight count.

    uvicorn drops a send to a closed connection without a word, so a gone client is watched
    for: one task waits for ``http.disconnect`` and cancels the sending. (Starlette's own
    watch opens an anyio task group per response: ~70 us more per call, measured.)"""

    def __init__(self, body: AsyncIterator[bytes], source: Chunks):
        super().__init__(
            body, media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )
        self._source = source

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sending = asyncio.current_task()
        assert sending is not None
        left = False

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            sending.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left:
                raise
            sending.uncancel()  # the client left: the response is over, not the server
        finally:
            watcher.cancel()
            await self._source.aclose()


def disconnect_watch(request: Request) -> Callable[[], Any]:
    """A coroutine function that returns once the client has gone (its body already read)."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return watch
