"""Resent histories through the served gateway (server/resent.py parses only what is new in
a session's body): the real SDKs send bodies past the size where the server keeps what it
parsed, in all three dialects, with appends, an edited message and a changed setting after
the history; the truth is what llama-server received (the recording relay): every text the
harness sent is in the prompt the engine got, and each appended turn extends the last
prompt + sample."""

from __future__ import annotations

import anthropic
import openai
import orjson
import pytest

from turnstile.chat.tokenizer import load_tokenizer
from turnstile.server.resent import MIN_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def relay(shared_relay):  # noqa: ANN001, ANN201
    return shared_relay


@pytest.fixture
def turnstile(shared_turnstile):  # noqa: ANN001, ANN201
    return shared_turnstile


# Past the size the server keeps, yet few tokens (a run of 128 spaces is one Qwen2 token):
# the tiny model's context holds it. Quotes and backslashes in odd counts: a misread escape
# would move every element end after it.
PAD = " " * (MIN_BYTES + 1024)
SYSTEM = 'You are terse. Say "hi, \\" or "bye.' + PAD + "Zürich."


def tool_text(turn: int) -> str:
    return f'result {turn}: "a\\b" {{"k": [{turn}]}}' + " " * 512 + f"end {turn}."


def _prompts(relay, tok, since: int) -> list[str]:  # noqa: ANN001
    return [tok.decode(ex.request["prompt"]) for ex in relay.completions()[since:]]


def _extends(relay, since: int) -> list[bool]:  # noqa: ANN001
    exchanges = relay.completions()[since:]
    return [
        b.request["prompt"][: len(a.request["prompt"]) + len(a.response["tokens"])]
        == a.request["prompt"] + a.response["tokens"]
        for a, b in zip(exchanges, exchanges[1:], strict=False)
    ]


def test_chat_bodies_past_the_size_kept(turnstile, relay, tiny_qwen2, no_end_bias):
    tok = load_tokenizer(str(tiny_qwen2))
    session = turnstile.session(task="resent-chat")
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    since = len(relay.completions())
    msgs: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Go."}]
    sent: list[list[dict]] = []
    for turn in range(4):
        kw: dict = dict(model="tiny", max_tokens=6 + (turn == 3), seed=turn, logit_bias=no_end_bias)
        r = client.chat.completions.create(messages=msgs, **kw)  # turn 3: a setting changed
        sent.append([dict(m) for m in msgs])
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": tool_text(turn)},
        ]
    assert len(orjson.dumps(msgs)) > MIN_BYTES
    # an edited message in the middle (a harness compacting), then appends again
    msgs[3] = {"role": "user", "content": "An edited " + tool_text(99)}
    for turn in (4, 5):
        r = client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=6, seed=turn, logit_bias=no_end_bias
        )
        sent.append([dict(m) for m in msgs])
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": tool_text(turn)},
        ]
    prompts = _prompts(relay, tok, since)
    assert len(prompts) == len(sent) == 6
    for prompt, conversation in zip(prompts, sent, strict=True):
        for m in conversation:
            if m["role"] != "assistant":  # each text whole, where the template puts it
                assert f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>" in prompt
    assert "An edited" not in prompts[3] and "An edited" in prompts[4]
    assert _extends(relay, since) == [True, True, True, False, True]


def _three_turns(relay, tok, call) -> None:  # noqa: ANN001
    """``call(turn, history)`` three times, the history growing by the reply and a tool text:
    each prompt holds the system text and every earlier tool text whole."""
    since = len(relay.completions())
    history: list = [{"role": "user", "content": "Go."}]
    for turn in range(3):
        reply, result = call(turn, history)
        history += [{"role": "assistant", "content": reply or "."}, result]
    prompts = _prompts(relay, tok, since)
    held = [f"{tool_text(t)}<|im_end|>" in p for t in range(2) for p in prompts[t + 1 :]]
    assert held == [True] * 3
    assert all(f"system\n{SYSTEM}<|im_end|>" in p for p in prompts)


def test_responses_and_messages_bodies_past_the_size_kept(
    turnstile, relay, tiny_qwen2, no_end_bias
):
    tok = load_tokenizer(str(tiny_qwen2))
    session = turnstile.session(task="resent-dialects")
    oa = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

    def responses(turn: int, items: list) -> tuple[str, dict]:
        r = oa.responses.create(
            model="tiny",
            instructions=SYSTEM,
            input=items,
            max_output_tokens=6,
            store=False,
            extra_body={"logit_bias": no_end_bias, "seed": turn},
        )
        return r.output_text, {"role": "user", "content": tool_text(turn)}

    _three_turns(relay, tok, responses)

    session = turnstile.session(task="resent-messages")
    an = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key="unused", max_retries=0
    )

    def messages(turn: int, turns: list) -> tuple[str, dict]:
        r = an.messages.create(
            model="tiny",
            system=SYSTEM,
            messages=turns,
            max_tokens=6,
            extra_body={"logit_bias": no_end_bias, "seed": turn},
        )
        text = "".join(b.text for b in r.content if b.type == "text")
        return text, {"role": "user", "content": [{"type": "text", "text": tool_text(turn)}]}

    _three_turns(relay, tok, messages)
