"""Round trip over the llama.cpp template corpus: a template's own rendering of tool calls,
as tokens, parses back to the same calls, whole and streamed one token at a time.

For every template the expected ``detect_format`` result is pinned in ``EXPECTED``. For every
tool-capable one, an assistant message with tool calls (one call; two parallel calls; arguments
with nested JSON, unicode, quotes and backslashes; with and without reasoning) is rendered with
``ChatTemplate``; the assistant turn is the render of ``[system, user, assistant]`` minus the
render of ``[system, user]`` with the generation prompt. Where a template's generation prompt
opens something its finished turn writes differently (an open ``<think>`` rendered as
``<think></think>`` or left out), the turn starts after their common prefix, and whether it
starts inside reasoning follows from that prefix (see ``assistant_turn``).

The end-of-turn marker (the stop token, never part of the parsed text) is stripped; the text is
tokenized with the family's corpus vocabulary where there is one, otherwise with GPT-2 plus the
special-looking markers of the corpus templates added as special tokens (``stand_in``), and
decoded back. Parsing must give the same calls (names, and arguments as JSON-equal objects) with
status ``ok``, no content, and the reasoning where the template rendered it; feeding the tokens
one at a time through ``IncrementalDetokenizer`` must give deltas that reassemble to the
whole-text result.

Templates that do not render tool calls at all are listed with the reason; those whose model
family has a known syntax are checked on a hand-written completion instead (``SYNTHETIC``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import pytest
import tokenizers
from jinja2.ext import loopcontrols
from jinja2.sandbox import SandboxedEnvironment
from transformers.utils.chat_template_utils import render_jinja_template

import turnstile_testbed as testbed
from turnstile.chat.detokenize import IncrementalDetokenizer
from turnstile.chat.template import ChatTemplate
from turnstile.chat.tokenizer import LoadedTokenizer, load_tokenizer
from turnstile.parsing import ParsedMessage, Parser
from turnstile.parsing.detect import FormatChoice, detect_format

pytestmark = pytest.mark.unit

TEMPLATES_DIR = testbed.templates_dir()
MODELS_DIR = testbed.models_dir()
STAND_IN = "gpt-2"


@dataclass(frozen=True)
class Expect:
    """What the corpus template is and how to render it.

    ``fmt``/``reasoning``: the expected ``detect_format`` result. ``tok``: the corpus vocabulary
    of the family (``ggml-vocab-<tok>.gguf``), None for the stand-in. ``eot``: what the template
    writes after the sampled turn (the stop token and any separator). ``parallel``: the template
    renders two calls in one message. ``render``: ``lenient`` (written for llama.cpp's Jinja,
    not transformers' immutable sandbox), ``strargs`` (arguments must stay JSON strings),
    ``legacy_tools`` (Cohere's old tool schema), ``functions`` (FireFunction's variables).
    ``no_tools``: why the template cannot be round-tripped (it drops tool calls).
    ``turn_after``: the assistant turn starts at this marker's first occurrence after the user
    message and ends at the end-of-turn marker (for templates that render the turn's
    surroundings differently once it exists: trailing instructions, moved tool lists).
    """

    fmt: str | None
    reasoning: bool = False
    tok: str | None = None
    eot: str = ""
    parallel: bool = True
    render: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    no_tools: str = ""
    turn_after: str = ""


DROPS = "renders no tool calls (drops assistant tool_calls)"
IM_END = "<|im_end|>\n"
DS_EOS = "<｜end▁of▁sentence｜>"
LLAMA3_GEN = "<|start_header_id|>assistant<|end_header_id|>\n\n"

EXPECTED: dict[str, Expect] = {
    "Apertus-8B-Instruct": Expect("apertus", True),
    "Apriel-1.6-15b-Thinker-fixed": Expect("apriel", True),
    "Bielik-11B-v3.0-Instruct": Expect("hermes", True, eot=IM_END),
    "ByteDance-Seed-OSS": Expect("seed_oss", True, eot="<seed:eos>"),
    "Cohere2MoE": Expect("cohere", True, "command-r", eot="<|END_OF_TURN_TOKEN|>"),
    "CohereForAI-c4ai-command-r-plus-tool_use": Expect(
        # the template writes no end of turn after tool calls, only the next (system) turn
        "command_r",
        tok="command-r",
        eot="\n<|START_OF_TURN_TOKEN|>",
        render="legacy_tools",
        turn_after="<|CHATBOT_TOKEN|>",
    ),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": Expect(
        "cohere", True, "command-r", eot="<|END_OF_TURN_TOKEN|>", turn_after="<|CHATBOT_TOKEN|>"
    ),
    "GLM-4.6": Expect("glm45", True),
    "GLM-4.7-Flash": Expect("glm45", True),
    "GigaChat3-10B-A1.8B": Expect("gigachat", eot="<|message_sep|>\n\n", parallel=False),
    "GigaChat3.1-10B-A1.8B": Expect("gigachat", eot="<|message_sep|>\n\n", parallel=False),
    "HuggingFaceTB-SmolLM3-3B": Expect("hermes", True, no_tools=DROPS),
    "Kimi-K2-Instruct": Expect("kimi_k2", eot="<|im_end|>", render="lenient"),
    "Kimi-K2-Thinking": Expect("kimi_k2", True, eot="<|im_end|>", render="lenient"),
    "Kimi-K3": Expect("kimi_k3", True, eot="<|end_of_msg|>"),
    "LFM2-8B-A1B": Expect("lfm2", no_tools=DROPS),
    "LFM2.5-8B-A1B": Expect("lfm2", True, eot=IM_END),
    "LFM2.5-Instruct": Expect("lfm2", no_tools=DROPS),
    "MiMo-VL": Expect("hermes", tok="qwen2", eot=IM_END),
    "MiniMax-M1": Expect("minimax_m1", eot="<end_of_sentence>\n"),
    "MiniMax-M2": Expect("minimax_m2", True, eot="[e~[\n"),
    "MiniMax-M3": Expect("minimax_m3", True, eot="[e~[\n"),
    "Mistral-Small-3.2-24B-Instruct-2506": Expect("mistral", eot="<EOS>"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": Expect("qwen3_coder", True, eot=IM_END),
    "NVIDIA-Nemotron-Nano-v2": Expect("nemotron_v2", True, eot="<SPECIAL_12>\n\n"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": Expect("hermes", tok="llama-bpe", eot=IM_END),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": Expect("hermes", tok="llama-bpe", eot=IM_END),
    "Qwen-QwQ-32B": Expect("hermes", True, "qwen2", eot=IM_END),
    "Qwen-Qwen2.5-7B-Instruct": Expect("hermes", tok="qwen2", eot=IM_END),
    "Qwen-Qwen3-0.6B": Expect("hermes", True, "qwen2", eot=IM_END),
    "Qwen3-Coder": Expect("qwen3_coder", tok="qwen2", eot=IM_END),
    "Qwen3.5-4B": Expect("qwen3_coder", True, "qwen35", eot=IM_END),
    "Reka-Edge": Expect("hermes", True, eot="\n\n<sep>"),
    "Spark2.5": Expect("glm45", True, eot=DS_EOS),
    "StepFun3.5-Flash": Expect("qwen3_coder", True, eot=IM_END),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": Expect(
        "deepseek_v3", True, "llama-bpe", no_tools=DROPS
    ),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": Expect(
        "deepseek_v3", True, "qwen2", eot=DS_EOS + "<｜Assistant｜>" + DS_EOS
    ),
    "deepseek-ai-DeepSeek-V3.1": Expect("deepseek_v3", True, "deepseek-llm", eot=DS_EOS),
    "deepseek-ai-DeepSeek-V3.2": Expect("deepseek_dsml", True, "deepseek-llm", eot=DS_EOS),
    "deepseek-ai-DeepSeek-V4-Flash-0731": Expect("deepseek_dsml", True, "deepseek-llm", eot=DS_EOS),
    "deepseek-ai-DeepSeek-V4": Expect("deepseek_dsml", True, "deepseek-llm", eot=DS_EOS),
    "fireworks-ai-llama-3-firefunction-v2": Expect(
        "firefunction_v2", tok="llama-bpe", eot="<|eot_id|>" + LLAMA3_GEN, render="functions"
    ),
    "google-gemma-2-2b-it": Expect(None, no_tools="no tool support (rejects system/tool roles)"),
    "google-gemma-4-31B-it-interleaved": Expect("gemma4", True, "gemma-4", eot="<turn|>\n"),
    "google-gemma-4-31B-it": Expect("gemma4", True, "gemma-4", eot="<|tool_response>"),
    "ibm-granite-granite-3.3-2B-Instruct": Expect("granite", True, no_tools=DROPS),
    "ibm-granite-granite-4.0": Expect("hermes", eot="<|end_of_text|>\n"),
    "ibm-granite-granite-4.1": Expect("hermes", eot="<|end_of_text|>\n"),
    "inclusionai-ling-3.0-flash": Expect("glm45", True, eot="<|role_end|>"),
    "llama-cpp-deepseek-r1": Expect(
        "deepseek_v3", True, "deepseek-llm", eot=DS_EOS, render="lenient"
    ),
    "llama-cpp-rwkv-world": Expect(None, True, no_tools=DROPS),
    "meetkai-functionary-medium-v3.1": Expect(
        "functionary_v3_1", tok="llama-bpe", eot="<|eom_id|>"
    ),
    "meetkai-functionary-medium-v3.2": Expect(
        "functionary_v3_2", tok="llama-bpe", eot="<|eot_id|>", render="strargs"
    ),
    "meta-llama-Llama-3.1-8B-Instruct": Expect(
        "llama3_json", tok="llama-bpe", eot="<|eot_id|>", parallel=False
    ),
    "meta-llama-Llama-3.2-3B-Instruct": Expect(
        "llama3_json", tok="llama-bpe", eot="<|eot_id|>", parallel=False
    ),
    "meta-llama-Llama-3.3-70B-Instruct": Expect(
        "llama3_json", tok="llama-bpe", eot="<|eot_id|>", parallel=False
    ),
    "microsoft-Phi-3.5-mini-instruct": Expect(None, tok="phi-3", no_tools=DROPS),
    "mistralai-Ministral-3-14B-Reasoning-2512": Expect("mistral", True, eot="<EOS>"),
    "mistralai-Mistral-Nemo-Instruct-2407": Expect("mistral", eot="<EOS>", turn_after="[/INST]"),
    "moonshotai-Kimi-K2": Expect("kimi_k2", eot="<|im_end|>"),
    "muse-glimmer": Expect("glimmer", True, eot="<|eot|>"),
    "openai-gpt-oss-120b": Expect("harmony", True, eot="<|call|>", parallel=False),
    "openbmb-MiniCPM5-1B": Expect("minicpm5", True, eot=IM_END),
    "poolside-Laguna-S-2.1": Expect("glm45", True, eot="</assistant>\n"),
    "poolside-Laguna-XS-2.1": Expect("glm45", True, eot="</assistant>\n"),
    "poolside-Laguna-XS.2": Expect("glm45", True, eot="</assistant>\n"),
    "tencent-Hy3": Expect("hy3", True, eot="<｜hy_eos:opensource｜>"),
    "unsloth-Apriel-1.5": Expect("apriel", eot="\n<|end|>\n<EOS>"),
    "unsloth-mistral-Devstral-Small-2507": Expect("mistral", eot="<EOS>"),
    "upstage-Solar-Open-100B": Expect("solar_open", True, eot="<|calls|>"),
}

# Hand-written completions for templates that drop tool calls, in their family's syntax.
SYNTHETIC: dict[str, str] = {
    "HuggingFaceTB-SmolLM3-3B": (
        "<think>\nPlan.\n</think>\n<tool_call>\n{CALL0}\n</tool_call>\n<tool_call>\n{CALL1}\n"
        "</tool_call>"
    ),
    "LFM2-8B-A1B": "<|tool_call_start|>[{PY0}, {PY1}]<|tool_call_end|>",
    "LFM2.5-Instruct": "<|tool_call_start|>[{PY0}, {PY1}]<|tool_call_end|>",
    "ibm-granite-granite-3.3-2B-Instruct": "<|tool_call|>[{CALL0}, {CALL1}]",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": (
        "Plan.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        "get_weather\n```json\n{ARGS0}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
        "<｜tool▁sep｜>search\n```json\n{ARGS1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "opts": {"type": "object", "description": "Options"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "description": "Query"},
                    "limit": {"type": "integer", "description": "Max results"},
                    "exact": {"type": "boolean", "description": "Exact match"},
                },
                "required": ["q"],
            },
        },
    },
]
NESTED = {"city": "Paris", "opts": {"units": "C", "days": [1, 2], "hourly": {"from": 6, "to": 18}}}
TRICKY = {"q": 'café "quoted" \\ 日本語 <b>&amp;', "limit": 5, "exact": True}
CALLS = {"get_weather": NESTED, "search": TRICKY}
SCENARIOS = {
    "one": (["get_weather"], False),
    "two": (["get_weather", "search"], False),
    "unicode": (["search"], False),
    "reasoning": (["get_weather", "search"], True),
}
REASONING = "I should call the tools."
USER = "Weather in Paris, and search for it?"


# --- rendering ----------------------------------------------------------------------------------


def _lenient_tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
    def default(obj: Any) -> Any:
        if hasattr(obj, "__iter__"):
            return list(obj)
        raise TypeError(type(obj).__name__)

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, default=default, **kw)


@functools.cache
def _lenient_env() -> SandboxedEnvironment:
    """For templates written for llama.cpp's Jinja (``list.append``, ``tojson`` on generators)."""
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = _lenient_tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)
    return env


