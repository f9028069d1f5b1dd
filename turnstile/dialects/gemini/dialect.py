"""The Gemini API dialect (``generateContent``): a request becomes the internal request
(``request``); the gateway's typed answer becomes a ``GenerateContentResponse``
(candidates with content parts, ``finishReason``, ``usageMetadata``), or its events a stream of
them as server-sent events (``:streamGenerateContent?alt=sse``: the model and the stream choice
live in the path, the key in ``x-goog-api-key`` or ``?key=``). Errors take Google's shape
(``{"error": {"code", "message", "status"}}``)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import orjson

from ...answer import (
    Answer,
    Done,
    ReasoningDelta,
    Relayed,
    Streamed,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    Usage,
)
from ...errors import APIError, ContextOverflow
from ...random_ids import new_id
from ...request import ChatRequest
from ..base import NO_EDGE, Credential, Edge, Route, Routes, Served
from ..chat.request import parse_chat_request
from .request import NAMES, bad, camel, chat_body

NAME = "gemini"

# Google's canonical status names, by HTTP status
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _model(edge: Edge) -> str | None:
    name = edge.params.get("model")
    return name.removeprefix("models/") if name else None


def parse(body: Any, edge: Edge) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad("body", "The request body must be a JSON object.")
    stream = bool(edge.stream)
    if stream and edge.query.get("alt") != "sse":
        raise bad(
            "alt",
            "streamGenerateContent is served as server-sent events only: add ?alt=sse (as the "
            "google-genai SDKs and gemini-cli do); the JSON-array stream is not supported.",
        )
    chat, inert, notes = chat_body(body, stream)
    try:
        req = parse_chat_request(chat)
    except APIError as exc:
        param = (exc.param or "").split(".")[0].split("[")[0]
        if param in NAMES:
            name = NAMES[param] + (exc.param or "")[len(param) :]
            raise APIError(
                400, exc.message.replace(param, NAMES[param], 1), name, "INVALID_ARGUMENT"
            ) from None
        raise
    req.model = _model(edge) or req.model
    req.raw, req.dialect, req.inert, req.notes = body, NAME, inert, notes
    req.call_id = new_id("call_")
    return req


def response_id(call_id: str) -> str:
    return call_id.removeprefix("call_")


def _signature(call_id: str) -> str:
    # Gemini signs a turn's first function call; Turnstile's is the call's id (any echo is
    # accepted, none is needed: the history is matched by its content)
    return base64.b64encode(("turnstile:" + call_id).encode()).decode()


def _args(arguments: str) -> dict:
    """A tool call's arguments as the ``args`` object (a call cut short by the token limit has
    no complete JSON: its args are empty, its text kept in the record)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _call_part(call: dict, call_id: str, first: bool) -> dict:
    fn = call.get("function") or {}
    part: dict = {
        "functionCall": {
            "id": call.get("id"),
            "name": fn.get("name", ""),
            "args": _args(fn.get("arguments") or ""),
        }
    }
    if first:
        part["thoughtSignature"] = _signature(call_id)
    return part


def _thoughts_wanted(req: ChatRequest) -> bool:
    gen = camel(camel(req.raw).get("generationConfig"))
    thinking = camel(gen.get("thinkingConfig")) if isinstance(gen, dict) else None
    return isinstance(thinking, dict) and thinking.get("includeThoughts") is True


def parts(message: dict, call_id: str, thoughts: bool) -> list[dict]:
    """A recorded assistant message as content parts: thought, text, functionCall."""
    out: list[dict] = []
    if thoughts and message.get("reasoning_content"):
        out.append({"text": message["reasoning_content"], "thought": True})
    if message.get("content"):
        out.append({"text": message["content"]})
    for k, c in enumerate(message.get("tool_calls") or []):
        out.append(_call_part(c, call_id, k == 0))
    return out


def finish_reason(answer: Answer) -> str:
    return "MAX_TOKENS" if answer.cut_by_length else "STOP"


def usage(u: Usage) -> dict:
    out = {
        "promptTokenCount": u.prompt_tokens,
        "candidatesTokenCount": u.completion_tokens,
        "totalTokenCount": u.prompt_tokens + u.completion_tokens,
    }
    cached = u.cached_tokens or 0
    if cached:
        out["cachedContentTokenCount"] = cached
    return out


def error_body(exc: APIError) -> dict:
    status = _STATUS.get(exc.status, "INTERNAL" if exc.status >= 500 else "INVALID_ARGUMENT")
    message = exc.message
    if isinstance(exc, ContextOverflow):
        # Google's own words for a prompt over the model's input limit
        message = (
            f"The input token count ({exc.prompt_tokens}) exceeds the maximum number of "
            f"tokens allowed ({exc.context_length})."
        )
    return {"error": {"code": exc.status, "message": message, "status": status}}


def _sse(data: dict) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\r\n\r\n"


