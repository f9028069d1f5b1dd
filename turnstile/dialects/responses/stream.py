"""A streamed Responses call: the gateway's answer events (``turnstile.answer``) as the typed
event sequence the Responses API sends, each output item opened, filled by deltas and closed in
turn:
``response.created`` → (``output_item.added`` → deltas → ``output_item.done``)* →
``response.completed`` (``response.incomplete`` at the token limit)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from ...answer import (
    Answer,
    Done,
    Event,
    ReasoningDelta,
    Streamed,
    TextDelta,
    TokenLogprobs,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ...errors import APIError
from ...request import ChatRequest
from .items import (
    Ended,
    call_item,
    message_item,
    output_items,
    reasoning_item,
    response_id,
    response_object,
    text_part,
)
from .request import namespaces


class ResponseEvents:
    def __init__(self, req: ChatRequest, model: str):
        self.req = req
        self.answer: Answer | None = None  # the call's, once it is over
        self.model = model
        self.created = time.time()
        self.seq = 0
        assert req.call_id is not None  # the dialect names the call before it runs
        self.rid = response_id(req.call_id)
        self.suffix = self.rid.removeprefix("resp_")
        self.output: list[dict] = []  # finished items
        self.item: dict | None = None  # the item being streamed
        self.text = ""  # its text so far (message text, reasoning, arguments)
        self.logprobs: list = []
        self.batch_logprobs: list | None = None  # the next part's (its batch's first)
        self.spaces = namespaces(req.raw.get("tools"))  # namespaced tools' flat names

    def _event(self, kind: str, **fields: object) -> tuple[str, dict]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, ev

    def _response(self, status: str) -> dict:
        ended = Ended.of(self.answer) if self.answer else None
        return response_object(
            self.req.raw, ended, self.model, self.created, self.output, status, self.rid
        )

    @property
    def _id(self) -> str:
        assert self.item is not None
        return self.item["id"]

    @property
    def _index(self) -> int:
        return len(self.output)

    def _open(self, item: dict) -> list[tuple[str, dict]]:
        self.item, self.text, self.logprobs = item, "", []
        out = [self._event("response.output_item.added", output_index=self._index, item=item)]
        if item["type"] == "message":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._index,
                    content_index=0,
                    part=text_part("", []),
                )
            )
        return out

    def _close(self) -> list[tuple[str, dict]]:
        item, i = self.item, self._index
        if item is None:
            return []
        out = []
        kind = item["type"]
        if kind == "message":
            part = text_part(self.text, self.logprobs)
            out += [
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=i,
                    content_index=0,
                    text=self.text,
                    logprobs=self.logprobs,
                ),
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=i,
                    content_index=0,
                    part=part,
                ),
            ]
            done = {**item, "status": "completed", "content": [part]}
        elif kind == "reasoning":
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=i,
                    content_index=0,
                    text=self.text,
                )
            )
            done = reasoning_item(item["id"].removeprefix("rs_"), self.text)
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=i,
                    name=item["name"],
                    arguments=self.text,
                )
            )
            done = {**item, "arguments": self.text, "status": "completed"}
        out.append(self._event("response.output_item.done", output_index=i, item=done))
        self.output.append(done)
        self.item = None
        return out

    def _on(self, ev: Event) -> list[tuple[str, dict]]:
        if isinstance(ev, TokenLogprobs):
            self.batch_logprobs = ev.entries
            return []
        if isinstance(ev, ToolCallEnd):  # the call's item is done now, as OpenAI's stream does
            is_call = self.item is not None and self.item["type"] == "function_call"
            return self._close() if is_call else []
        if not isinstance(ev, (TextDelta, ReasoningDelta, ToolCallStart, ToolArgumentsDelta)):
            return []
        logprobs, self.batch_logprobs = self.batch_logprobs, None
        out: list[tuple[str, dict]] = []
        n = self._index
        if isinstance(ev, ReasoningDelta) and ev.text:
            if self.item is None or self.item["type"] != "reasoning":
                out += self._close()
                out += self._open(reasoning_item(f"{self.suffix}_{n}", "", "in_progress"))
            self.text += ev.text
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self._id,
                    output_index=self._index,
                    content_index=0,
                    delta=ev.text,
                )
            )
        elif isinstance(ev, TextDelta) and ev.text:
            if self.item is None or self.item["type"] != "message":
                out += self._close()
                out += self._open(message_item(f"{self.suffix}_{n}", "", [], "in_progress"))
            self.text += ev.text
            self.logprobs += logprobs or []
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self._id,
                    output_index=self._index,
                    content_index=0,
                    delta=ev.text,
                    logprobs=logprobs or [],
                )
            )
        elif isinstance(ev, ToolCallStart):  # a new call
            out += self._close()
            out += self._open(
                call_item(
                    f"{self.suffix}_{self._index}", ev.id, ev.name, "", "in_progress", self.spaces
                )
            )
            out += self._arguments(ev.arguments)
        elif isinstance(ev, ToolArgumentsDelta):
            out += self._arguments(ev.text)
        return out

    def _arguments(self, text: str) -> list[tuple[str, dict]]:
        if not text or self.item is None:
            return []
        self.text += text
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=self.item["id"],
                output_index=self._index,
                delta=text,
            )
        ]

    async def run(self, events: Streamed) -> AsyncIterator[tuple[str, dict]]:
        yield self._event("response.created", response=self._response("in_progress"))
        yield self._event("response.in_progress", response=self._response("in_progress"))
        answer: Answer | None = None
        try:
            async for event in events:
                if isinstance(event, Done):
                    answer = event.answer
                for ev in self._on(event):
                    yield ev
        except APIError as exc:
            yield self._event("error", code=exc.code, message=exc.message, param=exc.param)
            yield self._event(
                "response.failed",
                response={
                    **self._response("failed"),
                    "error": {"code": exc.code or "server_error", "message": exc.message},
                },
            )
            return
        for ev in self._close():
            yield ev
        self.answer = answer
        done = self._response("completed")
        if answer is not None:
            # the recorded message is the answer, its items named as the stream named them
            done["output"] = output_items(answer.message, self.rid, spaces=self.spaces)
            _keep_ids(done["output"], self.output)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        yield self._event(kind, response=done)


def _keep_ids(final: list[dict], streamed: list[dict]) -> None:
    """The final response names its items as the stream did (the harness matched them), and
    its text parts keep the logprobs the stream gave (the record holds no top-k lists)."""
    for f, s in zip(final, streamed, strict=False):
        if f["type"] == s["type"]:
            f["id"] = s["id"]
            if f["type"] == "message" and f.get("content") and s.get("content"):
                f["content"][0]["logprobs"] = s["content"][0].get("logprobs") or []
