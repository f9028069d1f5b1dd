"""The per-completion parser: reasoning split, then tool calls, as the answer's events
(``turnstile.answer``: text, reasoning, tool-call start, argument fragments, end).

One ``Parser`` per completion. ``feed_events`` returns the events to send now; ``finish_events``
flushes; ``result`` is the whole message (``feed``/``finish``: the same as OpenAI Chat
Completions stream deltas). By construction ``result()`` is the concatenation of
every delta returned, and it does not depend on how the text was chunked, so a non-streaming
response (``parse``) equals what a streaming client reassembles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..answer import (
    ReasoningDelta,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from .call_ids import hex_id
from .reasoning import Piece, ThinkSplitter
from .registry import create_tool_parser
from .types import (
    STATUS_OK,
    STATUS_UNCLOSED_REASONING,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Issue,
    ParsedMessage,
    Reasoning,
    Text,
    ToolCallParser,
)

# what the parser hands out: the answer's text, reasoning and tool-call events
AnswerEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolArgumentsDelta | ToolCallEnd

Delta = dict[str, Any]


class _Events:
    """Collects the answer events of one feed/finish, merging neighbours of the same kind (text
    with text, a call's argument fragments with the call's last event)."""

    def __init__(self) -> None:
        self.items: list[AnswerEvent] = []

    def text(self, kind: type[TextDelta] | type[ReasoningDelta], text: str) -> None:
        last = self.items[-1] if self.items else None
        if type(last) is kind:
            self.items[-1] = kind(last.text + text)
        else:
            self.items.append(kind(text))

    def call_start(self, index: int, call_id: str, name: str) -> None:
        self.items.append(ToolCallStart(index, call_id, name))

    def call_args(self, index: int, text: str) -> None:
        last = self.items[-1] if self.items else None
        if isinstance(last, ToolCallStart) and last.index == index:
            self.items[-1] = replace(last, arguments=last.arguments + text)
        elif isinstance(last, ToolArgumentsDelta) and last.index == index:
            self.items[-1] = ToolArgumentsDelta(index, last.text + text)
        else:
            self.items.append(ToolArgumentsDelta(index, text))

    def call_end(self, index: int) -> None:
        self.items.append(ToolCallEnd(index))


def chat_delta(event: AnswerEvent) -> Delta | None:
    """An answer event as the OpenAI Chat Completions stream delta ``Parser.feed`` returns
    (None for a call's end, which has none)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        return {
            "tool_calls": [
                {
                    "index": event.index,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments},
                }
            ]
        }
    if isinstance(event, ToolArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return None


def _deltas(events: list[AnswerEvent]) -> list[Delta]:
    return [d for e in events if (d := chat_delta(e)) is not None]


class Parser:
    """Incremental parser for one completion's text.

    ``reasoning``: parse a leading ``<think>`` block into ``reasoning_content``.
    ``reasoning_started``: the prompt already opened the block (generation prompt ends with
    ``<think>\\n``), so text is reasoning until ``</think>``.
    ``tool_format``: None (no tool parsing) or a registered format name (``"hermes"``).
    ``reasoning_tags``: the block's (open, close) markers when not ``<think>``/``</think>``.
    ``tools``: the request's tools; formats with untyped arguments use their schemas.
    ``id_factory``: optional ``(index, function name) -> id`` (the family's ID style, see
    ``parsing.call_ids``; deterministic ids in tests); by default ids are ``call_id_prefix``
    + 24 random hex characters.

    ``turnstile.parsing.detect_format`` picks all of these from a chat template.
    """

    def __init__(
        self,
        reasoning: bool,
        tool_format: str | None,
        reasoning_started: bool = False,
        call_id_prefix: str = "call_",
        *,
        id_factory: Callable[[int, str], str] | None = None,
        reasoning_tags: tuple[str, str] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self._tools: ToolCallParser | None = (
            create_tool_parser(tool_format, tools) if tool_format is not None else None
        )
        own = self._tools is not None and self._tools.owns_reasoning
        open_tag, close_tag = reasoning_tags or ("<think>", "</think>")
        self._splitter = (
            ThinkSplitter(reasoning_started, open_tag, close_tag) if reasoning and not own else None
        )
        self._format_reasoning = False  # the tool format reported reasoning itself
        self._id_factory = id_factory or (lambda _i, _n: hex_id(call_id_prefix))
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._call_args: list[list[str]] = []
        # Whitespace at the start of a content segment (before, between or after tool calls) is
        # held until something visible follows, so whitespace-only gaps can be dropped.
        self._segment_fresh = True
        self._held_ws = ""
        self._status = STATUS_OK
        self._finished = False
        self._call_open = False  # a call was started and not yet ended

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, text: str) -> list[Delta]:
        """Consume the next piece of completion text; return the deltas to stream now (the
        events of :meth:`feed_events` as OpenAI Chat Completions deltas)."""
        return _deltas(self.feed_events(text))

    def finish(self) -> list[Delta]:
        """End of completion: flush held-back text and close anything left open (the events
        of :meth:`finish_events` as OpenAI Chat Completions deltas)."""
        return _deltas(self.finish_events())

    def feed_events(self, text: str) -> list[AnswerEvent]:
        """Consume the next piece of completion text; return the answer events to stream now."""
        if self._finished:
            raise RuntimeError("Parser.feed() after finish()")
        out = _Events()
        if text:
            pieces: list[Piece] = (
                self._splitter.feed(text) if self._splitter else [("content", text)]
            )
            self._route(pieces, out)
        return out.items

    def finish_events(self) -> list[AnswerEvent]:
        """End of completion: flush held-back text and close anything left open."""
        if self._finished:
            raise RuntimeError("Parser.finish() called twice")
        self._finished = True
        out = _Events()
        if self._splitter is not None:
            self._route(self._splitter.finish(), out)
            if self._splitter.in_reasoning:
                self._set_status(STATUS_UNCLOSED_REASONING)
        if self._tools is not None:
            self._handle(self._tools.finish(), out)
        if self._held_ws and not self._calls:
            self._emit_content(self._held_ws, out)
        self._held_ws = ""
        return out.items

    def result(self) -> ParsedMessage:
        """The whole message; final after ``finish()``, a snapshot of what was emitted before."""
        content: str | None = "".join(self._content)
        unclosed = self._status == STATUS_UNCLOSED_REASONING
        if not content and (self._calls or unclosed):
            content = None
        reasoning = None
        if (self._splitter is not None and self._splitter.opened) or self._format_reasoning:
            reasoning = "".join(self._reasoning)
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": "".join(args)},
            }
            for call, args in zip(self._calls, self._call_args, strict=True)
        ]
        return ParsedMessage(content, reasoning, calls, self._status)

    # -- internals -----------------------------------------------------------------------------

    def _route(self, pieces: list[Piece], out: _Events) -> None:
        for kind, text in pieces:
            if kind == "reasoning":
                self._reasoning.append(text)
                out.text(ReasoningDelta, text)
            elif self._tools is None:
                self._emit_content(text, out)
            else:
                self._handle(self._tools.feed(text), out)

    def _handle(self, events: list[Event], out: _Events) -> None:
        for event in events:
            if isinstance(event, Text):
                self._segment_text(event.text, out)
            elif isinstance(event, Reasoning):
                self._format_reasoning = True
                if event.text:
                    self._reasoning.append(event.text)
                    out.text(ReasoningDelta, event.text)
            elif isinstance(event, CallStart):
                self._held_ws = ""
                index = len(self._calls)
                call_id = self._id_factory(index, event.name)
                self._calls.append({"id": call_id, "name": event.name})
                self._call_args.append([])
                self._call_open = True
                out.call_start(index, call_id, event.name)
            elif isinstance(event, ArgsDelta):
                if event.text:
                    self._call_args[-1].append(event.text)
                    out.call_args(len(self._calls) - 1, event.text)
            elif isinstance(event, CallEnd):
                self._segment_fresh = True
                if self._call_open:
                    self._call_open = False
                    out.call_end(len(self._calls) - 1)
            elif isinstance(event, Issue):
                self._set_status(event.status)

    def _segment_text(self, text: str, out: _Events) -> None:
        """Content from the tool parser: hold leading whitespace of a segment, see ``_held_ws``."""
        if self._segment_fresh:
            text = self._held_ws + text
            if text.isspace():
                self._held_ws = text
                return
            self._held_ws = ""
            self._segment_fresh = False
        self._emit_content(text, out)

    def _emit_content(self, text: str, out: _Events) -> None:
        if text:
            self._content.append(text)
            out.text(TextDelta, text)

    def _set_status(self, status: str) -> None:
        if self._status == STATUS_OK:
            self._status = status


def parse(
    text: str,
    reasoning: bool,
    tool_format: str | None,
    reasoning_started: bool = False,
    *,
    id_factory: Callable[[int, str], str] | None = None,
    reasoning_tags: tuple[str, str] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> ParsedMessage:
    """Parse a whole completion (non-streaming); same result as streaming it through a Parser."""
    parser = Parser(
        reasoning,
        tool_format,
        reasoning_started,
        id_factory=id_factory,
        reasoning_tags=reasoning_tags,
        tools=tools,
    )
    parser.feed(text)
    parser.finish()
    return parser.result()
