"""tokin's capture core behind a minimal chat-completions proxy, as ``peers.py`` runs it (in
tokin's own venv, see ``setup_peer_venvs.sh``; this file imports nothing of Turnstile's).

tokin 0.0.1 is a library (``Session``/``Rollout``, per-family ``ChatTemplate`` with
``apply``/``apply_increment``/``parse``), not a server: its README draws the harness sending
messages to tokin and tokin sending token IDs to the inference server, and this file is that
arrow, written here as thin as it goes. Per session (``X-Session-Id``): the first request is
rendered with ``ChatTemplate.apply`` and encoded; a later one appends
``ChatTemplate.apply_increment`` of the messages after the echoed reply to
``rollout.token_ids``; the prompt IDs go to the engine's ``/v1/completions`` (a token prompt,
``return_token_ids``, logprobs, the family's stop IDs), the sampled IDs to
``rollout.add_response``, and ``ChatTemplate.parse`` makes the reply. Non-streaming only.

- ``GET /bench/records?session=S`` -> ``[{prompt_ids, completion_ids}]`` from the session's
  rollouts (each response turn, with every turn before it as its prompt).

    python _peer_tokin.py --port P --upstream http://127.0.0.1:E --tokenizer DIR
"""

from __future__ import annotations

import argparse
import contextlib
import time

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tokin import ChatTemplateError, Session, get_chat_template
from transformers import AutoTokenizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--model", default="bench")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--family", default="qwen")
    a = p.parse_args()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    template = get_chat_template(a.family)(tok)
    sessions: dict[str, tuple[Session, list[dict]]] = {}
    state: dict = {}
    url = a.upstream.rstrip("/") + "/v1/completions"

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("stream"):
            return JSONResponse({"error": {"message": "no streaming"}}, status_code=400)
        sid = request.headers.get("x-session-id") or "default"
        messages, tools = body["messages"], body.get("tools")
        session, seen = sessions.get(sid) or (Session(), [])
        rollout = session.current
        new = messages[len(seen) + 1 :] if seen and messages[: len(seen)] == seen else None
        try:
            if new is None or not rollout.turns:
                raise ChatTemplateError("a first request, or one that does not extend the last")
            rollout.add_prompt(template.encode(template.apply_increment(new, tools)))
        except ChatTemplateError:
            if rollout.turns:
                rollout = session.fork()
            rollout.add_prompt(template.encode(template.apply(messages, tools)))
        prompt = rollout.token_ids
        req = {
            "model": a.model,
            "prompt": prompt,
            "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens"),
            "temperature": body.get("temperature", 1.0),
            "stop_token_ids": sorted(template.stop_ids),
            "skip_special_tokens": False,
            "logprobs": 0,
            "return_token_ids": True,
        }
        async with state["http"].post(url, json=req) as r:
            out = orjson.loads(await r.read())
        choice = out["choices"][0]
        ids = choice["token_ids"]
        rollout.add_response(ids, (choice.get("logprobs") or {}).get("token_logprobs"))
        text = tok.decode([t for t in ids if t not in template.stop_ids])
        message = template.parse(text, tools)
        sessions[sid] = (session, list(messages))
        reply = {
            "id": "chatcmpl-tokin",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": a.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": out.get("usage"),
        }
        return Response(orjson.dumps(reply), media_type="application/json")

    async def records(request: Request) -> JSONResponse:
        session, _ = sessions.get(request.query_params["session"]) or (Session(), [])
        out = []
        for rollout in session.rollouts:
            before: list[int] = []
            for turn in rollout.turns:
                if turn.generated:
                    out.append({"prompt_ids": list(before), "completion_ids": turn.token_ids})
                before += turn.token_ids
        return JSONResponse(out)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    @contextlib.asynccontextmanager
    async def lifespan(app):  # noqa: ANN001, ANN202
        state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await state["http"].close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/bench/records", records, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
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
