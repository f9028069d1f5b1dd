"""The Anthropic Messages dialect: a request becomes the internal request
(``request``); the gateway's typed answer becomes a ``message`` with content blocks, or
its events the event sequence ``message_start`` → (``content_block_start`` → deltas →
``content_block_stop``)* → ``message_delta`` → ``message_stop``. Errors take Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import orjson

from ...answer import (
    Answer,
    Done,
    Event,
    ReasoningDelta,
    Relayed,
    Streamed,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from ...errors import APIError, ContextOverflow
from ...random_ids import new_id
from ...request import ChatRequest
from ..base import NO_EDGE, Credential, Edge, Route, Routes, Served
from ..chat.request import parse_chat_request
from .request import chat_body, check_fields

NAME = "messages"

# Anthropic's error types by status
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def parse(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise APIError(
            400, "The request body must be a JSON object.", None, code="invalid_request_error"
        )
    inert = check_fields(body)
    try:
        chat, notes = chat_body(body)
        req = parse_chat_request(chat)
    except APIError as exc:
        names = {
            "stop": "stop_sequences",
            "max_completion_tokens": "max_tokens",
            "reasoning_effort": "output_config.effort",
            "response_format": "output_config.format",
        }
        param = exc.param or ""
        if param in names:
            raise APIError(
                400, exc.message.replace(param, names[param]), names[param], exc.code
            ) from None
        raise
    req.raw, req.dialect, req.inert, req.notes = body, NAME, inert, notes
    req.call_id = new_id("call_")
    return req


def message_id(call_id: str) -> str:
    return "msg_" + call_id.removeprefix("call_")


def _signature(rec_id: str) -> str:
    # Anthropic signs thinking blocks; Turnstile's is the call's id (any echo is accepted)
    return "turnstile:" + rec_id


def blocks(message: dict, call_id: str) -> list[dict]:
    """A recorded assistant message as content blocks: thinking, text, tool_use."""
    out: list[dict] = []
    if message.get("reasoning_content") is not None:
        out.append(
            {
                "type": "thinking",
                "thinking": message["reasoning_content"],
                "signature": _signature(call_id),
            }
        )
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    for c in message.get("tool_calls") or []:
        out.append(
            {
                "type": "tool_use",
                "id": c["id"],
                "name": c["function"]["name"],
                "input": _input(c["function"]["arguments"]),
            }
        )
    return out


def _input(arguments: str) -> dict:
    """A tool call's arguments as the ``input`` object (a call cut short by the token limit
    has no complete JSON: its input is empty, its text kept in the record)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(answer: Answer) -> tuple[str, str | None]:
    if answer.cut_by_length:
        return "max_tokens", None
    if answer.message.get("tool_calls"):
        return "tool_use", None
    stop = answer.stop_string
    return ("stop_sequence", stop) if stop else ("end_turn", None)


def usage(u: Usage) -> dict:
    cached = u.cached_tokens or 0
    return {
        "input_tokens": u.prompt_tokens - cached,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message(req: ChatRequest, answer: Answer | Relayed, model: str) -> dict:
    assert isinstance(answer, Answer)  # token-in's (capture serves Chat only)
    reason, seq = stop_reason(answer)
    return {
        "id": message_id(answer.call_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks(answer.message, answer.call_id),
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(answer.usage),
    }


def error_body(exc: APIError) -> dict:
    kind = _ERROR_TYPES.get(
        exc.status, "api_error" if exc.status >= 500 else "invalid_request_error"
    )
    message = exc.message
    if isinstance(exc, ContextOverflow):
        # Anthropic's words, which Claude Code reads the two counts out of to compact
        message = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.context_length} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}