SPECIAL = {"bos_token": "<BOS>", "eos_token": "<EOS>"}


def render(name: str, messages: list[dict], gen: bool) -> str:
    exp = EXPECTED[name]
    source = (TEMPLATES_DIR / f"{name}.jinja").read_text()
    tools: list[dict] = TOOLS
    variables: dict[str, Any] = {**SPECIAL, **exp.kwargs}
    if exp.render == "legacy_tools":
        tools = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "parameter_definitions": {
                    k: {"description": v["description"], "type": v["type"], "required": True}
                    for k, v in t["function"]["parameters"]["properties"].items()
                },
            }
            for t in TOOLS
        ]
    if exp.render == "functions":
        variables["functions"] = json.dumps([t["function"] for t in TOOLS])
        variables["datetime"] = "2026-01-01"
    if exp.render == "lenient":
        template = _lenient_env().from_string(source)
        return template.render(
            messages=_dict_args(messages), tools=tools, add_generation_prompt=gen, **variables
        )
    if exp.render == "strargs":
        rendered, _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=gen,
            **variables,
        )
        return rendered[0]
    return ChatTemplate(source, variables).render(messages, tools, add_generation_prompt=gen)


def _dict_args(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {
                **m,
                "tool_calls": [
                    {
                        **c,
                        "function": {
                            **c["function"],
                            "arguments": json.loads(c["function"]["arguments"]),
                        },
                    }
                    for c in m["tool_calls"]
                ],
            }
        out.append(m)
    return out


def assistant_turn(name: str, calls: list[str], reasoning: bool) -> tuple[bool, str]:
    """(whether the turn starts inside reasoning, its text without the end-of-turn marker)."""
    head = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": USER}]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call{i + 1:05d}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(CALLS[n], ensure_ascii=False)},
            }
            for i, n in enumerate(calls)
        ],
    }
    if reasoning:
        message["reasoning_content"] = REASONING
    exp = EXPECTED[name]
    choice = detect_format((TEMPLATES_DIR / f"{name}.jinja").read_text())
    prompt = render(name, head, gen=True)
    full = render(name, [*head, message], gen=False)
    if exp.turn_after:  # templates that render the turn's surroundings differently
        start = full.index(exp.turn_after, full.rindex(USER)) + len(exp.turn_after)
        text = full[start : full.index(exp.eot, start) + len(exp.eot)]
        started = choice.reasoning_started(full[:start])
    elif full.startswith(prompt):
        text, started = full[len(prompt) :], choice.reasoning_started(prompt)
    else:
        # The generation prompt opens something the finished turn writes differently (an open
        # <think> the finished turn renders as <think></think>, or omits): the turn starts after
        # their common prefix, cut back to a marker boundary. It starts inside reasoning if that
        # prefix opened it, or if the generation prompt did and the turn closes it.
        bare = render(name, head, gen=False)
        assert full.startswith(bare) and prompt.startswith(bare), name
        turn, opener = full[len(bare) :], prompt[len(bare) :]
        k = 0
        while k < min(len(turn), len(opener)) and turn[k] == opener[k]:
            k += 1
        k = max(turn.rfind(c, 0, k) for c in ">]\n") + 1
        text = turn[k:]
        close = choice.reasoning_tags[1] if choice.reasoning_tags else None
        started = choice.reasoning_started(bare + turn[:k]) or (
            choice.reasoning_started(prompt) and close is not None and close in text
        )
    assert text.endswith(exp.eot), (name, text[-80:])
    return started, text[: len(text) - len(exp.eot)]


