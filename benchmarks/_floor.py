"""The floor of a token-recording proxy: the least any Python proxy must do to hand a trainer
the token IDs and logprobs of a chat call, built from the cheapest parts this project or a
library offers and nothing else. ``overhead.py`` runs it as ``floor`` beside the byte relays
and Turnstile; the first floor (round 1 to 14) stays as ``floor-aiohttp``.

Per call, the same kinds of work Turnstile does, each in its cheapest form:

- read and parse the JSON body (bare ASGI on uvicorn + uvloop + httptools, as Turnstile);
- the prompt: a session's context kept as token IDs (an int32 array); only the messages after
  the last reply are rendered (an f-string in ChatML, no template engine) and tokenized with
  the cheapest encoder there is for the vocabulary (tiktoken's byte-pair core, as
  ``LoadedTokenizer.fast``; a tokenizer it cannot encode exactly is refused);
- the engine: vLLM's token-in ``/inference/v1/generate`` through Turnstile's own engine client
  (``EnginePool``: keep-alive connections on asyncio, httptools parsing), the prompt's JSON
  from ``PromptJSON`` (blocks reused), the answer's JSON parsed, the sampled IDs and logprobs
  taken out;
- the reply: the completion decoded by tiktoken's table of token bytes
  (``LoadedTokenizer.fast_decode``), its Hermes tool call cut out and parsed;
- the record: one row (IDs and logprobs as packed int32/float32) in an SQLite WAL file,
  ``synchronous=FULL``, committed off the loop by a writer thread that groups the rows queued
  behind each commit (``turnstile.store.writer.Writer``, Turnstile's group commit), the answer
  sent only once its row is on disk;
- the answer: a ``chat.completion`` (or its chunks, streamed as the engine's events arrive).

What it leaves out is everything else Turnstile does: validation and error shapes, the
template's own render and its audit, matching the history against what was recorded
(branches, edits, retries), stop strings, parsers other than Hermes, streaming tool-call
deltas, admission, metrics, auth, the session API, the viewer. It is a measuring stick, not a
proxy: it trusts every request.

``floor-aiohttp`` is the same job with the parts the first floor used: aiohttp's client, the
``tokenizers`` encoder and decoder, the prompt's JSON written whole, and one commit (one
fdatasync) per call on the event loop."""

from __future__ import annotations

import re
import sqlite3
import tempfile
import threading
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import orjson

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
JSON_H = [(b"content-type", b"application/json")]
SSE_H = [(b"content-type", b"text/event-stream")]
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS calls (session TEXT, seq INT, prompt BLOB, "
    "completion BLOB, logprobs BLOB, created REAL)"
)


def render(messages: list[dict], tools: list | None, first: bool) -> str:
    """The new messages in ChatML (Qwen2.5's tool prompt reduced to its markers)."""
    out = []
    if first and tools:
        listed = "\n".join(orjson.dumps(t).decode() for t in tools)
        out.append(f"<|im_start|>system\n# Tools\n<tools>\n{listed}\n</tools><|im_end|>\n")
    for m in messages:
        if m["role"] == "tool":
            out.append(
                f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n"
            )
        else:
            out.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def reply(text: str) -> dict:
    """The assistant message: the text before a Hermes tool call, and the call."""
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
                    "arguments": orjson.dumps(call["arguments"]).decode(),
                },
            }
        ]
    return message


def open_db(data: str | None) -> sqlite3.Connection:
    db = sqlite3.connect(
        Path(data or tempfile.mkdtemp()) / "floor.sqlite3",
        isolation_level=None,
        check_same_thread=False,
    )
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(SCHEMA)
    return db


def row(sid: str, seq: int, delta: Sequence[int], ids: list[int], lps: list[float]) -> tuple:
    return (
        sid,
        seq,
        array("i", delta).tobytes(),
        array("i", ids).tobytes(),
        array("f", lps).tobytes(),
        time.time(),
    )


