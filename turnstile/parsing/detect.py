"""Pick the parsing setup for a model from its chat template source.

The template is the one artefact every model ships that spells out its tool-call and reasoning
syntax, so a few unambiguous markers in it identify the family. Rules are ordered from the most
specific marker to the most generic (``<tool_call>`` is shared by Hermes, GLM and Qwen3-Coder,
which are told apart by what sits inside it). The expected result for every template of the
llama.cpp corpus is pinned in ``tests/test_parsing_roundtrip.py``.

Usage (once per template, then once per request)::

    choice = detect_format(template.source)
    parser = choice.parser(prompt_text, tools=request_tools, tool_calls=bool(request_tools))

``prompt_text`` is the rendered prompt (its tail is enough): whether it ends inside an opened
reasoning block (``<think>\\n`` from ``enable_thinking``) is a per-request fact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .call_ids import id_factory
from .parser import Parser
from .registry import format_class

THINK = ("<think>", "</think>")


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


def _has(src: str, *needles: str) -> bool:
    return all(n in src for n in needles)


@dataclass(frozen=True)
class Rule:
    """One family: how to recognise its template and what to parse it with.

    Reasoning is on when the template contains both ``tags`` (or when ``reasoning_if`` says so,
    for templates that assemble their tags from variables). Formats whose syntax carries its own
    reasoning channel (Harmony, Glimmer) have ``tags`` None and ``owns_reasoning``.
    """

    family: str
    matches: Callable[[str], bool]
    tool_format: str | None
    tags: tuple[str, str] | None = THINK
    started_after: tuple[str, ...] = ()
    reasoning_if: Callable[[str], bool] | None = None
    owns_reasoning: bool = False
    id_style: str = "openai"

    def choice(self, src: str) -> FormatChoice:
        ids = self.id_style
        if self.owns_reasoning:
            return FormatChoice(self.tool_format, True, None, (), self.family, ids)
        if self.tags is None:
            return FormatChoice(self.tool_format, False, None, (), self.family, ids)
        if self.reasoning_if is not None:
            reasoning = self.reasoning_if(src)
        else:
            reasoning = all(tag in src for tag in self.tags if tag)
        if not reasoning:
            return FormatChoice(self.tool_format, False, None, (), self.family, ids)
        return FormatChoice(self.tool_format, True, self.tags, self.started_after, self.family,
                            ids)


#: Ordered from the most specific marker to the most generic; the first match wins.
RULES: list[Rule] = [
    Rule("gpt-oss harmony", lambda s: _has(s, "<|channel|>", "<|message|>", "functions."),
         "harmony", None, owns_reasoning=True),
    Rule("muse glimmer (ATEM)", lambda s: "<atem:function_calls>" in s, "glimmer", None,
         owns_reasoning=True),
    Rule("kimi-k3", lambda s: _has(s, "<|open|>", "<|sep|>", "<|close|>"), "kimi_k3",
         ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
         reasoning_if=lambda s: "open_tag('think')" in s or "<|open|>think" in s),
    Rule("kimi-k2", lambda s: "<|tool_calls_section_begin|>" in s, "kimi_k2", id_style="kimi"),
    Rule("deepseek v3.2/v4 DSML", lambda s: "｜DSML｜" in s, "deepseek_dsml"),
    Rule("deepseek v3/r1/v3.1", lambda s: "tool▁call▁begin" in s, "deepseek_v3"),
    Rule("minimax-m3", lambda s: "]<]minimax[>[" in s, "minimax_m3", ("<mm:think>", "</mm:think>")),
    Rule("minimax-m2", lambda s: "<minimax:tool_call>" in s, "minimax_m2"),
    Rule("seed-oss", lambda s: "<seed:tool_call>" in s, "seed_oss",
         ("<seed:think>", "</seed:think>")),
    Rule("hunyuan-3", lambda s: _has(s, ":opensource", "tool_call"), "hy3",
         ("<think:opensource>", "</think:opensource>"), reasoning_if=lambda s: "think" in s),
    Rule("gemma-4", lambda s: "<|tool_call>" in s, "gemma4", ("<|channel>thought", "<channel|>")),
    Rule("lfm2", lambda s: "<|tool_call_start|>" in s or "<|tool_list_start|>" in s
         or _has(s, "List of tools: [", "<|im_start|>"), "lfm2"),
    Rule("solar-open", lambda s: "<|tool_call:begin|>" in s, "solar_open",
         ("<|think|>", "<|end|>")),
    Rule("apertus", lambda s: "<|tools_prefix|>" in s, "apertus",
         ("<|inner_prefix|>", "<|inner_suffix|>")),
    Rule("cohere command-r7b/a", lambda s: "<|START_ACTION|>" in s, "cohere",
         ("<|START_THINKING|>", "<|END_THINKING|>")),
    Rule("cohere command-r tool_use",
         lambda s: _has(s, "Action:", "```json", "<|CHATBOT_TOKEN|>"), "command_r", None),
    Rule("apriel-1.6", lambda s: _has(s, "<tool_calls>", "Here are my reasoning steps:"), "apriel",
         ("", "[BEGIN FINAL RESPONSE]"), ("Here are my reasoning steps:",)),
    Rule("apriel", lambda s: _has(s, "<tool_calls>", "<|assistant|>"), "apriel", None),
    Rule("minimax-m1", lambda s: "<tool_calls>" in s, "minimax_m1"),
    Rule("mistral", lambda s: "[TOOL_CALLS]" in s, "mistral", ("[THINK]", "[/THINK]"),
         id_style="mistral9"),
    Rule("nemotron-nano-v2", lambda s: "<TOOLCALL>" in s, "nemotron_v2"),
    Rule("firefunction-v2", lambda s: "functools[" in s, "firefunction_v2", None),
    Rule("functionary v3.2", lambda s: _has(s, ">>>all", "recipient"), "functionary_v3_2", None),
    Rule("functionary v3.1",
         lambda s: _has(s, "<function=", "</function>", "<|start_header_id|>")
         and "<parameter=" not in s, "functionary_v3_1", None),
    Rule("minicpm5", lambda s: _has(s, "<function name=", "<param name="), "minicpm5"),
    Rule("granite 3.x", lambda s: "<|tool_call|>" in s, "granite"),
    Rule("gigachat", lambda s: _has(s, "function call", "<|role_sep|>")
         or "<|function_call|>" in s, "gigachat", None),
    Rule("glm-4.5+", lambda s: _has(s, "<tool_call>", "<arg_key>"), "glm45"),
    Rule("qwen3-coder xml", lambda s: _has(s, "<tool_call>", "<function=", "<parameter="),
         "qwen3_coder"),
    Rule("hermes", lambda s: "<tool_call>" in s, "hermes"),
    # SmolLM3 models emit Hermes calls; the corpus copy of its template omits the tools part.
    Rule("smollm3", lambda s: "SmolLM" in s, "hermes"),
    Rule("llama-3.x json", lambda s: "<|start_header_id|>" in s
         and ("<|python_tag|>" in s or '"parameters": ' in s), "llama3_json", None),
]
FALLBACK = Rule("no tool-call syntax recognised", lambda s: True, None)


def detect_format(template_source: str) -> FormatChoice:
    """The parsing setup for a chat template (see the module docstring)."""
    src = template_source or ""
    rule = next((r for r in RULES if r.matches(src)), FALLBACK)
    return rule.choice(src)
