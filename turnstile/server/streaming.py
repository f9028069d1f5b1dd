"""The Server-Sent Events response of a streamed completion, and the watch that notices a
non-streaming harness going away."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .admission import Chunks


class EventStream(StreamingResponse):
    """``text/event-stream`` of ``body`` (bytes), closing ``source`` (the gateway's chunks)
    however the response ends: finished, failed, cancelled by a disconnect, or never started
    because the client was gone first. That close ends the call's in-flight count."""

    def __init__(self, body: AsyncIterator[bytes], source: Chunks):
        super().__init__(
            body, media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )
        self._source = source

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()


def disconnect_watch(request: Request) -> Callable[[], Any]:
    """A coroutine function that returns once the client has gone (its body already read)."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    return watch
