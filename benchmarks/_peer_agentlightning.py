"""agentlightning's LLMProxy as ``peers.py`` runs it (in agentlightning's own venv, see
``setup_peer_venvs.sh``; this file imports nothing of Turnstile's).

One process: the LLMProxy (the LiteLLM proxy with agentlightning's middlewares and callbacks:
``return_token_ids`` added to every engine request, the OpenTelemetry spans exported into the
LightningStore) in ``thread`` launch mode on an in-memory store, as agentlightning's trainer
runs it, plus a small admin app on a second port for the benchmark (rollouts, the records):

- ``POST /bench/rollout`` -> ``{rollout_id, attempt_id}``: a rollout started in the store; the
  harness then calls ``/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions``;
- ``GET /bench/records?rollout_id=R`` -> ``[{prompt_ids, response_ids}]``: what agentlightning
  recorded for that rollout, read with its own ``LlmProxyTraceToTriplet`` adapter.

    python _peer_agentlightning.py --port P --admin-port Q --upstream http://127.0.0.1:E
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

import uvicorn
from agentlightning import LLMProxy
from agentlightning.adapter.triplet import LlmProxyTraceToTriplet
from agentlightning.store.memory import InMemoryLightningStore
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--model", default="bench")
    a = p.parse_args()
    logging.getLogger().setLevel(logging.WARNING)
    store = InMemoryLightningStore(thread_safe=True)
    proxy = LLMProxy(
        port=a.port,
        host="127.0.0.1",
        model_list=[
            {
                "model_name": a.model,
                "litellm_params": {
                    "model": f"hosted_vllm/{a.model}",
                    "api_base": a.upstream.rstrip("/") + "/v1",
                },
            }
        ],
        store=store,
        launch_mode="thread",
    )
    await proxy.start()

    async def rollout(request: Request) -> JSONResponse:
        r = await store.start_rollout(input={"task": "bench"})
        return JSONResponse({"rollout_id": r.rollout_id, "attempt_id": r.attempt.attempt_id})

    async def records(request: Request) -> JSONResponse:
        rid = request.query_params["rollout_id"]
        spans = await store.query_spans(rid)
        triplets = LlmProxyTraceToTriplet().adapt(spans)
        out = [
            {
                "prompt_ids": list(t.prompt.get("token_ids") or []),
                "response_ids": list(t.response.get("token_ids") or []),
            }
            for t in triplets
        ]
        return JSONResponse(out)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"llm_proxy": proxy.is_running()})

    admin = Starlette(
        routes=[
            Route("/bench/rollout", rollout, methods=["POST"]),
            Route("/bench/records", records, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    server = uvicorn.Server(
        uvicorn.Config(admin, host="127.0.0.1", port=a.admin_port, log_level="warning")
    )
    print(json.dumps({"llm_proxy": a.port, "admin": a.admin_port}), flush=True)
    try:
        await server.serve()
    finally:
        await proxy.stop()


if __name__ == "__main__":
    asyncio.run(main())
