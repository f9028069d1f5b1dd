"""Chat Completions, the internal shape: parsed by the gateway (each recording mode validates
as strictly as it needs), answered as is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import orjson

from ..errors import APIError
from ..request import Answer, ChatRequest, Streamed
from .base import Routes, Served


class ChatDialect:
    name = "chat"
    keepalive = b": keep-alive\n\n"
    history_field: ClassVar[str] = "messages"
    routes: ClassVar[Routes] = (("POST", "/chat/completions", "call"),)

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str) -> ChatRequest:
        return self.gateway.parse_request(body)

    def reply(self, req: ChatRequest, answer: Answer) -> dict:
        return answer.body

    async def stream(self, req: ChatRequest, chunks: Streamed) -> AsyncIterator[bytes]:
        """``data:`` events ending in ``[DONE]``; an error is sent in-band, as OpenAI does."""
        try:
            async for c in chunks:
                yield b"data: " + orjson.dumps(c) + b"\n\n"
        except APIError as exc:
            yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
        yield b"data: [DONE]\n\n"

    def error(self, exc: APIError) -> dict:
        return exc.body()