# --- tokenizers ---------------------------------------------------------------------------------

SPECIAL_RE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^<>｜]{1,40}｜>|\[/?[A-Z][A-Z_]{1,30}\]|<SPECIAL_\d+>"
    r"|</?seed:[a-z_]+>|</?[a-z_]+:opensource>|\]<\]minimax\[>\[|\]~b\]|\[e~\["
)


@functools.cache
def corpus_tokenizer(vocab: str) -> LoadedTokenizer:
    return load_tokenizer(str(MODELS_DIR / f"ggml-vocab-{vocab}.gguf"))


@functools.cache
def stand_in() -> LoadedTokenizer:
    """GPT-2 plus every special-looking marker of the corpus templates as a special token.

    Built once for all templates (each marker is one token, as in the family's own vocabulary;
    a marker only matters where a template writes it). Markers the templates assemble at
    render time (Hunyuan's ``'<tool_call' + ':opensource' + '>'``) stay ordinary text.
    """
    markers: set[str] = set()
    for path in TEMPLATES_DIR.glob("*.jinja"):
        markers.update(SPECIAL_RE.findall(path.read_text()))
    base = corpus_tokenizer(STAND_IN)
    backend = tokenizers.Tokenizer.from_str(base.tokenizer.to_str())
    backend.add_special_tokens([tokenizers.AddedToken(m, special=True) for m in sorted(markers)])
    return dataclasses.replace(base, tokenizer=backend)


