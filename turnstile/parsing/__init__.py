"""Completion text -> OpenAI assistant message, whole or incrementally for streaming.

``Parser`` (one per completion) splits a leading reasoning block (``<think>`` or the family's
own tags) into ``reasoning_content`` and hands the rest to a tool-call format registered by
name. ``detect_format(template_source)`` picks the format, the reasoning tags and whether a
prompt opened the block, from the chat template; ``FormatChoice.parser(prompt, tools)`` builds
the Parser for one request.

Every model family is one declared record (``turnstile.families``, the table ``table``): its
detection, reasoning tags, parser, grammar, tool-call ID style and template patches; the
registry, ``detect`` and ``grammar`` derive from it. Most parsers are a ``Regions`` shape over one
of three shared regions (``tagged``, ``jsonlist``, ``xmlcalls``; see ``base``); a family whose
syntax needs code has a module named after it. Adding a family that reuses a shape is one row
in ``turnstile.families.table`` (or ``register_family`` with a record declared elsewhere).

Guarantees others rely on:
  * ``result()`` equals the concatenation of all deltas from ``feed``/``finish``, and does not
    depend on chunking; ``parse(text, ...)`` is the same as streaming ``text``.
  * Parsing never raises on model output; problems show in ``parse_status`` and unparsable
    calls stay in ``content`` as raw text (a call already announced while streaming is kept,
    with the arguments the model wrote, and the status says it is malformed).
  * Time is linear in the completion length, whatever the chunking.
  * The text is the completion without its final stop token (as the gateway decodes it).
"""

from ..families.record import Family, JsonGrammar, Regions, Template, TemplatePatch, XmlGrammar
from .detect import FormatChoice, detect_format
from .parser import Parser, parse
from .reasoning import ThinkSplitter
from .registry import (
    create_tool_parser,
    families,
    register_family,
    register_tool_format,
    tool_formats,
    unregister_family,
)
from .types import (
    STATUS_MALFORMED_TOOL_CALL,
    STATUS_OK,
    STATUS_UNCLOSED_REASONING,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Issue,
    ParsedMessage,
    Reasoning,
    Text,
    ToolCallParser,
    ToolSchemas,
)

__all__ = [
    "STATUS_MALFORMED_TOOL_CALL",
    "STATUS_OK",
    "STATUS_UNCLOSED_REASONING",
    "ArgsDelta",
    "CallEnd",
    "CallStart",
    "Event",
    "Family",
    "FormatChoice",
    "Issue",
    "JsonGrammar",
    "ParsedMessage",
    "Parser",
    "Reasoning",
    "Regions",
    "Template",
    "TemplatePatch",
    "Text",
    "ThinkSplitter",
    "ToolCallParser",
    "ToolSchemas",
    "XmlGrammar",
    "create_tool_parser",
    "detect_format",
    "families",
    "parse",
    "register_family",
    "register_tool_format",
    "tool_formats",
    "unregister_family",
]
