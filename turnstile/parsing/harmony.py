"""OpenAI Harmony (gpt-oss): messages on channels, tool calls addressed with ``to=``.

A completion is a run of messages, each ``[<|start|>assistant]HEADER<|message|>BODY END``: the
header names the channel (``<|channel|>analysis|commentary|final``) and, for a call, the
recipient (`` to=functions.NAME``, before or after the channel, with an optional
``<|constrain|>json``); END is ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the last message's end
is usually the stop token, absent from the text). ``analysis`` is reasoning, ``final`` and
plain ``commentary`` are content, and a ``functions.*`` recipient makes the body a call's JSON
arguments, streamed as written. ``ChannelParser`` is shared with Muse Glimmer's ATEM protocol.
"""

from __future__ import annotations

import re
from typing import ClassVar

from ..families.specs import HARMONY_ENDS
from .base import Region, find_first, malformed
from .markers import split_safe
from .tagged import TaggedJsonCall, TaggedSpec
from .types import Event, Reasoning, Text, ToolCallParser

_HEADER, _BODY, _TOOL = "header", "body", "tool"


class ChannelParser(ToolCallParser):
    """A run of ``<|start|>``…``<|message|>``…END messages; subclasses classify headers."""

    owns_reasoning = True
    start: ClassVar[str] = "<|start|>"
    message: ClassVar[str] = "<|message|>"
    ends: ClassVar[tuple[str, ...]] = ()
    #: What a header may begin with (anything else at a message start is plain content).
    header_starts: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._buf = ""
        self._state = _HEADER
        self._kind = "content"
        self._region: Region | None = None

    def classify(self, header: str) -> tuple[str, str]:
        """(kind, tool name) for a header: kind is "reasoning", "content" or "tool"."""
        raise NotImplementedError

    def tool_region(self, header: str, name: str) -> Region:
        """The region parsing a tool message's body."""
        raise NotImplementedError

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._step(out, final):
            pass
        return out

    def _step(self, out: list[Event], final: bool) -> bool:
        if self._state == _TOOL:
            assert self._region is not None
            n, done = self._region.drive(self._buf, final, out)
            self._buf = self._buf[n:]
            if done:
                self._state = _HEADER
                self._region = None
                return True
            return n > 0
        if self._state == _BODY:
            return self._body(out, final)
        return self._header(out, final)

    def _header(self, out: list[Event], final: bool) -> bool:
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        rest = buf[lead:]
        if not rest:
            self._buf = "" if final else buf
            return False
        starts = (self.start, *self.header_starts)
        if not any(rest.startswith(s) for s in starts):
            if not final and any(s.startswith(rest) for s in starts):
                return False
            self._state, self._kind = _BODY, "content"  # not a header: plain content
            return True
        at, marker = find_first(rest, (self.message, *self.ends))
        nxt = rest.find(self.start, len(self.start) if rest.startswith(self.start) else 0)
        if marker == self.message and (nxt < 0 or at < nxt):
            header = rest[:at]
            self._buf = rest[at + len(marker) :]
            kind, name = self.classify(header)
            if kind == "tool":
                self._state, self._region = _TOOL, self.tool_region(header, name)
            else:
                self._state, self._kind = _BODY, kind
            return True
        # a header that never reaches <|message|>: report it up to where the next message starts
        stops = [nxt] if nxt >= 0 else []
        if at >= 0 and marker != self.message:
            stops.append(at + len(marker))
        if not stops and not final:
            return False
        stop = min(stops) if stops else len(rest)
        malformed(out, rest[:stop])
        self._buf = rest[stop:]
        return True

    def _body(self, out: list[Event], final: bool) -> bool:
        at, marker = find_first(self._buf, (*self.ends, self.start))
        if at >= 0:
            self._emit(self._buf[:at], out)
            used = at + len(marker) if marker != self.start else at
            self._buf = self._buf[used:]
            self._state = _HEADER
            return True
        safe, held = (self._buf, "") if final else split_safe(self._buf, (*self.ends, self.start))
        self._emit(safe, out)
        self._buf = held
        return False

    def _emit(self, text: str, out: list[Event]) -> None:
        if text:
            out.append(Reasoning(text) if self._kind == "reasoning" else Text(text))


_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonyToolParser(ChannelParser):
    """gpt-oss Harmony messages."""

    ends = HARMONY_ENDS
    header_starts = ("<|channel|>", " to=", "to=")
    markers = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", *HARMONY_ENDS)

    def classify(self, header: str) -> tuple[str, str]:
        recipient = _RECIPIENT.search(header)
        if recipient and recipient.group(1) not in ("assistant", "user", "all"):
            name = recipient.group(1)
            return "tool", name.removeprefix("functions.")
        channel = _CHANNEL.search(header)
        if channel and channel.group(1) == "analysis":
            return "reasoning", ""
        return "content", ""

    def tool_region(self, header: str, name: str) -> Region:
        spec = TaggedSpec(closes=HARMONY_ENDS, aborts=(self.start,), close_at_end=True)
        return TaggedJsonCall(header + self.message, spec, name=name)