def tokenizer_for(name: str) -> LoadedTokenizer:
    vocab = EXPECTED[name].tok
    return corpus_tokenizer(vocab) if vocab is not None else stand_in()


# --- parsing helpers ----------------------------------------------------------------------------


def ids(i: int, _name: str = "") -> str:
    return f"call_{i}"


def make_parser(choice: FormatChoice, started: bool) -> Parser:
    return Parser(
        choice.reasoning,
        choice.tool_format,
        started,
        reasoning_tags=choice.reasoning_tags,
        tools=TOOLS,
        id_factory=ids,
    )


def parse_whole(choice: FormatChoice, started: bool, text: str) -> ParsedMessage:
    parser = make_parser(choice, started)
    parser.feed(text)
    parser.finish()
    return parser.result()


def parse_streamed(
    choice: FormatChoice, started: bool, tok: LoadedTokenizer, token_ids: list[int]
) -> tuple[list[dict], ParsedMessage]:
    parser = make_parser(choice, started)
    detok = IncrementalDetokenizer(tok)
    deltas: list[dict] = []
    for token in token_ids:
        piece = detok.push(token)
        if piece:
            deltas += parser.feed(piece)
    tail = detok.flush()
    if tail:
        deltas += parser.feed(tail)
    deltas += parser.finish()
    return deltas, parser.result()


