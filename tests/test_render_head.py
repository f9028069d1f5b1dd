"""The stand-in head kept by ``Renderer._head`` (system message + tools + template kwargs):
a delta rendered with a kept head equals the template's own full render, a head that differs
in its system prompt, tools or kwargs is not taken for another, and a kept render that no
longer prefixes the stand-in is rendered again. Truth: the template's full render."""

from __future__ import annotations

import pytest

import turnstile_testbed as testbed
from turnstile.chat.render import HEADS_KEPT, Renderer
from turnstile.chat.template import ChatTemplate
from turnstile.chat.tokenizer import load_tokenizer

pytestmark = pytest.mark.unit

TOOL = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
OTHER = {**TOOL, "function": {**TOOL["function"], "name": "write"}}
CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a"}'}}


def _renderer() -> Renderer:
    tok = load_tokenizer(str(testbed.models_dir() / "ggml-vocab-qwen2.gguf"))
    source = (testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    return Renderer(tok, ChatTemplate(source, tok.special_tokens))


def _turn(system: str) -> tuple[list[dict], dict, list[dict]]:
    sys_msg = {"role": "system", "content": system}
    reply = {"role": "assistant", "content": "Reading it.", "tool_calls": [CALL]}
    new = [{"role": "tool", "tool_call_id": "c1", "content": f"contents for {system}"}]
    return [sys_msg, {"role": "user", "content": "go"}], reply, new


@pytest.mark.parametrize("order", ["same", "alternating"])
def test_a_kept_head_gives_the_full_render(order: str) -> None:
    r = _renderer()
    im_end = r.tok.encode("<|im_end|>")[0]
    heads = [("You are A.", [TOOL]), ("You are B.", [TOOL]), ("You are A.", [OTHER])]
    if order == "alternating":
        heads = heads * 3
    for system, tools in heads:
        hist, reply, new = _turn(system)
        full_before = r.render_full([*hist, reply], tools)
        delta, _ = r.extension(reply, new, tools, im_end, hist[0])
        # the recorded tokens end at the sampled stop token: prompt + reply + stop + delta
        reply_ids = r.encode_fragment(
            r.render([*hist, reply], tools, add_generation_prompt=False)[
                len(r.render(hist, tools, add_generation_prompt=True)) :
            ].split("<|im_end|>")[0]
        )
        recorded = r.render_full(hist, tools) + reply_ids + [im_end]
        assert recorded == full_before[: len(recorded)]
        assert recorded + delta == r.render_full([*hist, reply, *new], tools)
    kept = {(h[0]["content"] if h[0] else None, h[1][0]["function"]["name"]) for h in r._heads}
    assert kept == {("You are A.", "read"), ("You are B.", "read"), ("You are A.", "write")}


def test_a_different_head_misses_and_the_kept_ones_are_bounded() -> None:
    r = _renderer()
    hist, reply, new = _turn("one")
    r.extension(reply, new, [TOOL], None, hist[0])
    text = r._heads[0][3]
    r.extension(reply, new, [TOOL], None, hist[0], enable_thinking=False)  # kwargs differ
    r.extension(reply, new, [OTHER], None, hist[0])  # tools differ
    hist2, _, _ = _turn("two")
    r.extension(reply, new, [TOOL], None, hist2[0])  # system differs
    assert len(r._heads) == 4 and "two" in r._heads[0][3] and r._heads[-1][3] == text
    for i in range(HEADS_KEPT + 3):
        h, _, _ = _turn(f"system {i}")
        r.extension(reply, new, None, None, h[0])
    assert len(r._heads) == HEADS_KEPT


def test_a_kept_render_that_no_longer_prefixes_the_stand_in_is_rendered_again() -> None:
    r = _renderer()
    hist, reply, new = _turn("one")
    r.extension(reply, new, [TOOL], None, hist[0])
    s, t, k, _ = r._heads[0]
    r._heads[0] = (s, t, k, "<|im_start|>system\nstale")  # as if the template wrote a date
    r.extension(reply, new, [TOOL], None, hist[0])
    assert len(r._heads) == 1 and r._heads[0][3] != "<|im_start|>system\nstale"
    assert r._heads[0][3] == r.render(
        hist[:1] + [{"role": "user", "content": "dummy"}], [TOOL], add_generation_prompt=False
    )
