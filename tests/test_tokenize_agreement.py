"""Our tokenizers agree with llama-server's own ``/tokenize``, and our template rendering with
``transformers.apply_chat_template`` (what vLLM and SGLang render with)."""

from __future__ import annotations

import httpx
import pytest
from transformers import PreTrainedTokenizerFast

import turnstile_testbed as testbed
from turnstile.chat.template import ChatTemplate
from turnstile.chat.tokenizer import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

VOCABS = ["qwen2", "llama-bpe", "llama-spm", "gemma-4"]


def _samples(vocab: str) -> list[str]:
    raw = (testbed.models_dir() / f"ggml-vocab-{vocab}.gguf.inp").read_text()
    vectors = [t.removesuffix("\n") for t in raw.split("__ggml_vocab_test__\n") if t.strip()]
    extra = [
        "<|im_start|>user\nHAVING fun in Zürich? 🦙 x=1;\ty\n<|im_end|>\n",
        "  leading spaces and\n\n\ttabs",
        "数字 12345 and ½ unicode",
        "<s>[INST] hi [/INST]",
    ]
    return vectors[::3] + extra


@pytest.mark.parametrize("vocab", VOCABS)
def test_llama_server_tokenize_agrees(vocab: str):
    model = testbed.tiny_model(vocab)
    tok = load_tokenizer(str(model))
    texts = _samples(vocab)
    with testbed.llama_server(model, ctx=512, parallel=1) as url, httpx.Client() as http:
        for text in texts:
            r = http.post(
                url + "/tokenize",
                json={"content": text, "add_special": False, "parse_special": True},
            )
            assert r.json()["tokens"] == tok.encode(text), repr(text)


TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct",
    "meta-llama-Llama-3.1-8B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "Qwen3.5-4B",
    "openai-gpt-oss-120b",
]


@pytest.mark.parametrize("name", TEMPLATES)
def test_render_equals_transformers_apply_chat_template(name: str):
    base = load_tokenizer(str(testbed.models_dir() / "ggml-vocab-llama-bpe.gguf"))
    source = (testbed.templates_dir() / f"{name}.jinja").read_text()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=base.tokenizer, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    hf.chat_template = source
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call12345",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call12345", "content": "18 C"},
    ]
    expected = hf.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    ours = ChatTemplate(source, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    assert ours.render(messages, tools, add_generation_prompt=True) == expected
