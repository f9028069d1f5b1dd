"""The fast fake vLLM's recorder (``POST /record``, ``GET /recorded``), which the benchmarks
check a proxy's records against: it must give back exactly the bodies it was sent, count
every token-in request (and only those), and report as sampled what its answers carried,
whole or streamed."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from turnstile.testing.fake_vllm_replay import replay_app

pytestmark = pytest.mark.unit

SPEC = {
    "token_ids": [11, 12, 13, 151645],
    "logprobs": [-0.05, -0.16, -0.27, -0.38],
    "thought": "I will look.",
    "pieces": ["I", " will", " look."],
    "tool_call": {"name": "bash", "arguments": '{"command": "ls"}'},
}


def _body(i: int, stream: bool) -> dict:
    return {
        "token_ids": [1, 2, 3, i],
        "sampling_params": {"max_tokens": 64, "logprobs": 0, "temperature": 0.5 + i},
        "stream": stream,
    }


def _run(keep: int) -> tuple[dict, list[tuple[list[int], list[float]]]]:
    """Five token-in calls (whole and streamed) and one chat call after ``/record``; the
    recorder's answer and what each token-in answer carried."""

    async def go() -> tuple[dict, list]:
        transport = httpx.ASGITransport(app=replay_app(SPEC, 0.0))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            await client.post(
                "/inference/v1/generate", json=_body(99, False)
            )  # before: not counted
            r = await client.post("/record", json={"keep": keep})
            assert r.status_code == 200
            carried = []
            for i in range(5):
                stream = i % 2 == 1
                r = await client.post("/inference/v1/generate", json=_body(i, stream))
                events = (
                    [orjson.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
                    if stream
                    else [r.json()]
                )
                choices = [c for e in events for c in e["choices"]]
                ids = [t for c in choices for t in c["token_ids"]]
                lps = [e["logprob"] for c in choices for e in c["logprobs"]["content"]]
                carried.append((ids, lps))
            await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 4})
            return (await client.get("/recorded")).json(), carried

    return asyncio.run(go())


def test_the_recorder_keeps_what_it_was_sent_and_what_it_answered() -> None:
    rec, carried = _run(keep=3)
    assert rec["received"] == 5  # the token-in calls since /record, not the chat call
    assert rec["requests"] == [_body(i, i % 2 == 1) for i in range(3)]  # the first `keep`
    for ids, lps in carried:
        assert (ids, lps) == (rec["sampled"]["token_ids"], rec["sampled"]["logprobs"])
    assert rec["sampled"]["token_ids"] == SPEC["token_ids"]


def test_record_starts_over() -> None:
    rec, _ = _run(keep=0)
    assert rec["received"] == 5 and rec["requests"] == []
