"""The declared families by name, in detection order; parsers are created from them.

Filled from ``families.FAMILIES`` on import. ``register_family`` adds one more (a family declared
elsewhere, e.g. in a test) so that detection, parsing and grammars all see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .family import Family, TemplatePatch
from .types import ToolCallParser, ToolSchemas

_FAMILIES: dict[str, Family] = {}
_CLASSES: dict[str, type[ToolCallParser]] = {}


def register_family(family: Family, before: str | None = None) -> Family:
    """Add ``family``; ``before``: the name of a family its templates must be tried before
    (default: after all others)."""
    known = _FAMILIES.get(family.name)
    if known is family:
        return family
    if known is not None:
        raise ValueError(f"tool format {family.name!r} is already declared")
    if before is not None and before not in _FAMILIES:
        raise ValueError(f"unknown tool format {before!r}")
    cls = family.parser_class
    cls.names = (family.name,)
    items = [(n, f) for n, f in _FAMILIES.items() if n != family.name]
    at = len(items) if before is None else [n for n, _ in items].index(before)
    items.insert(at, (family.name, family))
    _FAMILIES.clear()
    _FAMILIES.update(items)
    _CLASSES[family.name] = cls
    return family


def unregister_family(name: str) -> None:
    """Remove a family added with ``register_family`` (tests clean up with this)."""
    _FAMILIES.pop(name, None)
    _CLASSES.pop(name, None)


def families() -> list[Family]:
    """Every declared family, in detection order."""
    return list(_FAMILIES.values())


def family(name: str) -> Family:
    """The family declared as ``name``; unknown names raise ``ValueError``."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"unknown tool format {name!r}; known: {', '.join(tool_formats()) or 'none'}"
        ) from None


def template_patches() -> list[TemplatePatch]:
    """Every family's template repairs, in table order."""
    return [p for f in _FAMILIES.values() for p in f.patches]


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
            register_family(_FAMILIES.get(name) or Family(name, cls))
        cls.names = tuple(names)
        return cls

    return decorate


def tool_formats() -> list[str]:
    """Names accepted as ``tool_format``."""
    return sorted(_FAMILIES)


def create_tool_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolCallParser:
    """A fresh parser for one completion; unknown names raise ``ValueError`` early.

    ``tools`` (the request's OpenAI tools) lets formats with untyped arguments type them.
    """
    parser = format_class(name)()
    if tools:
        parser.tools = ToolSchemas(tools)
    return parser


def format_class(name: str) -> type[ToolCallParser]:
    """The parser class registered as ``name`` (for its markers and flags)."""
    family(name)  # same error for unknown names
    return _CLASSES[name]


def _load() -> None:
    from .families import FAMILIES

    for declared in FAMILIES:
        register_family(declared)


_load()