class Rows:
    """What the group-commit writer writes: a batch of rows in one transaction (one sync)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.lock = threading.Lock()

    def write(self, writes: Sequence[tuple]) -> list[BaseException | None]:
        with self.lock:
            self.db.execute("BEGIN")
            try:
                self.db.executemany("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)", writes)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        return [None] * len(writes)


def sampled(raw: bytes) -> list[dict]:
    """The engine's answer (or one of its events): its choices, each with ``token_ids`` and
    ``logprobs`` (a function of its own so that a profile sees it)."""
    return orjson.loads(raw)["choices"]


def chunk(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "chatcmpl-floor", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def whole(req: dict, message: dict, n_prompt: int, n_out: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_out,
                "total_tokens": n_prompt + n_out,
            },
        }
    )


def floor_app(upstream: str, model_dir: Path, data: str | None = None, kind: str = "floor"):  # noqa: ANN201
    """The floor (``kind="floor"``) or the first floor (``"floor-aiohttp"``)."""
    from turnstile.chat.tokenizer import load_tokenizer
    from turnstile.testing.asgi import asgi_body, asgi_lifespan

    loaded = load_tokenizer(str(model_dir))
    ends = loaded.eog_token_ids
    db = open_db(data)
    sessions: dict[str, tuple[array, int]] = {}  # id -> (context IDs, messages seen)
    state: dict = {}
    if kind == "floor":
        from turnstile.engines.connection import EnginePool
        from turnstile.engines.http import KEEPALIVE_S
        from turnstile.engines.prompt_json import PromptJSON
        from turnstile.store.writer import Writer

        encode, decode = loaded.fast, loaded.fast_decode
        if encode is None or decode is None:
            raise SystemExit(f"floor: no tiktoken encoder/decoder for {model_dir}")
        prompt_json = PromptJSON()
        writer = Writer(Rows(db))  # type: ignore[arg-type]  # rows, not Turnstile's writes

        async def startup() -> None:
            state["pool"] = EnginePool(upstream, 600.0, 10.0, KEEPALIVE_S)

        async def shutdown() -> None:
            state["pool"].close()
            writer.drain()

        async def post(body: bytes, stream: bool) -> tuple[Callable, Callable]:
            r = await state["pool"].post("/inference/v1/generate", body)
            return r.read, r.content.iter_any

        def commit(record: tuple) -> Awaitable:
            return writer.submit(record)  # type: ignore[arg-type]

        def gen_body(prompt: array, max_tokens: object, temperature: object, stream: bool) -> bytes:
            ids = prompt_json.dumps(prompt)
            params = orjson.dumps(
                {"max_tokens": max_tokens, "temperature": temperature, "logprobs": 0}
            )
            return b'{"token_ids":%b,"sampling_params":%b,"stream":%b}' % (
                ids,
                params,
                b"true" if stream else b"false",
            )

    else:
        tok = loaded.tokenizer

        def encode(text: str) -> list[int]:
            return tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True)

        db.execute("PRAGMA synchronous=FULL")

        async def startup() -> None:
            import aiohttp

            state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def shutdown() -> None:
            await state["s"].close()

        async def post(body: bytes, stream: bool) -> tuple[Callable, Callable]:
            url = upstream + "/inference/v1/generate"
            r = await state["s"].post(url, data=body, headers={"content-type": "application/json"})
            return r.read, lambda: r.content

        async def commit(record: tuple) -> None:
            db.execute("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)", record)

        def gen_body(prompt: array, max_tokens: object, temperature: object, stream: bool) -> bytes:
            params = {"max_tokens": max_tokens, "temperature": temperature, "logprobs": 0}
            return orjson.dumps(
                {"token_ids": prompt.tolist(), "sampling_params": params, "stream": stream}
            )

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send, startup, shutdown)
        body = await asgi_body(receive)
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": JSON_H})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        req = orjson.loads(body)
        sid = dict(scope["headers"]).get(b"x-session-id", b"").decode()
        msgs = req["messages"]
        context, seen = sessions.get(sid, (array("i"), 0))
        # a continuation: skip the echoed reply (its tokens are the recorded completion)
        new = msgs[seen + 1 :] if seen else msgs
        delta = encode(render(new, req.get("tools"), not seen))
        prompt = context + array("i", delta)
        stream = bool(req.get("stream"))
        ids: list[int] = []
        lps: list[float] = []
        read, events = await post(
            gen_body(prompt, req.get("max_tokens"), req.get("temperature", 1.0), stream), stream
        )
        if not stream:
            choice = sampled(await read())[0]
            ids = choice["token_ids"]
            lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        else:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_H})
            text, shown, pending = "", 0, b""
            async for data in events():
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if not line.startswith(b"data: {"):
                        continue
                    for choice in sampled(line[6:]):
                        ids += choice["token_ids"]
                        lps += [e["logprob"] for e in choice["logprobs"]["content"]]
                        text += decode(choice["token_ids"])
                cut = text.find("<tool_call>")
                visible = text if cut < 0 else text[:cut]
                if len(visible) > shown:
                    piece, shown = visible[shown:], len(visible)
                    await send(
                        {
                            "type": "http.response.body",
                            "body": chunk({"content": piece}),
                            "more_body": True,
                        }
                    )
        message = reply(decode(ids[:-1] if ids and ids[-1] in ends else ids))
        await commit(row(sid, seen, delta, ids, lps))
        sessions[sid] = (prompt + array("i", ids), len(msgs))
        if stream:
            calls = [{"index": 0, **c} for c in message.get("tool_calls", [])]
            last = chunk({"tool_calls": calls}, "tool_calls") + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": last})
            return
        await send({"type": "http.response.start", "status": 200, "headers": JSON_H})
        out = whole(req, message, len(prompt), len(ids))
        await send({"type": "http.response.body", "body": out})

    return app
