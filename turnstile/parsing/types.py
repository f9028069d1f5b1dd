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
            # a copy the caller may change: calls are {id, type, function: {name, arguments}}
            msg["tool_calls"] = [
                {**c, "function": dict(c["function"])} if "function" in c else copy.deepcopy(c)
                for c in self.tool_calls
            ]
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
class Reasoning:
    """Reasoning text found by the format itself (Harmony ``analysis`` channel, ``to=self``...).

    Formats whose reasoning is not a leading ``<open>…</close>`` block report it this way; the
    Parser routes it to ``reasoning_content``.
    """

    text: str


@dataclass(frozen=True, slots=True)
class Issue:
    """A problem worth recording in ``parse_status``; parsing continues."""

    status: str


Event = Text | Reasoning | CallStart | ArgsDelta | CallEnd | Issue


class ToolSchemas:
    """Parameter types of the request's tools, for formats that write arguments as plain text
    (read on first use: most formats never ask, and a coding agent sends ~20 tools a call)."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._tools = tools
        self._props: dict[str, dict[str, Any]] | None = None

    def _index(self) -> dict[str, dict[str, Any]]:
        props_of: dict[str, dict[str, Any]] = {}
        for tool in self._tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            props_of[fn["name"]] = props if isinstance(props, dict) else {}
        return props_of

    def schema(self, function: str, param: str) -> dict[str, Any] | None:
        """The JSON schema of one parameter, or None when unknown."""
        if self._props is None:
            self._props = self._index()
        prop = self._props.get(function, {}).get(param)
        return prop if isinstance(prop, dict) else None

    def types(self, function: str, param: str) -> frozenset[str] | None:
        """JSON types the parameter allows (``{"string"}``, ``{"integer", "null"}``...), or None."""
        return schema_types(self.schema(function, param))


def schema_types(schema: dict[str, Any] | None) -> frozenset[str] | None:
    """Types a JSON schema allows, following ``type`` lists, ``anyOf``/``oneOf`` and ``enum``."""
    if not isinstance(schema, dict):
        return None
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            found |= schema_types(sub) or set()
    if not found and isinstance(schema.get("enum"), list):
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        found.update(names.get(type(v), "null" if v is None else "object") for v in schema["enum"])
    if not found and "properties" in schema:
        found.add("object")
    return frozenset(found) or None


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
    #: True when the format itself separates reasoning (emits ``Reasoning``); the Parser then
    #: runs no ``<think>`` splitter in front of it.
    owns_reasoning: ClassVar[bool] = False
    #: Literal markers of the syntax (documentation, and the special tokens a stand-in
    #: tokenizer needs in tests).
    markers: ClassVar[tuple[str, ...]] = ()
    #: The request's tools (OpenAI ``tools`` list) when known: formats whose arguments are
    #: untyped text (XML parameters) use the schemas to tell ``"7"`` from ``7``.
    tools: ToolSchemas | None = None

    @abstractmethod
    def feed(self, text: str) -> list[Event]:
        """Consume more content text; return the events that are now certain."""

    @abstractmethod
    def finish(self) -> list[Event]:
        """End of completion: flush everything held back, closing any open call."""
