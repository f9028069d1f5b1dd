"""The OpenAI Responses dialect: a request becomes the internal request (``request``),
the gateway's typed answer becomes a ``response`` object, or its events the typed event
sequence (``response.created`` … ``response.completed``).

A response's id is its call's, so ``previous_response_id`` and ``GET /v1/responses/{id}`` find
the call in the session's records; the chain itself (which input items each call added) is kept
in the call's record, so it survives a restart.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import orjson

from ...answer import Answer, CallReader, RecordedCall, Relayed, Streamed, Usage
from ...errors import APIError, ContextOverflow
from ...random_ids import new_id
from ...request import ChatRequest
from ..base import NO_EDGE, Credential, Edge, Route, Routes, Served
from ..chat.request import parse_chat_request
from ..images import by_reference, by_value
from .items import Ended, call_id, output_items, response_id, response_object
from .request import bad, chat_body, check_fields, input_messages, namespaces
from .stream import ResponseEvents

NAME = "responses"


class Chains:
    """The messages behind each response of a session: read from its records (each call's
    ``dialect_state`` holds the input it added, its message the output)."""

    def __init__(self, store: CallReader):
        self.store = store

    def messages(self, session_id: str, resp_id: str) -> list[dict]:
        calls = {c.id: c for c in self.store.calls(session_id)}
        rec = calls.get(call_id(resp_id)) if isinstance(resp_id, str) else None
        # a response sent with store=false keeps no chain (as OpenAI: it cannot be named)
        if (
            rec is None
            or rec.status != "ok"
            or rec.info.get("dialect") != NAME
            or "dialect_state" not in rec.info
        ):
            raise APIError(
                400,
                f"Previous response with id {resp_id!r} not found.",
                "previous_response_id",
                code="previous_response_not_found",
            )
        chain: list[RecordedCall] = []
        while rec is not None:
            chain.append(rec)
            prev = (rec.info.get("dialect_state") or {}).get("previous_response_id")
            rec = calls.get(call_id(prev)) if prev else None
        out: list[dict] = []
        for r in reversed(chain):
            out += (r.info.get("dialect_state") or {}).get("input", [])
            if r.message is not None:
                out.append(r.message)
        image = getattr(self.store, "image", None)  # the store's blobs: a chain's images
        return by_value(out, lambda sha: image(session_id, sha) if image else None)

    def item(self, session_id: str, item_id: Any, where: str) -> dict:
        """An output item this session was answered with, by its id (``msg_…``, ``fc_…``,
        ``rs_…``: the call's id and the item's place), rebuilt from the call's record: what
        an ``item_reference`` names."""
        suffix = item_id.partition("_")[2].rpartition("_")[0] if isinstance(item_id, str) else ""
        rec = next((c for c in self.store.calls(session_id) if c.id == "call_" + suffix), None)
        if rec is not None and rec.status == "ok" and rec.info.get("dialect") == NAME:
            for item in output_items(rec.message or {}, response_id(rec.id)):
                if item["id"] == item_id:
                    return item
        raise bad(f"{where}.id", f"no item with id {item_id!r} was answered in this session.")


def resolved(items: Any, session_id: str, chains: Chains) -> Any:
    """``input`` with each ``item_reference`` replaced by the item it names (a harness that
    keeps ``store`` on sends earlier outputs by reference)."""
    if not isinstance(items, list) or not any(
        isinstance(i, dict) and i.get("type") == "item_reference" for i in items
    ):
        return items
    return [
        chains.item(session_id, i.get("id"), f"input[{n}]")
        if isinstance(i, dict) and i.get("type") == "item_reference"
        else i
        for n, i in enumerate(items)
    ]


def parse(body: Any, session_id: str, chains: Chains) -> ChatRequest:
    """The internal request of a Responses body (400 naming the Responses field otherwise)."""
    if not isinstance(body, dict):
        raise APIError(
            400, "The request body must be a JSON object.", None, code="invalid_request_body"
        )
    inert = check_fields(body)
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise bad("previous_response_id", "expected a string.")
    history = chains.messages(session_id, prev) if prev else []
    given = body.get("input")
    resolved_input = resolved(given, session_id, chains)
    shaped = body if resolved_input is given else {**body, "input": resolved_input}
    try:
        chat, notes = chat_body(shaped, history)
        req = parse_chat_request(chat)
    except APIError as exc:
        raise _renamed(exc) from None
    req.raw, req.dialect, req.inert, req.notes = body, NAME, inert, notes
    req.call_id = new_id("call_")
    if body.get("store", True) is not False:
        # what a later previous_response_id needs; store=false keeps no chain (as OpenAI)
        # its images by reference to the blob store, not as base64 (dialects/images.py)
        kept = by_reference(input_messages(resolved_input))
        req.dialect_state = {"previous_response_id": prev, "input": kept}
    return req


def _renamed(exc: APIError) -> APIError:
    """A Chat field named in an error, as the Responses field the harness sent."""
    names = {
        "max_completion_tokens": "max_output_tokens",
        "messages": "input",
        "response_format": "text.format",
    }
    param = exc.param or ""
    head = param.split("[")[0].split(".")[0]
    if head in names:
        new = names[head] + param[len(head) :]
        return APIError(exc.status, exc.message.replace(param, new), new, exc.code, exc.type)
    return exc


# the response object


def reply(req: ChatRequest, answer: Answer | Relayed) -> dict:
    """The ``response`` object of a whole (non-streamed) call."""
    assert isinstance(answer, Answer)  # token-in's (capture serves Chat only)
    rid = response_id(answer.call_id)
    spaces = namespaces(req.raw.get("tools"))
    return response_object(
        req.raw,
        Ended.of(answer),
        answer.model,
        int(answer.started),
        output_items(answer.message, rid, answer.logprobs, spaces),
    )


def stored(rec: RecordedCall, model: str) -> dict:
    """``GET /v1/responses/{id}``: the response rebuilt from its record."""
    body = rec.info.get("request_options") or {}
    out = output_items(rec.message or {}, response_id(rec.id))
    status = "completed" if rec.status == "ok" else "failed"
    ended = Ended(rec.id, rec.finish_reason == "length", Usage.of(rec.info["usage"]))
    return response_object(body, ended, model, rec.info.get("started", time.time()), out, status)


class ResponsesDialect:
    name = NAME
    history_field: ClassVar[str] = "input"
    prefixes: ClassVar[tuple[str, ...]] = ("/v1",)
    routes: ClassVar[Routes] = (
        Route("POST", "/responses", "call", "OpenAI Responses", "ResponsesRequest"),
        Route("GET", "/responses/{rid}", "stored", "A stored response of the session"),
    )
    credentials: ClassVar[tuple[Credential, ...]] = ()
    schemas: ClassVar[Mapping[str, dict]] = {}

    def __init__(self, gateway: Served):
        self.gateway = gateway

    def parse(self, body: object, session_id: str, edge: Edge = NO_EDGE) -> ChatRequest:
        return parse(body, session_id, Chains(self.gateway.store))

    def stored(self, session_id: str, rid: str) -> dict:
        """``GET …/v1/responses/{id}``: a response of this session, rebuilt from its record."""
        rec = next(
            (
                c
                for c in self.gateway.store.calls(session_id)
                if c.id == call_id(rid) and c.info.get("dialect") == NAME
            ),
            None,
        )
        if rec is None:
            raise APIError(
                404, f"Response with id {rid!r} not found.", "response_id", code="not_found"
            )
        return stored(rec, self.gateway.model_name)

    def reply(self, req: ChatRequest, answer: Answer | Relayed) -> dict:
        return reply(req, answer)

    async def stream(self, req: ChatRequest, events: Streamed) -> AsyncIterator[bytes]:
        model = req.model or self.gateway.model_name
        async for kind, ev in ResponseEvents(req, model).run(events):
            yield b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"

    def keepalive(self, last: bytes) -> bytes:
        """OpenAI's own heartbeat, a ``keepalive`` event: Codex's idle timer
        (``stream_idle_timeout_ms``) counts SSE events and never an SSE comment. It carries
        the last event's ``sequence_number`` (never one ahead of the stream's next event)."""
        try:
            seq = orjson.loads(last.rsplit(b"data: ", 1)[-1]).get("sequence_number")
        except (orjson.JSONDecodeError, AttributeError):
            return b": keep-alive\n\n"
        if not isinstance(seq, int):
            return b": keep-alive\n\n"
        data = orjson.dumps({"type": "keepalive", "sequence_number": seq})
        return b"event: keepalive\ndata: " + data + b"\n\n"

    def error(self, exc: APIError) -> dict:
        if isinstance(exc, ContextOverflow):  # the Responses API's own words and field
            return APIError(
                400,
                "Your input exceeds the context window of this model. Please adjust your "
                "input and try again.",
                "input",
                code=exc.code,
            ).body()
        return exc.body()
