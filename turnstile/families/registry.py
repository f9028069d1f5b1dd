"""The declared families by name, in detection order: the table's rows, and any family added
at run time (``register``; a test's, or a harness's own format), so that detection, parsing,
grammars, template patches and end-of-turn markers all see the same set."""

from __future__ import annotations

from .record import Family, TemplatePatch
from .table import FAMILIES, OTHER_ENDS

_FAMILIES: dict[str, Family] = {}


def register(family: Family, before: str | None = None) -> bool:
    """Add ``family``; ``before``: the name of a family its templates must be tried before
    (default: after all others). False when this very record was declared already."""
    known = _FAMILIES.get(family.name)
    if known is family:
        return False
    if known is not None:
        raise ValueError(f"tool format {family.name!r} is already declared")
    if before is not None and before not in _FAMILIES:
        raise ValueError(f"unknown tool format {before!r}")
    items = [(n, f) for n, f in _FAMILIES.items() if n != family.name]
    at = len(items) if before is None else [n for n, _ in items].index(before)
    items.insert(at, (family.name, family))
    _FAMILIES.clear()
    _FAMILIES.update(items)
    return True


def unregister(name: str) -> None:
    """Remove a family added with ``register`` (tests clean up with this)."""
    _FAMILIES.pop(name, None)


def families() -> list[Family]:
    """Every declared family, in detection order."""
    return list(_FAMILIES.values())


def declared(name: str) -> Family | None:
    return _FAMILIES.get(name)


def family(name: str) -> Family:
    """The family declared as ``name``; unknown names raise ``ValueError``."""
    try:
        return _FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(_FAMILIES)) or "none"
        raise ValueError(f"unknown tool format {name!r}; known: {known}") from None


def names() -> list[str]:
    """Names accepted as ``tool_format``."""
    return sorted(_FAMILIES)


def template_patches() -> list[TemplatePatch]:
    """Every family's template repairs, in table order."""
    return [p for f in _FAMILIES.values() for p in f.patches]


def end_markers() -> frozenset[str]:
    """Every declared end-of-turn marker: a tokenizer's control token with one of these texts
    stops generation even when its files name a different EOS (Qwen's ``<|endoftext|>`` vs
    ``<|im_end|>``, Llama 3's ``<|eot_id|>`` vs ``<|end_of_text|>``)."""
    return frozenset(m for f in _FAMILIES.values() for m in f.ends) | frozenset(OTHER_ENDS)


for _declared in FAMILIES:
    register(_declared)
