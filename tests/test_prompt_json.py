"""The prompt's JSON text the engine is sent, made from the session's previous prompt where the
call extends it, is exactly the prompt's IDs, whatever the session does (``gateway.prompt_json``).

The truth is the JSON the engine receives, parsed as the engine parses it, against the prompt
IDs the gateway recorded and handed over. Hypothesis drives sessions through extensions,
retries, branches from older calls, edited histories (new segments) and failed engine calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile import testbed
from turnstile.dialects.chat_request import parse_chat_request
from turnstile.engines.base import (
    PROCESSED_LOGPROBS,
    EngineBase,
    EngineError,
    Finish,
    SamplingParams,
    TokenEvent,
)
from turnstile.gateway import prompt_json
from turnstile.gateway.token_in import Gateway
from turnstile.store.store import Store
from turnstile.wiring import build_renderer, detect_parser

pytestmark = pytest.mark.unit


class JsonEngine(EngineBase):
    """Parses the prompt JSON it is given, as an engine would, and answers with fixed tokens
    (or fails, when told to)."""

    name = "json"
    context_length = 1 << 20

    def __init__(self, reply: list[int]) -> None:
        self.reply = reply
        self.seen: list[tuple[list[int], list[int] | None]] = []
        self.fail = False

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def refresh(self) -> None: ...

    async def health(self) -> bool:
        return True

    def logprob_warning(self, params: SamplingParams | None = None) -> str | None:
        return None

    async def generate(
        self,
        prompt_ids,
        params: SamplingParams,
        stream: bool = True,
        prompt_json: bytes | None = None,
    ) -> AsyncIterator[list[TokenEvent] | Finish]:
        sent = orjson.loads(prompt_json) if prompt_json is not None else None
        self.seen.append((list(prompt_ids), sent))
        if self.fail:
            raise EngineError("down", 502)
        yield [TokenEvent(t, -0.5) for t in self.reply]
        yield Finish("stop", logprob_kind=PROCESSED_LOGPROBS)


@pytest.fixture(scope="module")
def renderer():
    r, _ = build_renderer(str(testbed.tiny_model("qwen2", "Qwen-Qwen2.5-7B-Instruct")))
    return r


OPS = st.lists(
    st.tuples(
        st.sampled_from(["extend", "extend", "extend", "retry", "branch", "edit", "fail"]),
        st.integers(0, 40),
    ),
    min_size=2,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS)
def test_the_engine_gets_exactly_the_prompt_ids(renderer, tmp_path_factory, ops):
    tmp: Path = tmp_path_factory.mktemp("pj")
    reply = renderer.tok.encode("Looking at the file now.") + [
        renderer.tok.tokenizer.token_to_id("<|im_end|>")
    ]
    engine = JsonEngine(reply)
    gw = Gateway(renderer, engine, Store(tmp), "m", detect_parser(renderer.template))
    history: list[list[dict]] = []  # the messages each answered call was sent, with its reply
    msgs: list[dict] = [
        {"role": "system", "content": "x " * 300},
        {"role": "user", "content": "go"},
    ]
    extended = 0

    async def call(messages: list[dict]) -> None:
        body = {"model": "m", "messages": messages, "max_tokens": 16}
        try:
            out = await gw.complete("s", parse_chat_request(body))
        except Exception:  # noqa: BLE001 - a failed engine call: the next one starts afresh
            return
        history.append([*messages, out.body["choices"][0]["message"]])

    async def run() -> None:
        nonlocal msgs, extended
        await call(msgs)
        for op, k in ops:
            engine.fail = op == "fail"
            if op == "retry" or not history:
                await call(msgs)
                continue
            base = history[k % len(history)] if op == "branch" else history[-1]
            if op == "edit":
                base = [base[0], {"role": "user", "content": f"edited {k}"}, *base[2:]]
            msgs = [*base, {"role": "user", "content": f"result {k} " * (1 + k)}]
            await call(msgs)
            extended += 1

    asyncio.run(run())
    for ids, sent in engine.seen:
        assert sent == ids
    assert all(sent is not None for _, sent in engine.seen)


def test_a_continuing_prompt_reuses_the_kept_text(renderer, tmp_path, monkeypatch):
    """Three calls in a row: the second and third serialise only the IDs after the previous
    prompt (the completion and the delta); the text the engine gets is still all of it."""
    engine = JsonEngine(
        renderer.tok.encode("ok") + [renderer.tok.tokenizer.token_to_id("<|im_end|>")]
    )
    gw = Gateway(renderer, engine, Store(tmp_path), "m", detect_parser(renderer.template))
    dumped: list[int] = []
    real = prompt_json.dumps
    monkeypatch.setattr(prompt_json, "dumps", lambda ids: dumped.append(len(ids)) or real(ids))
    msgs = [{"role": "system", "content": "long " * 2000}, {"role": "user", "content": "go"}]

    async def run() -> None:
        nonlocal msgs
        for turn in range(3):
            out = await gw.complete("s", parse_chat_request({"model": "m", "messages": msgs}))
            msgs = [
                *msgs,
                out.body["choices"][0]["message"],
                {"role": "user", "content": f"{turn}"},
            ]

    asyncio.run(run())
    full = [len(ids) for ids, _ in engine.seen]
    assert [sent for _, sent in engine.seen] == [ids for ids, _ in engine.seen]
    assert dumped[0] == full[0]  # the first prompt is serialised whole
    assert all(0 < d < 50 for d in dumped[1:]) and len(dumped) == 3, (dumped, full)