class GeminiDialect:
    name = NAME
    history_field: ClassVar[str] = "contents"
    # the Gemini API's two versions: gemini-cli (@google/genai) calls v1beta, google-genai 3
    # (Python) v1
    prefixes: ClassVar[tuple[str, ...]] = ("/v1beta", "/v1")
    routes: ClassVar[Routes] = (
        Route(
            "POST",
            "/models/{model}:generateContent",
            "call",
            "Gemini generateContent",
            "GenerateContentRequest",
            stream=False,
        ),
        Route(
            "POST",
            "/models/{model}:streamGenerateContent",
            "call",
            "Gemini streamGenerateContent (server-sent events: ?alt=sse)",
            "GenerateContentRequest",
            stream=True,
        ),
        Route(
            "POST",
            "/models/{model}:countTokens",
            "count_tokens",
            "The prompt tokens a Gemini request would send now",
            "CountTokensRequest",
        ),
        # (under /v1 that path is OpenAI's model list)
        Route(
            "GET",
            "/models",
            "models",
            "The model list, as the Gemini API lists models",
            prefixes=("/v1beta",),
        ),
        Route("GET", "/models/{model}", "model", "The model, as the Gemini API describes one"),
    )
    credentials: ClassVar[tuple[Credential, ...]] = (("header", "x-goog-api-key"), ("query", "key"))
    schemas: ClassVar[Mapping[str, dict]] = {}  # set below

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        return parse(body, edge)

    def count_request(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        """``countTokens`` takes ``contents`` (and the rest of a request) at the top, or a whole
        request as ``generateContentRequest``."""
        body = camel(body)
        if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
            body = body["generateContentRequest"]
        return parse(body, Edge(edge.params, edge.query, False))

    def counted(self, tokens: int) -> dict:
        return {"totalTokens": tokens}

    def model_list(self, name: str, context_length: int | None) -> dict:
        return {"models": [self._model(name, context_length)]}

    def model(self, name: str, context_length: int | None, asked: str) -> dict:
        return self._model(name, context_length)

    @staticmethod
    def _model(name: str, context_length: int | None) -> dict:
        return {
            "name": f"models/{name}",
            "displayName": name,
            "inputTokenLimit": context_length,
            "supportedGenerationMethods": ["generateContent", "countTokens"],
        }

    def reply(self, req: ChatRequest, answer: Answer | Relayed) -> dict:
        assert isinstance(answer, Answer)  # token-in's (capture serves Chat only)
        return {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": parts(answer.message, answer.call_id, _thoughts_wanted(req)),
                    },
                    "finishReason": finish_reason(answer),
                    "index": 0,
                }
            ],
            "usageMetadata": usage(answer.usage),
            "modelVersion": req.model or self.gateway.model_name,
            "responseId": response_id(answer.call_id),
        }

    def keepalive(self, last: bytes) -> bytes:
        """A response with an empty model turn (``_EMPTY``): @google/genai (gemini-cli's SDK)
        parses only a buffer that starts with a ``data:`` event, so an SSE comment would leave
        every later event unparsed; gemini-cli counts an empty model turn as valid and adds
        nothing from it."""
        return _EMPTY

    def error(self, exc: APIError) -> dict:
        return error_body(exc)

    async def stream(self, req: ChatRequest, events: Streamed) -> AsyncIterator[bytes]:
        assert req.call_id is not None
        head = {
            "modelVersion": req.model or self.gateway.model_name,
            "responseId": response_id(req.call_id),
        }
        thoughts = _thoughts_wanted(req)
        # at once, before the prefill is over: keep-alives follow only a part already sent
        yield _EMPTY
        calls: dict[int, dict] = {}  # by index: a call's id, name and arguments so far
        answer: Answer | None = None
        try:
            async for ev in events:
                part: dict | None = None
                if isinstance(ev, ReasoningDelta) and thoughts and ev.text:
                    part = {"text": ev.text, "thought": True}
                elif isinstance(ev, TextDelta) and ev.text:
                    part = {"text": ev.text}
                elif isinstance(ev, ToolCallStart):
                    fn = {"name": ev.name, "arguments": ev.arguments}
                    calls[ev.index] = {"function": fn, "id": ev.id}
                elif isinstance(ev, ToolArgumentsDelta):
                    held = calls.setdefault(ev.index, {"function": {"name": "", "arguments": ""}})
                    held["function"]["arguments"] += ev.text
                elif isinstance(ev, Done):
                    answer = ev.answer
                if part is not None:
                    content = {"role": "model", "parts": [part]}
                    yield _sse({"candidates": [{"content": content, "index": 0}], **head})
        except APIError as exc:
            yield _sse(error_body(exc))
            return
        if answer is None:  # the stream was ended unrecorded (cannot happen when ok)
            return
        # a function call is one part, whole (Gemini never streams its arguments)
        tail = [_call_part(calls[k], answer.call_id, n == 0) for n, k in enumerate(sorted(calls))]
        yield _sse(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": tail},
                        "finishReason": finish_reason(answer),
                        "index": 0,
                    }
                ],
                "usageMetadata": usage(answer.usage),
                **head,
            }
        )


_EMPTY = _sse({"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}]})
_OBJ = {"type": "object"}
_CONTENTS = {"type": "array", "items": _OBJ}
GeminiDialect.schemas = {
    "GenerateContentRequest": {
        "type": "object",
        "required": ["contents"],
        "properties": {
            "contents": _CONTENTS,
            "systemInstruction": _OBJ,
            "tools": {"type": "array", "items": _OBJ},
            "toolConfig": _OBJ,
            "generationConfig": _OBJ,
            "safetySettings": {"type": "array", "items": _OBJ},
        },
    },
    "CountTokensRequest": {
        "type": "object",
        "properties": {"contents": _CONTENTS, "generateContentRequest": _OBJ},
    },
}
