"""The fast fake vLLM for load: one fixed reply (a reply spec: its token IDs, logprobs, text
and tool call), every body serialized once at start, so the engine costs next to nothing
beside the proxy measured in front of it. It serves vLLM 0.33's ``/inference/v1/generate``
(token-in: the reply's IDs with logprobs, whole or one SSE event per token) and an OpenAI
``/v1/chat/completions`` giving the same reply as text + tool call (for relays and LiteLLM).
``POST /pace {"ms": M}`` sets the per-token pacing of streams.

The shapes are those of :class:`~turnstile.testing.fake_vllm.VLLMFake` (held to the golden
answers of a real vLLM) reduced to the fields a proxy reads; run it as a process with
``python -m turnstile.testing.fake_vllm_replay --port P --spec SPEC.json [--pace-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import orjson

from .asgi import asgi_body, asgi_lifespan

MODEL_NAME = "bench"


def replay_app(spec: dict, pace: float, model: str = MODEL_NAME) -> Any:
    """A fast fake engine: vLLM 0.33's ``/inference/v1/generate`` (token-in: the reply's token
    IDs with logprobs, whole or one SSE event per token) and an OpenAI ``/v1/chat/completions``
    returning the same reply as text + tool call (for the relays and LiteLLM). Bodies are
    serialized once, at start."""
    ids, lps = spec["token_ids"], spec["logprobs"]
    n = len(ids)
    rid = "generate-tokens-bench"

    def entry(t: int, lp: float) -> dict:
        return {
            "token_id": t,
            "logprob": lp,
            "rank": 1,
            "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
        }

    def gen_choice(tids: list[int], tlps: list[float], finish: str | None) -> dict:
        return {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": tids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "logprobs": {"content": [entry(t, lp) for t, lp in zip(tids, tlps, strict=True)]},
        }

    usage = {"prompt_tokens": 1000, "total_tokens": 1000 + n, "completion_tokens": n}
    gen_whole = orjson.dumps(
        {
            "request_id": rid,
            "model": model,
            "created": 0,
            "usage": usage,
            "output_mode": "tokens",
            "choices": [gen_choice(ids, lps, "stop")],
        }
    )
    gen_events = [
        b"data: "
        + orjson.dumps(
            {
                "request_id": rid,
                "usage": None,
                "output_mode": "tokens",
                "choices": [gen_choice([t], [lp], "stop" if i == n - 1 else None)],
            }
        )
        + b"\n\n"
        for i, (t, lp) in enumerate(zip(ids, lps, strict=True))
    ]
    gen_events.append(
        b"data: "
        + orjson.dumps({"request_id": rid, "usage": usage, "output_mode": "tokens", "choices": []})
        + b"\n\n"
    )
    gen_events.append(b"data: [DONE]\n\n")

    call = {"id": "call_bench0", "type": "function", "function": spec["tool_call"]}
    message = {"role": "assistant", "content": spec["thought"], "tool_calls": [call]}
    oa_usage = {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}
    chat_whole = orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
            ],
            "usage": oa_usage,
        }
    )

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return (
            b"data: "
            + orjson.dumps(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
            + b"\n\n"
        )

    # One event per sampled token: the thought's tokens as content, the rest as the tool
    # call (header first, then its arguments in pieces), like an OpenAI-compatible engine.
    thought_n = max(1, min(n - 3, len(spec["pieces"]) // 3))
    chat_events = [chunk({"role": "assistant", "content": ""})]
    chat_events += [chunk({"content": p}) for p in _split(spec["thought"], thought_n)]
    chat_events.append(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
    )
    chat_events += [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
        for p in _split(call["function"]["arguments"], n - thought_n - 1)
    ]
    chat_events.append(chunk({}, "tool_calls"))
    chat_events.append(b"data: [DONE]\n\n")

    models = orjson.dumps(
        {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 262144}]}
    )
    json_h = [(b"content-type", b"application/json")]
    state = {"pace": pace}
    sse_h = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send)
        path = scope["path"]
        body = await asgi_body(receive)
        if path == "/pace":  # the benchmark switches pacing between modes
            state["pace"] = float(orjson.loads(body)["ms"]) / 1000
            path = "/health"
        if path in ("/health", "/version", "/v1/models"):
            data = {"/health": b"{}", "/version": b'{"version":"0.33.0"}'}.get(path, models)
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send({"type": "http.response.body", "body": data})
            return
        if path not in ("/inference/v1/generate", "/v1/chat/completions"):
            await send({"type": "http.response.start", "status": 404, "headers": json_h})
            await send({"type": "http.response.body", "body": b'{"detail":"Not Found"}'})
            return
        req = orjson.loads(body)
        token_in = path == "/inference/v1/generate"
        if not req.get("stream"):
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send(
                {"type": "http.response.body", "body": gen_whole if token_in else chat_whole}
            )
            return
        await send({"type": "http.response.start", "status": 200, "headers": sse_h})
        events = gen_events if token_in else chat_events
        pace_s = state["pace"]
        for i, ev in enumerate(events):
            if pace_s and 0 < i:
                await asyncio.sleep(pace_s)
            await send({"type": "http.response.body", "body": ev, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _split(text: str, parts: int) -> list[str]:
    parts = max(1, parts)
    step = max(1, -(-len(text) // parts))
    out = [text[i : i + step] for i in range(0, len(text), step)]
    while len(out) < parts:
        out.append("")
    return out


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--spec", required=True, help="a reply spec (JSON)")
    p.add_argument("--pace-ms", type=float, default=0.0, help="per-token pacing of streams")
    p.add_argument("--model", default=MODEL_NAME)
    a = p.parse_args(argv)
    app = replay_app(json.loads(Path(a.spec).read_text()), a.pace_ms / 1000, a.model)
    # the server settings of `turnstile serve`
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        access_log=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
