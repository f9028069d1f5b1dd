"""An engine closes an idle kept-alive connection just as a call is sent on it (vLLM's and
SGLang's uvicorn and llama-server do after 5 s): the call must not fail. The server here drops
the connection, without answering, when a second request arrives on it."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from turnstile.engines.base import Finish, SamplingParams
from turnstile.engines.llamacpp import LlamaCppEngine

pytestmark = pytest.mark.integration

COMPLETION = {
    "tokens": [5, 6],
    "content": "ab",
    "stop_type": "limit",
    "completion_probabilities": [
        {"id": 5, "logprob": -0.5, "top_logprobs": []},
        {"id": 6, "logprob": -0.25, "top_logprobs": []},
    ],
    "tokens_evaluated": 3,
    "timings": {},
}
PROPS = {"default_generation_settings": {"n_ctx": 512}, "model_path": "x.gguf"}


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: list[str]
) -> None:
    served = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next(
                (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0
            )
            await reader.readexactly(length)
            path = lines[0].split()[1]
            if served >= 1 and path == "/completion":
                log.append("dropped")
                writer.close()  # closed as the request arrives: no answer at all
                return
            log.append(path)
            body = orjson.dumps(PROPS if path == "/props" else COMPLETION)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            served += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def test_a_connection_closed_under_a_call_is_retried_once() -> None:
    async def go() -> tuple[list[str], list]:
        log: list[str] = []
        server = await asyncio.start_server(lambda r, w: _serve(r, w, log), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = LlamaCppEngine(f"http://127.0.0.1:{port}")
        await engine.start()  # GET /props on a connection that is then kept alive
        try:
            items = [x async for x in engine.generate([1, 2, 3], SamplingParams(max_tokens=2))]
        finally:
            await engine.close()
            server.close()
        return log, items

    log, items = asyncio.run(go())
    assert log == ["/props", "dropped", "/completion"]
    assert items[0].ids == [5, 6]
    assert isinstance(items[-1], Finish)
