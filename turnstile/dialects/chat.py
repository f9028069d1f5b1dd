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
    history_field: ClassVar[str] = "messages"
    routes: ClassVar[Routes] = (("POST", "/chat/completions", "call"),)

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str) -> ChatRequest:
        return self.gateway.parse_request(body)

    def keepalive(self, last: bytes) -> bytes:
        """A chunk of the same completion with empty content: the OpenAI SDKs yield it,
        so a harness's idle timer counts it (Qwen Code's ends a stream after 240 s without
        a chunk; SSE comments never reach it), and it adds nothing to the answer."""
        return keepalive_chunk(last)

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


_COMMENT = b": keep-alive\n\n"


def keepalive_chunk(last: bytes) -> bytes:
    """``last``'s completion (its id, created, model) with an empty content delta; an SSE
    comment when ``last`` is not a chunk (nothing sent yet)."""
    head = last.rsplit(b"data: ", 1)[-1]
    try:
        chunk = orjson.loads(head)
    except orjson.JSONDecodeError:
        return _COMMENT
    if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
        return _COMMENT
    out = {
        "id": chunk.get("id"),
        "object": "chat.completion.chunk",
        "created": chunk.get("created"),
        "model": chunk.get("model"),
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}],
    }
    if "usage" in chunk:
        out["usage"] = None
    return b"data: " + orjson.dumps(out) + b"\n\n"
