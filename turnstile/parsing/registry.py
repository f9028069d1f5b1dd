"""Parser classes by family name, built from the declared families (``turnstile.families``).

``register_family`` declares one more family (e.g. in a test) so that detection, parsing and
grammars all see it; ``register_tool_format`` makes a parser class a ``tool_format`` with no
detection rule or grammar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..families import registry as declared
from ..families.record import Family, TemplatePatch
from .family import parser_class
from .types import ToolCallParser, ToolSchemas

_CLASSES: dict[str, type[ToolCallParser]] = {}


def register_family(family: Family, before: str | None = None) -> Family:
    """Add ``family``; ``before``: the name of a family its templates must be tried before
    (default: after all others)."""
    if declared.register(family, before):
        _CLASSES.pop(family.name, None)
    return family


def unregister_family(name: str) -> None:
    """Remove a family added with ``register_family`` (tests clean up with this)."""
    declared.unregister(name)
    _CLASSES.pop(name, None)


def families() -> list[Family]:
    """Every declared family, in detection order."""
    return declared.families()


def family(name: str) -> Family:
    """The family declared as ``name``; unknown names raise ``ValueError``."""
    return declared.family(name)


def template_patches() -> list[TemplatePatch]:
    """Every family's template repairs, in table order."""
    return declared.template_patches()


def register_tool_format(
    *names: str,
) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """Class decorator: make a ``ToolCallParser`` available as ``tool_format=<name>``, with no
    detection rule or grammar (a ``Family`` declares those)."""

    def decorate(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        for name in names:
            known = _CLASSES.get(name)
            if known is not None and known is not cls:
                raise ValueError(f"tool format {name!r} already registered by {known.__name__}")
            register_family(declared.declared(name) or Family(name, cls))
            _CLASSES[name] = cls
        cls.names = tuple(names)
        return cls

    return decorate


def tool_formats() -> list[str]:
    """Names accepted as ``tool_format``."""
    return declared.names()


def create_tool_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolCallParser:
    """A fresh parser for one completion; unknown names raise ``ValueError`` early.

    ``tools`` (the request's OpenAI tools) lets formats with untyped arguments type them.
    """
    parser = format_class(name)()
    if tools:
        parser.tools = ToolSchemas(tools)
    return parser


def format_class(name: str) -> type[ToolCallParser]:
    """The parser class of the family ``name`` (for its markers and flags), built (or
    imported) on first use."""
    cls = _CLASSES.get(name)
    if cls is None:
        cls = parser_class(family(name))  # same error for unknown names
        cls.names = (name,)
        _CLASSES[name] = cls
    return cls
