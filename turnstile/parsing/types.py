"""Data types shared by the parsing layer: the parsed message, statuses, and tool-parser events."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

STATUS_OK = "ok"
#: A tool call could not be parsed (invalid JSON, no name, unclosed at the end, ...).
STATUS_MALFORMED_TOOL_CALL = "malformed_tool_call"
#: The completion ended inside a reasoning block; everything went to ``reasoning_content``.
STATUS_UNCLOSED_REASONING = "unclosed_reasoning"


@dataclass
class ParsedMessage:
    """The assistant message parsed from one completion's text.

    ``content`` is ``None`` when there is no content at all and the message has tool calls (or
    its reasoning never closed); otherwise it is a string, possibly empty.
    ``reasoning_content`` is ``None`` when no reasoning block was opened.
    ``parse_status`` is the first problem met while parsing, or ``"ok"``; the message is still
    usable when it is not ``"ok"`` (raw text is kept as content rather than dropped).
    """

    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_status: str = STATUS_OK

    def to_openai(self) -> dict[str, Any]:
        """OpenAI ``choices[].message`` shape; optional keys are omitted when empty."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = copy.deepcopy(self.tool_calls)
        return msg


# --- Events a tool-call parser reports to the Parser -------------------------------------------
# A tool parser only knows the syntax of its family; the Parser owns call ids, indexes, the
# whitespace policy and the OpenAI delta shape, so every family behaves the same way downstream.


@dataclass(frozen=True, slots=True)
class Text:
    """Plain content (including the raw text of a call that could not be parsed)."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A new tool call whose name is known; arguments follow as ``ArgsDelta`` events."""

    name: str


@dataclass(frozen=True, slots=True)
class ArgsDelta:
    """A fragment of the current call's arguments JSON text."""

    text: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    """The current tool call is complete (whether or not it turned out well-formed)."""


@dataclass(frozen=True, slots=True)
class Issue:
    """A problem worth recording in ``parse_status``; parsing continues."""

    status: str


Event = Text | CallStart | ArgsDelta | CallEnd | Issue


class ToolCallParser(ABC):
    """Incremental parser for one tool-call syntax, fed the content text (reasoning removed).

    Contract, so that streaming and whole-text parsing agree:
      * The concatenation of the events must not depend on how the text was chunked.
      * Never emit as ``Text`` a suffix that could be the start of a marker; hold it back.
      * Emit ``CallStart`` only once the call is certain to be reported as a call: after it,
        the call is never withdrawn, even if it turns out malformed (report an ``Issue``).
    """

    #: Names this format is registered under (see ``register_tool_format``).
    names: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def feed(self, text: str) -> list[Event]:
        """Consume more content text; return the events that are now certain."""

    @abstractmethod
    def finish(self) -> list[Event]:
        """End of completion: flush everything held back, closing any open call."""
