"""The fake vLLM engine that every peer and Turnstile face in ``peers.py``: one process, the
real Qwen2 tokenizer and Qwen2.5 template, vLLM 0.33's shapes on every route the peers use, and
a reply whose token IDs drift (decode -> re-encode does not give them back).

Routes (shapes from vLLM 0.33, ``shared/research/engines.md`` section 1):

- ``/inference/v1/generate`` (token-in; Turnstile's vLLM adapter): ``token_ids`` in, the reply's
  IDs with logprobs out, whole or one SSE event per token: the bytes of
  ``turnstile.testing.fake_vllm_replay.TokenInReplay`` (built by the fake held to vLLM's
  golden answers);
- ``/v1/chat/completions``: the messages rendered with the chat template and encoded (as vLLM
  does); ``return_token_ids`` adds ``prompt_token_ids`` to the response (the first chunk when
  streaming) and ``token_ids`` to each choice (each chunk's delta when streaming);
  ``logprobs`` (+ ``return_tokens_as_token_ids``: ``"token": "token_id:N"``);
- ``/v1/completions``: a token-ID or text prompt, the same extras;
- ``/tokenize``: ``{prompt}`` or ``{messages, tools, add_generation_prompt}`` -> ``tokens``;
- ``/bench/log``: what the engine received and sampled, per call, in order (GET; POST clears):
  the ground truth the exactness check compares every peer's record with.

The reply: a fixed text of ``--reply-tokens`` tokens (ending in ``<|im_end|>``) whose IDs are a
non-canonical tokenization: every third token of two or more characters is sampled as two
tokens that spell the same text. The text is the same; re-encoding it gives other IDs. This is
what a real sampler does now and then (random weights do it all the time), made certain.

    python benchmarks/_peer_engine.py --port P [--reply-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import _workload
import orjson

from turnstile.testing.fake_vllm_replay import TokenInReplay
from turnstile.testing.scripted import FixedReply

GENERATE = "/inference/v1/generate"
WORDS = (
    "I will run the parser tests first to reproduce the failure, then open parser.py around "
    "line 212 and read _read_value closely to find where the comment handling after a closing "
    "quote goes wrong in the new escape code, and fix it with the smallest correct change. "
)


def drifting_reply(tok, n_tokens: int) -> tuple[list[int], list[int]]:
    """(sampled IDs, canonical IDs of the same text): ``n_tokens`` IDs, the last <|im_end|>."""
    canon = tok.encode(WORDS) * 4
    out: list[int] = []
    long = 0  # tokens of two or more characters so far
    for t in canon:
        if len(out) >= n_tokens - 1:
            break
        piece = tok.decode([t])
        split = None
        if len(piece) >= 2:
            long += 1
            if long % 3 == 1:
                for k in range(1, len(piece)):
                    a, b = tok.encode(piece[:k]), tok.encode(piece[k:])
                    if len(a) == 1 and len(b) == 1:
                        split = [a[0], b[0]]
                        break
        if split and len(out) + 2 <= n_tokens - 1:
            out += split
        else:
            out.append(t)
    ids = [*out, _workload.IM_END]
    text = tok.decode(out)
    again = tok.encode(text)
    assert again != out, "the reply does not drift"
    return ids, again


class Engine:
    def __init__(self, n_tokens: int):
        from turnstile.app.wiring import build_renderer

        self.renderer, _ = build_renderer(str(_workload.tiny_qwen2()))
        self.tok = self.renderer.tok
        self.template = self.renderer.template
        self.ids, self.canonical = drifting_reply(self.tok, n_tokens)
        self.lps = [round(-0.05 - (i % 7) * 0.11, 4) for i in range(len(self.ids))]
        self.pieces = [self.tok.decode([t]) for t in self.ids[:-1]] + [""]
        self.text = "".join(self.pieces)
        self.log: list[dict] = []

    # rendering as vLLM does: template -> text -> encode

    def render(self, body: dict) -> list[int]:
        if "messages" in body:
            text = self.template.render(
                body["messages"],
                body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                **(body.get("chat_template_kwargs") or {}),
            )
            return self.tok.encode(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return self.tok.encode(str(prompt))

    def chat_logprob(self, i: int, as_ids: bool) -> dict:
        t, lp = self.ids[i], self.lps[i]
        name = f"token_id:{t}" if as_ids else self.pieces[i]
        entry = {"token": name, "logprob": lp, "bytes": list(self.pieces[i].encode())}
        return {**entry, "top_logprobs": [entry]}

    def usage(self, n_prompt: int) -> dict:
        n = len(self.ids)
        return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n, "completion_tokens": n}


def make_app(n_tokens: int):
    eng = Engine(n_tokens)
    n = len(eng.ids)
    json_h = [(b"content-type", b"application/json")]
    sse_h = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    token_in = TokenInReplay(FixedReply(eng.ids, eng.lps), _workload.MODEL_NAME)

    async def respond(send, body: bytes, status: int = 200) -> None:
        await send({"type": "http.response.start", "status": status, "headers": json_h})
        await send({"type": "http.response.body", "body": body})

    async def stream(send, events) -> None:  # noqa: ANN001
        await send({"type": "http.response.start", "status": 200, "headers": sse_h})
        for ev in events:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(ev) + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    def chat(req: dict, prompt: list[int]) -> tuple[bytes | None, list]:
        rti = bool(req.get("return_token_ids"))
        want_lp = bool(req.get("logprobs"))
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        cid = "chatcmpl-bench" + str(len(eng.log))
        if not req.get("stream"):
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": eng.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning": None,
                },
                "logprobs": {"content": [eng.chat_logprob(i, as_ids) for i in range(n)]}
                if want_lp
                else None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": eng.ids if rti else None,
            }
            body = {
                "id": cid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.get("model") or _workload.MODEL_NAME,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": eng.usage(len(prompt)),
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if rti else None,
                "kv_transfer_params": None,
            }
            return orjson.dumps(body), []
        head = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.get("model") or _workload.MODEL_NAME,
        }
        first = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                    **({"token_ids": []} if rti else {}),
                }
            ],
        }
        if rti:
            first["prompt_token_ids"] = prompt
        events = [first]
        for i in range(n):
            ch = {
                "index": 0,
                "delta": {"content": eng.pieces[i]},
                "logprobs": {"content": [eng.chat_logprob(i, as_ids)]} if want_lp else None,
                "finish_reason": "stop" if i == n - 1 else None,
            }
            if rti:
                ch["token_ids"] = [eng.ids[i]]
            events.append({**head, "choices": [ch]})
        if (req.get("stream_options") or {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": eng.usage(len(prompt))})
        return None, events

    def completions(req: dict, prompt: list[int]) -> tuple[bytes | None, list]:
        rti = bool(req.get("return_token_ids"))
        want_lp = req.get("logprobs") is not None
        as_ids = bool(req.get("return_tokens_as_token_ids"))

        def legacy(lo: int, hi: int) -> dict | None:
            if not want_lp:
                return None
            names = [f"token_id:{t}" if as_ids else eng.pieces[i] for i, t in enumerate(eng.ids)]
            return {
                "text_offset": list(range(lo, hi)),
                "token_logprobs": eng.lps[lo:hi],
                "tokens": names[lo:hi],
                "top_logprobs": [{names[i]: eng.lps[i]} for i in range(lo, hi)],
            }

        head = {
            "id": "cmpl-bench" + str(len(eng.log)),
            "created": int(time.time()),
            "model": req.get("model") or _workload.MODEL_NAME,
        }
        if not req.get("stream"):
            choice = {
                "index": 0,
                "text": eng.text,
                "logprobs": legacy(0, n),
                "finish_reason": "stop",
                "stop_reason": None,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if rti else None,
                "token_ids": eng.ids if rti else None,
            }
            body = {
                **head,
                "object": "text_completion",
                "choices": [choice],
                "usage": eng.usage(len(prompt)),
            }
            return orjson.dumps(body), []
        events = []
        for i in range(n):
            ch = {
                "index": 0,
                "text": eng.pieces[i],
                "logprobs": legacy(i, i + 1),
                "finish_reason": "stop" if i == n - 1 else None,
                "stop_reason": None,
            }
            if rti:
                ch["token_ids"] = [eng.ids[i]]
                if i == 0:
                    ch["prompt_token_ids"] = prompt
            events.append({**head, "object": "text_completion", "choices": [ch]})
        return None, events

    routes = {
        "/v1/chat/completions": chat,
        "/v1/completions": completions,
    }
    models = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": _workload.MODEL_NAME,
                    "object": "model",
                    "owned_by": "vllm",
                    "root": _workload.MODEL_NAME,
                    "max_model_len": 32768,
                }
            ],
        }
    )

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        path = scope["path"]
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if path in ("/health", "/version", "/v1/models"):
            data = {"/health": b"{}", "/version": b'{"version":"0.33.0"}'}.get(path, models)
            return await respond(send, data)
        if path == "/bench/log":
            if scope["method"] == "POST":
                eng.log.clear()
            return await respond(send, orjson.dumps(eng.log))
        if path == "/bench/reply":
            return await respond(
                send, orjson.dumps({"ids": eng.ids, "canonical": eng.canonical, "text": eng.text})
            )
        req = orjson.loads(raw) if raw else {}
        if path == "/tokenize":
            ids = eng.render(req)
            body = {"count": len(ids), "max_model_len": 32768, "tokens": ids, "token_strs": None}
            return await respond(send, orjson.dumps(body))
        handler = routes.get(path)
        if handler is None and path != GENERATE:
            return await respond(send, b'{"detail":"Not Found"}', 404)
        prompt = [int(t) for t in req["token_ids"]] if "token_ids" in req else eng.render(req)
        eng.log.append({"path": path, "prompt": prompt, "completion": eng.ids})
        if handler is None:  # token-in: the bytes of the fake held to vLLM's golden answers
            if not req.get("stream"):
                return await respond(send, token_in.whole(len(prompt)))
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            await send({"type": "http.response.start", "status": 200, "headers": sse_h})
            for ev in token_in.stream(len(prompt), usage):
                await send({"type": "http.response.body", "body": ev, "more_body": True})
            return await send({"type": "http.response.body", "body": b""})
        whole, events = handler(req, prompt)
        if whole is not None:
            return await respond(send, whole)
        await stream(send, events)

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument(
        "--keep-alive", type=float, default=5.0, help="idle connection timeout, s (vLLM's: 5)"
    )
    a = p.parse_args()
    import uvicorn

    uvicorn.run(
        make_app(a.reply_tokens),
        host="127.0.0.1",
        port=a.port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=a.keep_alive,
    )


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
