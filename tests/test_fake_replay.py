"""The benchmarks' fast fake vLLM (``turnstile.testing.fake_vllm_replay``) answers the token-in
route with what the fake held to the golden answers (``VLLMFake``) answers for the same fixed
reply, byte for byte up to the request id and the time: its speed comes from serializing once,
not from other shapes."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from starlette.applications import Starlette

from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.fake_vllm_replay import replay_app
from turnstile.testing.scripted import FixedReply

pytestmark = pytest.mark.unit

SPEC = {
    "token_ids": [11, 12, 13, 151645],
    "logprobs": [-0.05, -0.16, -0.27, -0.38],
    "thought": "I will look.",
    "pieces": ["I", " will", " look."],
    "tool_call": {"name": "bash", "arguments": '{"command": "ls"}'},
}
BODY = {
    "token_ids": [1, 2, 3, 4, 5],
    "sampling_params": {"max_tokens": 64, "logprobs": 0, "temperature": 1.0},
    "stream_options": {"include_usage": True},
}


def _answers(app: object, stream: bool) -> list[dict] | dict:
    async def go() -> list[dict] | dict:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            r = await client.post("/inference/v1/generate", json={**BODY, "stream": stream})
            assert r.status_code == 200, r.text
            if not stream:
                return r.json()
            return [
                orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")
            ]

    return asyncio.run(go())


def _same(got: object, want: object) -> None:
    """Equal, but for the request id and the time (the replay's are fixed)."""
    for a, b in ((got, want),) if isinstance(got, dict) else zip(got, want, strict=True):  # type: ignore[call-overload]
        assert isinstance(a, dict) and isinstance(b, dict)
        assert {**a, "request_id": 0, "created": 0} == {**b, "request_id": 0, "created": 0}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_replay_answers_as_the_golden_fake_does(stream: bool) -> None:
    fake = VLLMFake("0.33.0")
    fake.served_model = "bench"
    fake.model = FixedReply.from_spec(SPEC)  # type: ignore[assignment]
    want = _answers(Starlette(routes=fake.routes()), stream)
    got = _answers(replay_app(SPEC, 0.0), stream)
    _same(got, want)
