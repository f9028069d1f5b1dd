"""A tool call's end is rendered when the parser sees it, not when the answer is over: the
Messages block's ``content_block_stop`` and the Responses item's ``output_item.done`` reach
the harness while the engine may still be sampling (Anthropic's and OpenAI's streams close a
call's block as soon as it is complete; a harness can start the tool then)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from turnstile.answer import (
    Event,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from turnstile.dialects.messages.dialect import MessagesDialect
from turnstile.dialects.responses.dialect import ResponsesDialect
from turnstile.request import ChatRequest

pytestmark = pytest.mark.unit


class _Served:
    model_name = "m"


def _events(seen: asyncio.Event, end: bool) -> AsyncIterator[Event]:
    async def gen() -> AsyncIterator[Event]:
        yield TextDelta("Let me look.")
        yield ToolCallStart(0, "call_1", "read", '{"path": ')
        yield ToolArgumentsDelta(0, '"a.txt"}')
        if end:
            yield ToolCallEnd(0)
        # the engine is still sampling (the end-of-turn token has not come): the renderer
        # must already have closed the call for ``seen`` to be set
        await asyncio.wait_for(seen.wait(), 0.5)

    return gen()


def _kinds(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.splitlines() if b": " in line)
        if b"event" in lines:
            out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out


async def _until(stream: AsyncIterator[bytes], done: str, seen: asyncio.Event) -> list:
    got = []
    async for chunk in stream:
        got += _kinds(chunk)
        if any(k == done and _is_call(d) for k, d in got):
            seen.set()
    return got


def _is_call(data: dict) -> bool:
    item = data.get("item") or {}
    return item.get("type") == "function_call" or data.get("index") == 1


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_a_calls_block_closes_when_the_call_ends(dialect: str) -> None:
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m", call_id="c1")
    d = MessagesDialect(_Served()) if dialect == "messages" else ResponsesDialect(_Served())
    done = "content_block_stop" if dialect == "messages" else "response.output_item.done"

    async def run(end: bool) -> list:
        seen = asyncio.Event()
        return await _until(d.stream(req, _events(seen, end)), done, seen)

    got = asyncio.run(run(end=True))
    assert [k for k, _ in got].count(done) == 2  # the text's block, then the call's
    # control: without the parser's end event the call closes only with the answer, too late
    with pytest.raises(TimeoutError):
        asyncio.run(run(end=False))
