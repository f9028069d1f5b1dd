"""Completion text -> OpenAI assistant message, whole or incrementally for streaming.

``Parser`` (one per completion) splits a leading ``<think>`` block into ``reasoning_content``
and hands the rest to a tool-call format registered by name (``"hermes"`` for now). Adding a
family means one module that subclasses ``ToolCallParser``, decorates it with
``register_tool_format("<name>")`` and is imported below.

Guarantees others rely on:
  * ``result()`` equals the concatenation of all deltas from ``feed``/``finish``, and does not
    depend on chunking; ``parse(text, ...)`` is the same as streaming ``text``.
  * Parsing never raises on model output; problems show in ``parse_status`` and unparsable
    calls stay in ``content`` as raw text.
"""

from . import (  # noqa: F401  (each module registers its formats)
    apertus,
    apriel,
    cohere,
    deepseek,
    firefunction,
    functionary,
    gemma4,
    gigachat,
    glimmer,
    glm,
    granite,
    harmony,
    hermes,
    hy3,
    kimi,
    lfm2,
    llama3,
    minicpm,
    minimax,
    mistral,
    nemotron,
    qwen3_coder,
    seed_oss,
    solar,
)
from .parser import Parser, parse
from .reasoning import ThinkSplitter
from .registry import create_tool_parser, register_tool_format, tool_formats
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
    "Issue",
    "ParsedMessage",
    "Parser",
    "Reasoning",
    "Text",
    "ThinkSplitter",
    "ToolCallParser",
    "ToolSchemas",
    "create_tool_parser",
    "parse",
    "register_tool_format",
    "tool_formats",
]
