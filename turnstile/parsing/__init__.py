"""Completion text -> OpenAI assistant message, whole or incrementally for streaming.

``Parser`` (one per completion) splits a leading reasoning block (``<think>`` or the family's
own tags) into ``reasoning_content`` and hands the rest to a tool-call format registered by
name. ``detect_format(template_source)`` picks the format, the reasoning tags and whether a
prompt opened the block, from the chat template; ``FormatChoice.parser(prompt, tools)`` builds
the Parser for one request.

Formats (one module per family): ``hermes`` (Hermes, Qwen2.5/3, QwQ, Granite 4, MiMo, Bielik,
Reka, SmolLM3), ``qwen3_coder`` (Qwen3-Coder/3.5, Nemotron-3, StepFun), ``seed_oss``, ``glm45``
(GLM-4.5+, Laguna, Spark, Ling), ``hy3``, ``minicpm5``, ``minimax_m1``/``_m2``/``_m3``,
``deepseek_v3`` (V3, R1 and distills, V3.1), ``deepseek_dsml`` (V3.2, V4), ``kimi_k2``,
``kimi_k3``, ``mistral`` (both ``[TOOL_CALLS]`` forms), ``llama3_json`` (with
``<|python_tag|>``), ``functionary_v3_1``/``_v3_2``, ``harmony`` (gpt-oss), ``glimmer``,
``gemma4``, ``lfm2``, ``granite`` (3.x), ``cohere``/``command_r``, ``apertus``, ``apriel``,
``nemotron_v2``, ``firefunction_v2``, ``gigachat``, ``solar_open``. Most are a configuration of
one of three shared regions (``tagged``, ``jsonlist``, ``xmlcalls``; see ``base``). Adding a
family means one module that subclasses ``ToolCallParser`` (usually ``base.RegionParser``),
decorates it with ``register_tool_format("<name>")`` and is imported below, plus a detection
rule in ``detect``.

Guarantees others rely on:
  * ``result()`` equals the concatenation of all deltas from ``feed``/``finish``, and does not
    depend on chunking; ``parse(text, ...)`` is the same as streaming ``text``.
  * Parsing never raises on model output; problems show in ``parse_status`` and unparsable
    calls stay in ``content`` as raw text (a call already announced while streaming is kept,
    with the arguments the model wrote, and the status says it is malformed).
  * Time is linear in the completion length, whatever the chunking.
  * The text is the completion without its final stop token (as the gateway decodes it).
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
from .detect import FormatChoice, detect_format
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
    "FormatChoice",
    "Issue",
    "ParsedMessage",
    "Parser",
    "Reasoning",
    "Text",
    "ThinkSplitter",
    "ToolCallParser",
    "ToolSchemas",
    "create_tool_parser",
    "detect_format",
    "parse",
    "register_tool_format",
    "tool_formats",
]
