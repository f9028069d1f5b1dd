"""The OpenAI Responses dialect: a request becomes the internal request (``responses_request``),
the gateway's answer in the internal (Chat Completions) shape becomes a ``response`` object, or
its chunks the typed event sequence (``response.created`` … ``response.completed``).

A response's id is its call's, so ``previous_response_id`` and ``GET /v1/responses/{id}`` find
the call in the session's records; the chain itself (which input items each call added) is kept
in the call's record, so it survives a restart.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..server.contract import AppGateway
from ..server.errors import APIError
from ..server.requests import ChatRequest, parse_chat_request
from ..store.records import CallRecord, new_id
from ..store.store import Store
from .responses_request import bad, chat_body, check_fields, input_messages, namespaces

NAME = "responses"


def response_id(call_id: str) -> str:
    return "resp_" + call_id.removeprefix("call_")


def call_id(resp_id: str) -> str:
    return "call_" + resp_id.removeprefix("resp_")


class Chains:
    """The messages behind each response of a session: read from its records (each call's
    ``dialect_state`` holds the input it added, its message the output)."""

    def __init__(self, store: Store):
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
        chain: list[CallRecord] = []
        while rec is not None:
            chain.append(rec)
            prev = (rec.info.get("dialect_state") or {}).get("previous_response_id")
            rec = calls.get(call_id(prev)) if prev else None
        out: list[dict] = []
        for r in reversed(chain):
            out += (r.info.get("dialect_state") or {}).get("input", [])
            if r.message is not None:
                out.append(r.message)
        return out

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
        req.dialect_state = {"previous_response_id": prev, "input": input_messages(resolved_input)}
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


def _usage(rec: CallRecord) -> dict:
    u = rec.info["usage"]
    return {
        "input_tokens": u["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": u.get("cached_tokens", 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
    }


def output_items(
    message: dict,
    rid: str,
    logprobs: list | None = None,
    spaces: dict[str, tuple[str, str]] | None = None,
) -> list[dict]:
    """A recorded assistant message as output items: reasoning, message, function calls,
    each named by the response and its place in the output (as the stream names them); a call
    of a namespaced tool (``spaces``: flat name → namespace, name) named as its namespace."""
    items: list[dict] = []
    suffix = rid.removeprefix("resp_")
    if message.get("reasoning_content") is not None:
        items.append(reasoning_item(f"{suffix}_{len(items)}", message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(f"{suffix}_{len(items)}", message["content"], logprobs or []))
    for c in message.get("tool_calls") or []:
        items.append(
            call_item(
                f"{suffix}_{len(items)}",
                c["id"],
                c["function"]["name"],
                c["function"]["arguments"],
                spaces=spaces,
            )
        )
    return items


def reasoning_item(suffix: str, text: str, status: str = "completed") -> dict:
    return {
        "type": "reasoning",
        "id": f"rs_{suffix}",
        "summary": [],
        "status": status,
        "content": [{"type": "reasoning_text", "text": text}] if text else [],
    }


def text_part(text: str, logprobs: list) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(suffix: str, text: str, logprobs: list, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": f"msg_{suffix}",
        "role": "assistant",
        "status": status,
        "content": [text_part(text, logprobs)] if status == "completed" else [],
    }


def call_item(
    suffix: str,
    cid: str,
    name: str,
    arguments: str,
    status: str = "completed",
    spaces: dict[str, tuple[str, str]] | None = None,
) -> dict:
    item = {
        "type": "function_call",
        "id": f"fc_{suffix}",
        "call_id": cid,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if spaces and name in spaces:
        item["namespace"], item["name"] = spaces[name]
    return item


def response_object(
    body: dict,
    rec: CallRecord | None,
    model: str,
    created: float,
    output: list[dict],
    status: str = "completed",
    rid: str = "",
) -> dict:
    """A ``response`` as the Responses API gives it; ``body`` is the request's."""
    rid = response_id(rec.id) if rec else rid
    incomplete = rec is not None and rec.finish_reason == "length"
    tools = [
        {
            "type": "function",
            "name": t.get("name"),
            "description": t.get("description"),
            "parameters": t.get("parameters"),
            "strict": t.get("strict", False),
        }
        for t in body.get("tools") or []
    ]
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": "incomplete" if incomplete and status == "completed" else status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools,
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": _usage(rec) if rec else None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def reply(req: ChatRequest, completion: dict) -> dict:
    """The ``response`` object of a whole (non-streamed) call."""
    rec = req.record
    assert rec is not None and rec.message is not None  # set by the gateway when recorded
    choice = completion["choices"][0]
    lps = (choice.get("logprobs") or {}).get("content")
    return response_object(
        req.raw,
        rec,
        completion["model"],
        completion["created"],
        output_items(rec.message, response_id(rec.id), lps, namespaces(req.raw.get("tools"))),
    )


def stored(rec: CallRecord, model: str) -> dict:
    """``GET /v1/responses/{id}``: the response rebuilt from its record."""
    body = rec.info.get("request_options") or {}
    out = output_items(rec.message or {}, response_id(rec.id))
    status = "completed" if rec.status == "ok" else "failed"
    return response_object(body, rec, model, rec.info.get("started", time.time()), out, status)


class ResponsesDialect:
    name = NAME
    keepalive = b": keep-alive\n\n"

    def __init__(self, gateway: AppGateway):
        self.gateway = gateway

    def parse(self, body: object, session_id: str) -> ChatRequest:
        return parse(body, session_id, Chains(self.gateway.store))

    def reply(self, req: ChatRequest, completion: dict) -> dict:
        return reply(req, completion)

    async def stream(self, req: ChatRequest, chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
        from .responses_stream import ResponseEvents

        async for kind, ev in ResponseEvents(req, req.model or self.gateway.model_name).run(chunks):
            yield b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"

    def error(self, exc: APIError) -> dict:
        return exc.body()