def _sse(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class MessagesDialect:
    name = NAME
    history_field: ClassVar[str] = "messages"
    prefixes: ClassVar[tuple[str, ...]] = ("/v1",)
    routes: ClassVar[Routes] = (
        Route("POST", "/messages", "call", "Anthropic Messages", "MessagesRequest"),
        Route(
            "POST",
            "/messages/count_tokens",
            "count_tokens",
            "The prompt tokens a Messages request would send now",
            "MessagesRequest",
        ),
    )
    credentials: ClassVar[tuple[Credential, ...]] = ()
    schemas: ClassVar[Mapping[str, dict]] = {}

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        return parse(body)

    def count_request(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        """``count_tokens`` takes no ``max_tokens``: nothing is sampled."""
        return parse({"max_tokens": 1, **body} if isinstance(body, dict) else body)

    def counted(self, tokens: int) -> dict:
        return {"input_tokens": tokens}

    def reply(self, req: ChatRequest, answer: Answer | Relayed) -> dict:
        return message(req, answer, req.model or self.gateway.model_name)

    def keepalive(self, last: bytes) -> bytes:
        """Anthropic's own ``ping`` event, as its API sends it."""
        return b'event: ping\ndata: {"type": "ping"}\n\n'

    def error(self, exc: APIError) -> dict:
        return error_body(exc)

    async def stream(self, req: ChatRequest, events: Streamed) -> AsyncIterator[bytes]:
        model = req.model or self.gateway.model_name
        assert req.call_id is not None
        start: dict = {
            "id": message_id(req.call_id),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        yield _sse("message_start", {"message": start})
        blocks = _Blocks(req.call_id)
        answer: Answer | None = None
        try:
            async for event in events:
                if isinstance(event, Done):
                    answer = event.answer
                for kind, data in blocks.event(event):
                    yield _sse(kind, data)
        except APIError as exc:
            yield _sse("error", {"error": error_body(exc)["error"]})
            return
        for kind, data in blocks.close():
            yield _sse(kind, data)
        if answer is None:  # the stream was ended unrecorded (cannot happen when ok)
            return
        reason, seq = stop_reason(answer)
        yield _sse(
            "message_delta",
            {"delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage(answer.usage)},
        )
        yield _sse("message_stop", {})


class _Blocks:
    """Content blocks opened and closed as the answer's events change kind."""

    def __init__(self, call_id: str):
        self.call_id = call_id
        self.index = -1
        self.kind: str | None = None

    def _open(self, block: dict) -> list[tuple[str, dict]]:
        out = self.close()
        self.index += 1
        self.kind = block["type"]
        return [*out, ("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[tuple[str, dict]]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(
                (
                    "content_block_delta",
                    {
                        "index": self.index,
                        "delta": {"type": "signature_delta", "signature": _signature(self.call_id)},
                    },
                )
            )
        self.kind = None
        return [*out, ("content_block_stop", {"index": self.index})]

    def event(self, ev: Event) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if isinstance(ev, ReasoningDelta) and ev.text:
            if self.kind != "thinking":
                out += self._open({"type": "thinking", "thinking": "", "signature": ""})
            out.append(
                (
                    "content_block_delta",
                    {
                        "index": self.index,
                        "delta": {"type": "thinking_delta", "thinking": ev.text},
                    },
                )
            )
        elif isinstance(ev, TextDelta) and ev.text:
            if self.kind != "text":
                out += self._open({"type": "text", "text": ""})
            out.append(
                (
                    "content_block_delta",
                    {"index": self.index, "delta": {"type": "text_delta", "text": ev.text}},
                )
            )
        elif isinstance(ev, ToolCallStart):
            out += self._open({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
            out += self._arguments(ev.arguments)
        elif isinstance(ev, ToolArgumentsDelta):
            out += self._arguments(ev.text)
        elif isinstance(ev, ToolCallEnd) and self.kind == "tool_use":
            out += self.close()  # its content_block_stop now, as Anthropic's stream does
        return out

    def _arguments(self, text: str) -> list[tuple[str, dict]]:
        if not text or self.kind != "tool_use":
            return []
        delta = {"type": "input_json_delta", "partial_json": text}
        return [("content_block_delta", {"index": self.index, "delta": delta})]
