"""Hermes / Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Used by Hermes-2/3, Qwen2.5, Qwen3 (non-Coder) and many fine-tunes. Several blocks in a row are
parallel calls.

Streaming policy, chosen so a call is never announced and then withdrawn:
  * A call is *committed* as soon as its text reads ``{"name": "<non-empty>", "arguments": {``
    (``"parameters"`` is accepted too). From then on the arguments text is forwarded verbatim
    as it arrives, and the call stays a tool call whatever follows. If it then turns out
    malformed (invalid JSON, arguments cut off by ``</tool_call>`` or by the end of the
    completion, junk after the arguments) it is still reported, with the arguments text the
    model produced, and ``parse_status`` becomes ``malformed_tool_call``.
  * Any other shape (keys in another order, stringified arguments, ...) is buffered and parsed
    whole at ``</tool_call>``. If valid it is emitted in one piece; if not, the raw text
    ``<tool_call>...</tool_call>`` becomes content and ``parse_status`` says so. The same happens
    to an uncommitted call still open at the end of the completion.
  * The first ``</tool_call>`` ends the call, even inside a JSON string (as regex-based parsers
    do); the call boundary therefore never depends on the JSON being valid.
"""

from __future__ import annotations

from .jsoncalls import CallHead, ValueScanner, match_call_head, parse_call_object
from .markers import split_safe
from .types import (
    STATUS_MALFORMED_TOOL_CALL,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Issue,
    Text,
    ToolCallParser,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

# States
_TEXT = "text"  # outside a call
_HEAD = "head"  # inside a call, not yet known whether it can be streamed
_ARGS = "args"  # committed, forwarding the arguments object
_TAIL = "tail"  # committed, arguments complete, waiting for </tool_call>
_WHOLE = "whole"  # uncommitted, buffering until </tool_call> to parse the call whole

#: A call whose first HEAD_LIMIT characters do not reach ``"arguments": {`` is parsed whole.
#: Bounds the re-matching work; applied to a fixed prefix so chunking cannot change the outcome.
HEAD_LIMIT = 1024


class HermesToolParser(ToolCallParser):
    """Incremental Hermes tool-call parser (see the module docstring for the policy)."""

    markers = (OPEN, CLOSE)

    def __init__(self) -> None:
        self._state = _TEXT
        self._pending = ""  # received, not yet consumed
        self._body: list[str] = []  # text of the current call consumed so far (after <tool_call>)
        self._body_len = 0
        self._name = ""
        self._args: list[str] = []
        self._scanner = ValueScanner()

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        events: list[Event] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        while self._step(events, final=True):
            pass
        return events

    # -- state machine -------------------------------------------------------------------------

    def _step(self, events: list[Event], final: bool) -> bool:
        """Consume what can be consumed now; return True if another step may make progress."""
        if self._state == _TEXT:
            return self._step_text(events, final)

        # Inside a call: only text before </tool_call> (or before a possible partial one) counts.
        close_at = self._pending.find(CLOSE)
        if close_at >= 0:
            avail = self._pending[:close_at]
        elif final:
            avail = self._pending
        else:
            avail, _ = split_safe(self._pending, (CLOSE,))
        closed = close_at >= 0

        if self._state == _HEAD:
            seen = "".join(self._body) + avail
            head = match_call_head(seen[:HEAD_LIMIT])
            if head.status == "partial" and len(seen) >= HEAD_LIMIT:
                head = CallHead("fail")
            if head.status == "match":
                used = head.end - self._body_len
                self._consume_body(used)
                self._name = head.name
                self._state = _ARGS
                self._scanner = ValueScanner(depth=1)
                events.append(CallStart(self._name))
                self._emit_args("{", events)
                return True
            self._consume_body(len(avail))
            if head.status == "fail":
                self._state = _WHOLE
        elif self._state == _ARGS:
            end = self._scanner.feed(avail)
            piece = avail if end is None else avail[:end]
            self._consume_body(len(piece))
            self._emit_args(piece, events)
            if end is not None:
                self._state = _TAIL
                return True
        else:  # _TAIL or _WHOLE: just collect
            self._consume_body(len(avail))

        if closed:
            self._pending = self._pending[len(CLOSE) :]
            self._close_call(events, closed=True)
            return True
        if final:
            self._close_call(events, closed=False)
        return False

    def _step_text(self, events: list[Event], final: bool) -> bool:
        open_at = self._pending.find(OPEN)
        if open_at >= 0:
            if open_at:
                events.append(Text(self._pending[:open_at]))
            self._pending = self._pending[open_at + len(OPEN) :]
            self._state = _HEAD
            return True
        safe, held = (self._pending, "") if final else split_safe(self._pending, (OPEN,))
        if safe:
            events.append(Text(safe))
        self._pending = held
        return False

    def _consume_body(self, n: int) -> None:
        if n:
            self._body.append(self._pending[:n])
            self._body_len += n
            self._pending = self._pending[n:]

    def _emit_args(self, text: str, events: list[Event]) -> None:
        if text:
            self._args.append(text)
            events.append(ArgsDelta(text))

    def _close_call(self, events: list[Event], closed: bool) -> None:
        """End the current call at </tool_call> (closed) or at the end of the completion."""
        body = "".join(self._body)
        if self._state in (_ARGS, _TAIL):
            parsed = parse_call_object(body)
            if not closed or parsed != (self._name, "".join(self._args)):
                events.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            events.append(CallEnd())
        else:
            parsed = parse_call_object(body) if closed else None
            if parsed is None:
                raw = OPEN + body + (CLOSE if closed else "")
                events.append(Text(raw))
                events.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            else:
                name, arguments = parsed
                events += [CallStart(name), ArgsDelta(arguments), CallEnd()]
        self._state = _TEXT
        self._body = []
        self._body_len = 0
        self._name = ""
        self._args = []
