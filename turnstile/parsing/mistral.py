"""Mistral ``[TOOL_CALLS]`` tool calls, old and new forms.

- JSON list (Mistral-7B v0.3, Nemo, Small ≤3.1): ``[TOOL_CALLS][{"name": …, "arguments": {…},
  "id": "…"}, …]``.
- Name + arguments (Mistral-Small-3.2, Devstral, Ministral-3, Magistral):
  ``[TOOL_CALLS]NAME[ARGS]{…}`` (3.2 also writes ``[CALL_ID]id`` before ``[ARGS]``), one
  ``[TOOL_CALLS]`` per call.

The form is told by the first character after the marker. Reasoning models write
``[THINK]…[/THINK]`` (see ``families``).
"""

from __future__ import annotations

import re

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .tagged import TaggedJsonCall, TaggedSpec
from .types import Event

TOOL_CALLS = "[TOOL_CALLS]"
NEW_SPEC = TaggedSpec(
    headers=(re.compile(r"\s*(?P<name>[^\s\[\]{}]+)\s*(?:\[CALL_ID\][^\[\]{}]*)?\[ARGS\]\s*"),),
    aborts=(TOOL_CALLS,),
)
LIST_SPEC = ListSpec(bare=True)


class _MistralCall(Region):
    """Picks the form from the first non-space character, then delegates."""

    def __init__(self, opener: str) -> None:
        self._opener = opener
        self._inner: Region | None = None

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._inner is None:
            stripped = buf.lstrip()
            if not stripped and not final:
                return 0, False
            if stripped[:1] in ("[", "{"):
                self._inner = JsonCallList(self._opener, LIST_SPEC)
            else:
                self._inner = TaggedJsonCall(self._opener, NEW_SPEC)
        return self._inner.advance(buf, final, out)


class MistralToolParser(RegionParser):
    """``[TOOL_CALLS]`` in either form."""

    openers = (TOOL_CALLS,)
    markers = (TOOL_CALLS, "[CALL_ID]", "[ARGS]", "[THINK]", "[/THINK]")

    def open_region(self, marker: str) -> Region:
        return _MistralCall(marker)
