"""Chat Completions: parsed as strictly as the gateway's recording mode
needs (in full when Turnstile renders the prompt, only what it relies on when the engine does),
answered from the typed answer (``answer``), or with the engine's own (capture)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import ClassVar

import orjson

from ...answer import Answer, Relayed, Streamed
from ...errors import APIError
from ...request import ChatRequest
from ..base import NO_EDGE, Credential, Edge, Route, Routes, Served
from .answer import Chunks, completion
from .request import parse_capture_request, parse_chat_request


class ChatDialect:
    name = "chat"
    history_field: ClassVar[str] = "messages"
    prefixes: ClassVar[tuple[str, ...]] = ("/v1",)
    routes: ClassVar[Routes] = (
        Route("POST", "/chat/completions", "call", "Chat Completions", "ChatCompletionRequest"),
    )
    credentials: ClassVar[tuple[Credential, ...]] = ()
    schemas: ClassVar[Mapping[str, dict]] = {}

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        if self.gateway.renders_prompt:
            return parse_chat_request(body)
        return parse_capture_request(body)

    def keepalive(self, last: bytes) -> bytes:
        """A chunk of the same completion with empty content: the OpenAI SDKs yield it,
        so a harness's idle timer counts it (Qwen Code's ends a stream after 240 s without
        a chunk; SSE comments never reach it), and it adds nothing to the answer."""
        return keepalive_chunk(last)

    def reply(self, req: ChatRequest, answer: Answer | Relayed) -> dict:
        return answer.body if isinstance(answer, Relayed) else completion(answer)

    async def stream(self, req: ChatRequest, events: Streamed) -> AsyncIterator[bytes]:
        """``data:`` events ending in ``[DONE]``; an error is sent in-band, as OpenAI does."""
        chunks = Chunks(req.model or self.gateway.model_name, req.include_usage)
        try:
            async for event in events:
                for c in chunks(event):
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
