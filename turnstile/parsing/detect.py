"""Pick the parsing setup for a model from its chat template source.

The template is the one artefact every model ships that spells out its tool-call and reasoning
syntax, so a few unambiguous markers in it identify the family. Each family declares its kinds
of template (``family.Template``) in ``families``; they are tried in table order, the first
match wins. The expected result for every template of the llama.cpp corpus is pinned in
``tests/test_parsing_roundtrip.py``.

Usage (once per template, then once per request)::

    choice = detect_format(template.source)
    parser = choice.parser(prompt_text, tools=request_tools, tool_calls=bool(request_tools))

``prompt_text`` is the rendered prompt (its tail is enough): whether it ends inside an opened
reasoning block (``<think>\\n`` from ``enable_thinking``) is a per-request fact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..families.record import THINK, Family, Template
from .call_ids import id_factory
from .parser import Parser
from .registry import families, format_class

__all__ = ["FALLBACK", "THINK", "FormatChoice", "detect_format"]


@dataclass(frozen=True)
class FormatChoice:
    """How to parse completions of one chat template.

    ``tool_format``: a registered format name, or None (no tool-call syntax recognised).
    ``reasoning``: split reasoning from content. ``reasoning_tags``: the (open, close) markers
    of a leading reasoning block, or None when the format itself separates reasoning (Harmony
    channels) or there is none. ``started_after``: prompt endings that mean the generation
    prompt already opened the block (default: the open tag). ``family``: a short human label
    saying what was recognised.
    """

    tool_format: str | None
    reasoning: bool
    reasoning_tags: tuple[str, str] | None
    started_after: tuple[str, ...] = ()
    family: str = ""
    id_style: str = "openai"  # tool-call IDs the template expects (``parsing.call_ids``)

    def reasoning_started(self, prompt: str) -> bool:
        """Whether a completion of ``prompt`` begins inside the reasoning block."""
        if not self.reasoning or self.reasoning_tags is None:
            return False
        tail = prompt.rstrip()
        markers = self.started_after or (self.reasoning_tags[0],)
        return any(m.strip() and tail.endswith(m.strip()) for m in markers)

    def parser(
        self,
        prompt: str = "",
        tools: list[dict[str, Any]] | None = None,
        tool_calls: bool = True,
        calls_before: int = 0,
        **kwargs: Any,
    ) -> Parser:
        """A Parser for one completion of ``prompt`` (extra kwargs go to ``Parser``).

        ``prompt``: the rendered prompt, or its decoded tail. ``tools``: the request's tools
        (typing for XML-style arguments). ``tool_calls=False`` (no tools offered, or
        ``tool_choice: "none"``) leaves tool-call markup as content, except for formats whose
        syntax also carries reasoning and answer (Harmony, Glimmer), which are always parsed.
        """
        fmt = self.tool_format
        if not tool_calls and fmt is not None and not format_class(fmt).owns_reasoning:
            fmt = None
        kwargs.setdefault("id_factory", id_factory(self.id_style, calls_before))
        return Parser(
            self.reasoning,
            fmt,
            self.reasoning_started(prompt),
            reasoning_tags=self.reasoning_tags,
            tools=tools,
            **kwargs,
        )

    def with_tool_format(self, tool_format: str | None) -> FormatChoice:
        """The same choice with the tool format overridden (a ``--tool-parser`` flag)."""
        label = f"{self.family} (tool format overridden)"
        return dataclasses.replace(self, tool_format=tool_format, family=label)


#: What a template no family recognises gets: plain text, with ``<think>`` if it writes both tags.
FALLBACK = Template("no tool-call syntax recognised", lambda src: True)


def _choice(fam: Family | None, template: Template, src: str) -> FormatChoice:
    """The setup ``template`` of ``fam`` implies for this template source."""
    fmt = fam.name if fam is not None else None
    ids = fam.id_style if fam is not None else "openai"
    label = template.label
    if fmt is not None and format_class(fmt).owns_reasoning:
        return FormatChoice(fmt, True, None, (), label, ids)
    tags = template.think
    if tags is None:
        return FormatChoice(fmt, False, None, (), label, ids)
    if template.think_if is not None:
        reasoning = template.think_if(src)
    else:
        reasoning = all(tag in src for tag in tags if tag)
    if not reasoning:
        return FormatChoice(fmt, False, None, (), label, ids)
    return FormatChoice(fmt, True, tags, template.started_after, label, ids)


def detect_format(template_source: str) -> FormatChoice:
    """The parsing setup for a chat template (see the module docstring)."""
    src = template_source or ""
    for fam in families():
        for template in fam.detect:
            if template.matches(src):
                return _choice(fam, template, src)
    return _choice(None, FALLBACK, src)
