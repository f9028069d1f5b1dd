"""The floor of a token-recording proxy: the least any Python proxy must do to hand a trainer
the token IDs and logprobs of a chat call, written as leanly as possible and without any of
Turnstile's code on the call's path (the tokenizer is loaded with Turnstile's loader, then
used raw). ``overhead.py`` runs it as ``floor`` beside the byte relays and Turnstile.

Per call, the same kinds of work Turnstile does, each in its cheapest form:

- read and parse the JSON body (bare ASGI on uvicorn + uvloop + httptools, as the relays);
- the prompt: a session's context kept as token IDs; only the messages after the last reply
  are rendered (an f-string in ChatML, no template engine) and tokenized (the Rust tokenizer);
- the engine: vLLM's token-in ``/inference/v1/generate`` through aiohttp, its JSON parsed,
  the sampled IDs and logprobs taken out;
- the reply: the completion decoded, its Hermes tool call cut out and parsed;
- the record: one row (IDs and logprobs as packed int32/float32) in an SQLite WAL file,
  ``synchronous=FULL``, committed on the loop before the answer leaves;
- the answer: a ``chat.completion`` (or its chunks, streamed as the engine's events arrive).

What it leaves out is everything else Turnstile does: validation and error shapes, the
template's own render and its audit, matching the history against what was recorded
(branches, edits, retries), stop strings, parsers other than Hermes, streaming tool-call
deltas, admission, metrics, auth, the session API, the viewer. It is a measuring stick, not a
proxy: it trusts every request."""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
import time
import uuid
from array import array
from pathlib import Path

import orjson

JSON = {"content-type": "application/json"}
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def floor_app(upstream: str, model_dir: Path, data: str | None = None):  # noqa: ANN201
    from turnstile.chat.tokenizer import load_tokenizer
    from turnstile.testing.asgi import asgi_body, asgi_lifespan

    tok = load_tokenizer(str(model_dir)).tokenizer
    db = sqlite3.connect(Path(data or tempfile.mkdtemp()) / "floor.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS calls (session TEXT, seq INT, prompt BLOB, "
        "completion BLOB, logprobs BLOB, created REAL)"
    )
    sessions: dict[str, tuple[list[int], int]] = {}  # id -> (context IDs, messages seen)
    state: dict = {}
    json_h = [(b"content-type", b"application/json")]
    sse_h = [(b"content-type", b"text/event-stream")]

    def render(messages: list[dict], tools: list | None, first: bool) -> str:
        out = []
        if first and tools:
            listed = "\n".join(json.dumps(t) for t in tools)
            out.append(f"<|im_start|>system\n# Tools\n<tools>\n{listed}\n</tools><|im_end|>\n")
        for m in messages:
            if m["role"] == "tool":
                out.append(
                    f"<|im_start|>user\n<tool_response>\n{m['content']}\n"
                    "</tool_response><|im_end|>\n"
                )
            else:
                out.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
        out.append("<|im_start|>assistant\n")
        return "".join(out)

    def reply(text: str) -> dict:
        message: dict = {"role": "assistant", "content": text}
        if m := TOOL_CALL.search(text):
            call = orjson.loads(m.group(1))
            message["content"] = text[: m.start()].strip() or None
            message["tool_calls"] = [
                {
                    "id": "call_" + uuid.uuid4().hex[:24],
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call["arguments"]),
                    },
                }
            ]
        return message

    def record(sid: str, seq: int, delta: list[int], ids: list[int], lps: list[float]) -> None:
        db.execute(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
            (
                sid,
                seq,
                array("i", delta).tobytes(),
                array("i", ids).tobytes(),
                array("f", lps).tobytes(),
                time.time(),
            ),
        )

    async def startup() -> None:
        import aiohttp

        state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def shutdown() -> None:
        await state["s"].close()

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send, startup, shutdown)
        body = await asgi_body(receive)
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        req = orjson.loads(body)
        sid = dict(scope["headers"]).get(b"x-session-id", b"").decode()
        msgs = req["messages"]
        context, seen = sessions.get(sid, ([], 0))
        # a continuation: skip the echoed reply (its tokens are the recorded completion)
        new = msgs[seen + 1 :] if seen else msgs
        delta = tok.encode_batch_fast(
            [render(new, req.get("tools"), not seen)], add_special_tokens=False
        )[0].ids
        prompt = context + delta
        stream = bool(req.get("stream"))
        gen = {
            "token_ids": prompt,
            "sampling_params": {"max_tokens": req.get("max_tokens"), "logprobs": 0},
            "stream": stream,
        }
        ids: list[int] = []
        lps: list[float] = []
        url, gen_body = upstream + "/inference/v1/generate", orjson.dumps(gen)
        async with state["s"].post(url, data=gen_body, headers=JSON) as r:
            if not stream:
                choice = orjson.loads(await r.read())["choices"][0]
                ids = choice["token_ids"]
                lps = [e["logprob"] for e in choice["logprobs"]["content"]]
            else:
                await send({"type": "http.response.start", "status": 200, "headers": sse_h})
                head = {"id": "chatcmpl-floor", "object": "chat.completion.chunk"}
                text, shown = "", 0
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    for choice in orjson.loads(line[6:])["choices"]:
                        ids += choice["token_ids"]
                        lps += [e["logprob"] for e in choice["logprobs"]["content"]]
                        text += tok.decode(choice["token_ids"], skip_special_tokens=True)
                    cut = text.find("<tool_call>")
                    visible = text if cut < 0 else text[:cut]
                    if len(visible) > shown:
                        piece, shown = visible[shown:], len(visible)
                        chunk = {**head, "choices": [{"index": 0, "delta": {"content": piece}}]}
                        await send(
                            {
                                "type": "http.response.body",
                                "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                                "more_body": True,
                            }
                        )
        text = tok.decode(ids, skip_special_tokens=True)
        message = reply(text)
        record(sid, seen, delta, ids, lps)
        sessions[sid] = (prompt + ids, len(msgs))
        if stream:
            calls = [{"index": 0, **c} for c in message.get("tool_calls", [])]
            last = {"id": "chatcmpl-floor", "object": "chat.completion.chunk"}
            delta_calls = {"tool_calls": calls}
            last["choices"] = [{"index": 0, "delta": delta_calls, "finish_reason": "tool_calls"}]
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n",
                }
            )
            return
        out = {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }
        await send({"type": "http.response.start", "status": 200, "headers": json_h})
        await send({"type": "http.response.body", "body": orjson.dumps(out)})

    return app
