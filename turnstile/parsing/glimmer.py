"""Muse Glimmer's ATEM protocol: Harmony-like messages with XML calls.

``<|start|>assistant to=RECIPIENT<|message|>BODY<|eom|>`` (``<|eot|>`` ends the turn). Recipient
``self`` is reasoning, ``user`` (or none) is content, anything else is a tool: its body is
``<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="K">V</atem:parameter>
</atem:invoke></atem:function_calls>``.
"""

from __future__ import annotations

import re

from .base import Region, malformed
from .harmony import ChannelParser
from .types import Event
from .xmlcalls import XmlCalls, XmlSpec

CALLS = "<atem:function_calls>"
SPEC = XmlSpec.attribute_tags("atem:invoke", "atem:parameter", "</atem:function_calls>")
ENDS = ("<|eom|>", "<|eot|>")
_RECIPIENT = re.compile(r"\s*to=(\S*)\s*")


class _AtemBody(Region):
    """``<atem:function_calls>…`` then the message end."""

    def __init__(self, parser: GlimmerToolParser) -> None:
        self._parser = parser
        self._inner: Region | None = None
        self._done_calls = False

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._done_calls:  # after the calls: the message end marker, if present
            i = len(buf) - len(buf.lstrip())
            for end in ENDS:
                if buf.startswith(end, i):
                    return i + len(end), True
            if not final and any(e.startswith(buf[i:]) for e in ENDS) and buf[i:]:
                return 0, False
            return i, True
        if self._inner is None:
            i = len(buf) - len(buf.lstrip())
            if buf.startswith(CALLS, i):
                self._inner = XmlCalls(CALLS, SPEC, self._parser.tools)
                return i + len(CALLS), False
            if not final and CALLS.startswith(buf[i:]):
                return 0, False
            malformed(out, "")
            return i, True
        n, done = self._inner.advance(buf, final, out)
        if done:
            self._done_calls = True
            return n, final
        return n, False


class GlimmerToolParser(ChannelParser):
    """ATEM messages."""

    ends = ENDS
    header_starts = (" to=", "to=")
    markers = ("<|start|>", "<|message|>", *ENDS, CALLS, *SPEC.markers)

    def classify(self, header: str) -> tuple[str, str]:
        header = header.removeprefix(self.start).removeprefix("assistant")
        m = _RECIPIENT.fullmatch(header)
        recipient = m.group(1) if m else ""
        if recipient == "self":
            return "reasoning", ""
        if recipient in ("", "user", "all"):
            return "content", ""
        return "tool", recipient

    def tool_region(self, header: str, name: str) -> Region:
        return _AtemBody(self)
