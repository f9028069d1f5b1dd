"""nemo-gym's ``vllm_model`` server as ``peers.py`` runs it (in nemo-gym's own venv, see
``setup_peer_venvs.sh``; this file imports nothing of Turnstile's).

The server is built the way nemo-gym's own tests of it build one
(``responses_api_models/vllm_model/tests/test_app.py``: ``VLLMModel(config=...,
server_client=...)`` with the global config dict stubbed empty, then ``setup_webserver()``),
configured as ``configs/vllm_model_for_training.yaml`` does for training
(``return_token_id_information: true``), except ``uses_reasoning_parser: false`` (the engine
runs no reasoning parser). ``run_webserver()`` is not used: it needs a head server, Ray and a
Hydra config, none of which take part in a call.

nemo-gym returns what it captured in the response (``message.prompt_token_ids``,
``generation_token_ids``, ``generation_log_probs``); the caller keeps it, so ``peers.py``
reads the records from the responses.

    python _peer_nemo_gym.py --port P --upstream http://127.0.0.1:E --model bench
"""

from __future__ import annotations

import argparse

import nemo_gym.server_utils
import uvicorn
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient
from omegaconf import OmegaConf
from starlette.requests import Request
from starlette.responses import JSONResponse


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--model", default="bench")
    p.add_argument("--tokenizer", help="unused (nemo-gym asks the engine's /tokenize)")
    a = p.parse_args()
    nemo_gym.server_utils.get_global_config_dict = lambda *args, **kw: OmegaConf.create({})
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    config = VLLMModelConfig(
        host="127.0.0.1",
        port=a.port,
        base_url=a.upstream.rstrip("/") + "/v1",
        api_key="unused",  # pragma: allowlist secret
        model=a.model,
        entrypoint="app.py",
        name="policy_model",
        return_token_id_information=True,
        uses_reasoning_parser=False,
    )
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create({}),
    )
    server = VLLMModel(config=config, server_client=client)
    # As run_webserver() builds it: the routes, liveness, the exception middleware.
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    app.add_route("/health", health, methods=["GET"])
    # run_webserver()'s uvicorn settings (one worker; loop and HTTP parser left to uvicorn:
    # uvloop, and h11 as nemo-gym does not install httptools).
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        log_level="warning",
        timeout_graceful_shutdown=0.5,
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
