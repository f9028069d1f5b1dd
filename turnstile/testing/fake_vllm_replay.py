"""The fast fake vLLM for load: one fixed reply (a reply spec: its token IDs, logprobs, text
and tool call), every body serialized once at start, so the engine costs next to nothing
beside the proxy measured in front of it. It serves vLLM 0.33's ``/inference/v1/generate``
(token-in: the reply's IDs with logprobs, whole or one SSE event per token) and an OpenAI
``/v1/chat/completions`` giving the same reply as text + tool call (for relays and LiteLLM).
``POST /pace {"ms": M, "prefill_ms_per_1k": P}`` sets the pacing of streams.

Its recorder, for a benchmark to check a proxy's records against what the engine received and
sampled (not against the proxy's own account): ``POST /record {"keep": N}`` starts a count of
the token-in requests and keeps the first ``N`` bodies whole; ``GET /recorded`` answers
``{"received": count, "requests": [bodies], "sampled": {"token_ids", "logprobs"}}``, the
sampled IDs and logprobs read back from the bytes it answers with.

The token-in answers are built once by :class:`~turnstile.testing.fake_vllm.VLLMFake` itself
(held to the golden answers of a real vLLM) for the reply as a
:class:`~turnstile.testing.scripted.FixedReply`: the same bytes, served without a framework.
Only the usage is written per request (the prompt's length). Run it as a process with
``python -m turnstile.testing.fake_vllm_replay --port P --spec SPEC.json [--pace-ms MS]
[--prefill-ms-per-1k MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import orjson

from .asgi import asgi_body, asgi_lifespan
from .fake_server import SSE_DONE, sse
from .fake_vllm import VLLMFake
from .scripted import FixedReply

MODEL_NAME = "bench"
_USAGE = "@usage@"  # where a whole answer's usage goes


class TokenInReplay:
    """vLLM 0.33's ``/inference/v1/generate`` answers for one fixed reply, serialized once by
    :class:`VLLMFake` (whole and streamed); only the usage is written per request."""

    def __init__(self, reply: FixedReply, model: str = MODEL_NAME):
        self.fake = VLLMFake("0.33.0")  # the shapes, from the fake held to the golden answers
        self.fake.served_model = model
        gen = reply.generate([])
        self.n = n = len(gen.steps)
        self.rid = rid = "generate-tokens-bench"
        whole = self.fake.whole_body(rid, [], gen, 0, gen.reason, _USAGE, False, created=0)
        self.head, self.tail = orjson.dumps(whole).split(orjson.dumps(_USAGE))
        self.events = [
            self.fake.stream_chunk(
                rid,
                self.fake.token_choice(
                    gen, [s], 0, gen.reason if i == n - 1 else None, True, i == n - 1
                ),
            )
            for i, s in enumerate(gen.steps)
        ]

    def whole(self, n_prompt: int) -> bytes:
        return self.head + orjson.dumps(self.fake.usage_counts(n_prompt, self.n, True)) + self.tail

    def stream(self, n_prompt: int, include_usage: bool) -> list[bytes]:
        """The SSE events, ``[DONE]`` included."""
        events = [*self.events]
        if include_usage:
            usage = self.fake.usage_counts(n_prompt, self.n, False)
            events.append(self.fake.usage_chunk(self.rid, usage))
        events.append(SSE_DONE)
        return events


def replay_app(spec: dict, pace: float, model: str = MODEL_NAME, prefill: float = 0.0) -> Any:
    """The app: ``spec`` is the reply (``token_ids``, ``logprobs``, ``thought``, ``tool_call``,
    ``pieces``), ``pace`` seconds per streamed token, ``prefill`` seconds per 1k prompt
    tokens before a stream's first token (``POST /pace`` changes both)."""
    token_in = TokenInReplay(FixedReply.from_spec(spec), model)
    n = token_in.n

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
        return sse(
            orjson.dumps(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
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
    chat_events.append(SSE_DONE)

    models = orjson.dumps(
        {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 262144}]}
    )
    json_h = [(b"content-type", b"application/json")]
    state = {"pace": pace, "prefill": prefill}
    recorder: dict[str, Any] = {"keep": 0, "received": 0, "requests": []}
    sent = orjson.loads(token_in.whole(0))["choices"][0]
    sampled = {
        "token_ids": sent["token_ids"],
        "logprobs": [e["logprob"] for e in sent["logprobs"]["content"]],
    }
    sse_h = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send)
        path = scope["path"]
        body = await asgi_body(receive)
        if path == "/pace":  # the benchmark switches pacing between modes
            p = orjson.loads(body)
            state["pace"] = float(p.get("ms", 0.0)) / 1000
            state["prefill"] = float(p.get("prefill_ms_per_1k", 0.0)) / 1000
            path = "/health"
        if path == "/record":
            recorder.update(keep=int(orjson.loads(body).get("keep", 0)), received=0, requests=[])
            path = "/health"
        if path == "/recorded":
            kept = {k: recorder[k] for k in ("received", "requests")}
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send(
                {"type": "http.response.body", "body": orjson.dumps({**kept, "sampled": sampled})}
            )
            return
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
        generate = path == "/inference/v1/generate"
        if generate:
            recorder["received"] += 1
            if len(recorder["requests"]) < recorder["keep"]:
                recorder["requests"].append(req)
        # the chat route's prompt is not tokenized: its usage says 1000 tokens
        n_prompt = len(req.get("token_ids") or ()) if generate else 1000
        if not req.get("stream"):
            data = token_in.whole(n_prompt) if generate else chat_whole
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 200, "headers": sse_h})
        events = chat_events
        if generate:
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            events = token_in.stream(n_prompt, usage)
        pace_s, prefill_s = state["pace"], state["prefill"] * n_prompt / 1000
        if prefill_s:
            await asyncio.sleep(prefill_s)
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
    p.add_argument("--prefill-ms-per-1k", type=float, default=0.0, help="per 1k prompt tokens")
    p.add_argument("--model", default=MODEL_NAME)
    a = p.parse_args(argv)
    spec = json.loads(Path(a.spec).read_text())
    app = replay_app(spec, a.pace_ms / 1000, a.model, a.prefill_ms_per_1k / 1000)
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