def reassemble(deltas: list[dict]) -> tuple[str, str, list[dict]]:
    """What a streaming OpenAI client rebuilds (names first, then argument fragments)."""
    content, reasoning, calls = [], [], []
    for delta in deltas:
        ((key, value),) = delta.items()
        if key == "content":
            content.append(value)
        elif key == "reasoning_content":
            reasoning.append(value)
        else:
            for tc in value:
                if "id" in tc:
                    assert tc["index"] == len(calls) and tc["function"]["name"]
                    calls.append(
                        {"id": tc["id"], "type": "function", "function": dict(tc["function"])}
                    )
                else:
                    assert tc["index"] == len(calls) - 1
                    calls[-1]["function"]["arguments"] += tc["function"]["arguments"]
    return "".join(content), "".join(reasoning), calls


def call_objects(message: ParsedMessage) -> list[tuple[str, Any]]:
    return [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for tc in message.tool_calls
    ]


def check_round_trip(name: str, started: bool, text: str, expected: list[str]) -> None:
    choice = detect_format((TEMPLATES_DIR / f"{name}.jinja").read_text())
    tok = tokenizer_for(name)
    token_ids = tok.encode(text)
    decoded = tok.decode(token_ids)
    assert decoded == text, name  # the vocabulary round-trips the turn's text
    whole = parse_whole(choice, started, decoded)
    assert whole.parse_status == "ok", (name, decoded, whole)
    assert call_objects(whole) == [(n, CALLS[n]) for n in expected], (name, decoded, whole)
    assert not (whole.content or "").strip(), (name, whole.content)
    if REASONING in decoded:
        assert REASONING in (whole.reasoning_content or ""), (name, whole)
    deltas, streamed = parse_streamed(choice, started, tok, token_ids)
    assert streamed == whole, name
    content, reasoning, calls = reassemble(deltas)
    assert content == (whole.content or "")
    assert reasoning == (whole.reasoning_content or "")
    assert calls == whole.tool_calls


