"""Registry of tool-call formats by name, so each model family can be added as one module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .types import ToolCallParser, ToolSchemas

_FORMATS: dict[str, type[ToolCallParser]] = {}


def register_tool_format(
    *names: str,
) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """Class decorator: make a ``ToolCallParser`` available as ``tool_format=<name>``."""

    def decorate(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        for name in names:
            known = _FORMATS.get(name)
            if known is not None and known is not cls:
                raise ValueError(f"tool format {name!r} already registered by {known.__name__}")
            _FORMATS[name] = cls
        cls.names = tuple(names)
        return cls

    return decorate


def tool_formats() -> list[str]:
    """Names accepted as ``tool_format``."""
    return sorted(_FORMATS)


def create_tool_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolCallParser:
    """A fresh parser for one completion; unknown names raise ``ValueError`` early.

    ``tools`` (the request's OpenAI tools) lets formats with untyped arguments type them.
    """
    try:
        cls = _FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool format {name!r}; known: {', '.join(tool_formats()) or 'none'}"
        ) from None
    parser = cls()
    if tools:
        parser.tools = ToolSchemas(tools)
    return parser


def format_class(name: str) -> type[ToolCallParser]:
    """The parser class registered as ``name`` (for its markers and flags)."""
    create_tool_parser(name)  # same error for unknown names
    return _FORMATS[name]
