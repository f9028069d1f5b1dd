"""The Chat Completions dialect's answers, rendered from the gateway's typed answer
(``turnstile.answer``): a whole ``chat.completion``, or a stream's ``chat.completion.chunk``
objects (the request side is ``request``)."""

from __future__ import annotations

from ...answer import (
    Answer,
    Done,
    Event,
    ReasoningDelta,
    Relayed,
    Started,
    TextDelta,
    TokenLogprobs,
    ToolArgumentsDelta,
    ToolCallStart,
    Usage,
)
from ...random_ids import new_id


def usage(u: Usage) -> dict:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def completion(answer: Answer) -> dict:
    """A whole ``chat.completion``; its id is the call's."""
    lps = answer.logprobs
    choice = {
        "index": 0,
        "message": answer.message,
        "finish_reason": answer.finish_reason,
        "logprobs": {"content": lps, "refusal": None} if lps is not None else None,
    }
    return {
        "id": "chatcmpl-" + answer.call_id.removeprefix("call_"),
        "object": "chat.completion",
        "created": int(answer.started),
        "model": answer.model,
        "choices": [choice],
        "usage": usage(answer.usage),
    }


def delta(event: Event) -> dict | None:
    """A part of the answer as a chunk's ``delta`` (None: the event has none)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        call = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": event.arguments},
        }
        return {"tool_calls": [call]}
    if isinstance(event, ToolArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return None


class Chunks:
    """The ``chat.completion.chunk`` objects of one streamed completion, event by event."""

    def __init__(self, model: str, include_usage: bool):
        self.id = "chatcmpl-" + new_id("")
        self.created = 0
        self.model = model
        self.include_usage = include_usage
        self.logprobs: list | None = None  # a batch's, for its first part

    def chunk(self, delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
        choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = {"content": logprobs}
        out: dict = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def __call__(self, event: Event) -> list[dict]:
        d = delta(event)  # the common case first: a part of the answer
        if d is not None:
            lps, self.logprobs = self.logprobs, None
            return [self.chunk(d, logprobs=lps)]
        if isinstance(event, Relayed):  # capture mode: the engine's own chunk
            return [event.body]
        if isinstance(event, Started):
            self.created = int(event.started)
            return [self.chunk({"role": "assistant", "content": ""})]
        if isinstance(event, TokenLogprobs):
            self.logprobs = event.entries
            return []
        if isinstance(event, Done):
            out = [self.chunk({}, event.answer.finish_reason)]
            if self.include_usage:
                last = self.chunk({})
                last["choices"] = []
                last["usage"] = usage(event.answer.usage)
                out.append(last)
            return out
        return []  # a call's end: no chunk of its own