# --- tests --------------------------------------------------------------------------------------


def test_every_corpus_template_is_listed() -> None:
    corpus = {p.stem for p in TEMPLATES_DIR.glob("*.jinja")}
    assert corpus == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detected_format(name: str) -> None:
    choice = detect_format((TEMPLATES_DIR / f"{name}.jinja").read_text())
    exp = EXPECTED[name]
    assert (choice.tool_format, choice.reasoning) == (exp.fmt, exp.reasoning)


ROUND_TRIPS = [
    (name, scenario)
    for name, exp in sorted(EXPECTED.items())
    if not exp.no_tools
    for scenario, (calls, reasoning) in SCENARIOS.items()
    if (exp.parallel or len(calls) == 1) and (exp.reasoning or not reasoning)
]


ROUND_TRIP_IDS = [f"{n}-{s}" for n, s in ROUND_TRIPS]


@pytest.mark.parametrize(("name", "scenario"), ROUND_TRIPS, ids=ROUND_TRIP_IDS)
def test_round_trip(name: str, scenario: str) -> None:
    calls, reasoning = SCENARIOS[scenario]
    started, text = assistant_turn(name, calls, reasoning)
    check_round_trip(name, started, text, calls)


def _synthetic_text(name: str) -> str:
    subs = {
        "CALL0": json.dumps({"name": "get_weather", "arguments": NESTED}, ensure_ascii=False),
        "CALL1": json.dumps({"name": "search", "arguments": TRICKY}, ensure_ascii=False),
        "ARGS0": json.dumps(NESTED, ensure_ascii=False),
        "ARGS1": json.dumps(TRICKY, ensure_ascii=False),
        "PY0": "get_weather(city='Paris', opts=" + json.dumps(NESTED["opts"]) + ")",
        "PY1": "search(q=" + repr(TRICKY["q"]) + ", limit=5, exact=true)",
    }
    text = SYNTHETIC[name]
    for key, value in subs.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_round_trip(name: str) -> None:
    """Templates that drop tool calls: the family's own syntax, hand-written, still parses."""
    prompt = render(name, [{"role": "user", "content": "Hi"}], gen=True)
    choice = detect_format((TEMPLATES_DIR / f"{name}.jinja").read_text())
    started = choice.reasoning_started(prompt)
    check_round_trip(name, started, _synthetic_text(name), ["get_weather", "search"])


def test_no_tools_templates_are_explained() -> None:
    without = {n for n, e in EXPECTED.items() if e.no_tools}
    assert without == {
        "HuggingFaceTB-SmolLM3-3B",
        "LFM2-8B-A1B",
        "LFM2.5-Instruct",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        "google-gemma-2-2b-it",
        "ibm-granite-granite-3.3-2B-Instruct",
        "llama-cpp-rwkv-world",
        "microsoft-Phi-3.5-mini-instruct",
    }
