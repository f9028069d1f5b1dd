"""The objects of the Responses API built from a call: response and item IDs, output items
(reasoning, message, function call), the ``response`` object; the dialect's whole answers
(``dialect``) and its stream's events (``stream``) are made of them."""

from __future__ import annotations

from dataclasses import dataclass

from ...answer import Answer, Usage


def response_id(call_id: str) -> str:
    return "resp_" + call_id.removeprefix("call_")


def call_id(resp_id: str) -> str:
    return "call_" + resp_id.removeprefix("resp_")


def _usage(u: Usage) -> dict:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
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


@dataclass(frozen=True, slots=True)
class Ended:
    """What a ``response`` shows of a finished call: its id, whether the token limit cut it,
    its usage (from the gateway's answer, or a stored call's record)."""

    call_id: str
    cut_by_length: bool
    usage: Usage

    @classmethod
    def of(cls, answer: Answer) -> Ended:
        return cls(answer.call_id, answer.cut_by_length, answer.usage)


def response_object(
    body: dict,
    ended: Ended | None,
    model: str,
    created: float,
    output: list[dict],
    status: str = "completed",
    rid: str = "",
) -> dict:
    """A ``response`` as the Responses API gives it; ``body`` is the request's, ``ended`` the
    call once it is over (None while it streams)."""
    rid = response_id(ended.call_id) if ended else rid
    incomplete = ended is not None and ended.cut_by_length
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
        "usage": _usage(ended.usage) if ended else None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
