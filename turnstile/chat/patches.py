"""Declared template repairs: small, named text substitutions, applied when a template has the
exact text they target, and recorded in every call's template fingerprint.

Each exists because the template is not prefix-preserving for tool results, which would force
a new segment on every tool call; ``tests/test_template_audit.py`` shows the stock template
failing and the patched one passing. A repair is declared on its model family's record
(``turnstile.families``, field ``patches``); this module applies them.
"""

from __future__ import annotations

from ..families import TemplatePatch, template_patches

__all__ = ["TemplatePatch", "apply_patches", "template_patches"]


def apply_patches(source: str, enabled: bool = True) -> tuple[str, list[str]]:
    """The template with every applicable patch applied, and the names of those applied."""
    applied = []
    if enabled:
        for p in template_patches():
            if p.old in source:
                source = source.replace(p.old, p.new)
                applied.append(p.name)
    return source, applied
