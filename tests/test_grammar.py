"""Tool-call grammars, checked on a real llama-server: whatever a random model samples under
the grammar parses back, with the family's own parser, as a call to an offered tool whose
arguments follow the tool's schema."""

from __future__ import annotations

import json

import httpx
import pytest

from turnstile.chat.tokenizer import load_tokenizer
from turnstile.parsing import parse
from turnstile.parsing.grammar import supports, tool_call_grammar

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "required": ["city", "days"],
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                    "days": {"type": "integer"},
                    "note": {"type": "string"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "required": ["query", "exact"],
                "properties": {"query": {"type": "string"}, "exact": {"type": "boolean"}},
            },
        },
    },
]


# A random model rarely samples "<", which ends a free XML string value: enum there instead.
XML_TOOLS = [
    TOOLS[0],
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "required": ["query", "exact"],
                "properties": {
                    "query": {"type": "string", "enum": ["cats", "dogs"]},
                    "exact": {"type": "boolean"},
                },
            },
        },
    },
]


def _sample(url: str, prompt: list[int], g: str, seed: int, bias: list | None = None) -> str:
    body = {
        "prompt": prompt,
        "n_predict": 160,
        "temperature": 1.0,
        "top_k": 0,
        "min_p": 0,
        "seed": seed,
        "grammar": g,
        "return_tokens": True,
        "logit_bias": bias or [],
    }
    return httpx.post(url + "/completion", json=body, timeout=120).json()


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "qwen3_coder"])
def test_sampled_calls_parse_back(fmt, llama_tiny, tiny_qwen2):
    assert supports(fmt)
    tok = load_tokenizer(str(tiny_qwen2))
    prompt = tok.encode("<|im_start|>user\nCall a tool.<|im_end|>\n<|im_start|>assistant\n")
    tools = XML_TOOLS if fmt == "qwen3_coder" else TOOLS
    # Inside a free JSON string nearly every token is allowed and few close it: left alone, a
    # random model runs into n_predict there more or less often depending on the machine's
    # samples. '"' made ~50% likely at each step (where the grammar allows it) ends each
    # string within a few tokens, so every sample completes its call and is checked.
    quote = [[tok.tokenizer.token_to_id('"'), 12.0]]
    ok = 0
    for seed in range(4):
        for name in (None, "search"):
            out = _sample(llama_tiny, prompt, tool_call_grammar(fmt, tools, name), seed, quote)
            text = out["content"]
            assert out["stop_type"] == "eos", text  # the grammar completed
            msg = parse(text, reasoning=False, tool_format=fmt, tools=tools)
            assert msg.parse_status == "ok", text
            assert len(msg.tool_calls) == 1, text
            call = msg.tool_calls[0]["function"]
            args = json.loads(call["arguments"])
            if name:
                assert call["name"] == name
            if call["name"] == "get_weather":
                assert args["city"] in ("Paris", "Oslo") and isinstance(args["days"], int)
            else:
                assert isinstance(args["exact"], bool) and isinstance(args["query"], str)
            ok += 1
    assert ok == 8


def test_reasoning_may_close_before_the_call(llama_tiny, tiny_qwen2):
    tok = load_tokenizer(str(tiny_qwen2))
    prompt = tok.encode(
        "<|im_start|>user\nThink, then call.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    g = tool_call_grammar("hermes", TOOLS, "get_weather", reasoning_close="</think>")
    # each of the close's tokens ~50% likely at each step: the reasoning ends within a few
    close = [[t, 12.0] for t in tok.encode("</think>")]
    out = _sample(llama_tiny, prompt, g, 0, close)
    text = out["content"]
    assert out["stop_type"] == "eos", text  # the grammar completed
    assert "</think>\n\n<tool_call>" in text
    msg = parse(text, reasoning=True, tool_format="hermes", reasoning_started=True, tools=TOOLS)
    assert msg.tool_calls and msg.tool_calls[0]["function"]["name"] == "get_weather"
    assert msg.reasoning_content is not None


def test_unknown_function_is_refused():
    with pytest.raises(ValueError):
        tool_call_grammar("hermes", TOOLS, "nope")
