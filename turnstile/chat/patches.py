"""Declared template repairs: small, named text substitutions, applied when a template has the
exact text they target, and recorded in every call's template fingerprint.

Each exists because the template is not prefix-preserving for tool results, which would force
a new segment on every tool call; ``tests/test_template_audit.py`` shows the stock template
failing and the patched one passing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplatePatch:
    name: str
    why: str
    old: str
    new: str


PATCHES = (
    TemplatePatch(
        name="qwen3-stable-think-block",
        why="Qwen3 writes an assistant turn's <think> block only while the turn is last or has "
            "reasoning (`loop.last`), so appending a tool result re-renders the turn it follows. "
            "Writing the block whenever the turn follows the last user query keeps it stable; "
            "the render of ordinary chats is unchanged.",
        old="{%- if loop.last or (not loop.last and reasoning_content) %}",
        new="{%- if true %}",
    ),
)


def apply_patches(source: str, enabled: bool = True) -> tuple[str, list[str]]:
    """The template with every applicable patch applied, and the names of those applied."""
    applied = []
    if enabled:
        for p in PATCHES:
            if p.old in source:
                source = source.replace(p.old, p.new)
                applied.append(p.name)
    return source, applied
