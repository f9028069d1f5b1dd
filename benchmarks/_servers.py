"""The servers the benchmarks start, each a child process pinned to a core: the fast fake
engine (``turnstile.testing.fake_vllm_replay``), the minimal relays and the floor recorder,
Turnstile, LiteLLM.

Run as a script it is one of those servers (what ``start_*`` spawns)::

    python benchmarks/_servers.py relay-aiohttp|relay-httpx|floor --port P --upstream URL
    python benchmarks/_servers.py turnstile --port P --engine-url URL --data DIR

``start_turnstile(src=...)`` runs the ``turnstile`` package of another checkout (a baseline):
that checkout goes first on the child's ``$PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import urllib.request
from pathlib import Path

import orjson
from _machine import Server, bench_venv, free_port
from _workload import MODEL_NAME, tiny_qwen2

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
LITELLM_KEY = "sk-turnstile-bench-0123456789abcdef0123456789"
# The trainer token every Turnstile the benchmarks start runs with (given to each server as
# $TURNSTILE_TOKEN; a baseline checkout older than the token ignores it). Not set in this
# process's environment: importing this module (tests do) changes nothing for other servers.
TOKEN = os.environ.get("TURNSTILE_TOKEN") or "tst-bench-" + secrets.token_urlsafe(24)


def pythonpath(src: str | Path | None = None) -> dict[str, str]:
    """The child's ``$PYTHONPATH``: ``src`` (a baseline checkout) or this checkout first, so a
    server runs that ``turnstile`` whatever checkout the shared venv's editable install names."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join([str(src or ROOT), *rest])}


def start_fake(spec: Path, cpu: int | None, log: Path, pace_ms: float = 0.0) -> tuple[Server, str]:
    """The fast fake vLLM (``turnstile.testing.fake_vllm_replay``) answering with ``spec``."""
    port = free_port()
    s = Server(
        [
            sys.executable,
            "-m",
            "turnstile.testing.fake_vllm_replay",
            "--port",
            str(port),
            "--spec",
            str(spec),
            "--pace-ms",
            str(pace_ms),
        ],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
        env=pythonpath(),
    )
    return s, f"http://127.0.0.1:{port}"


def set_pace(fake_url: str, ms: float) -> None:
    req = urllib.request.Request(fake_url + "/pace", orjson.dumps({"ms": ms}), method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def start_relay(
    kind: str, upstream: str, cpu: int | None, log: Path, data: Path | None = None
) -> tuple[Server, str]:
    """A relay (``relay-aiohttp``, ``relay-httpx``) or a floor recorder (``floor``,
    ``floor-aiohttp``; its records under ``data``)."""
    port = free_port()
    extra = ["--data", str(data)] if data else []
    s = Server(
        [sys.executable, str(HERE), kind, "--port", str(port), "--upstream", upstream, *extra],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
        env=pythonpath(),
    )
    return s, f"http://127.0.0.1:{port}"


def start_turnstile(
    engine_url: str, data: Path, cpu: int | None, log: Path, src: str | None = None
) -> tuple[Server, str]:
    """``src``: run the ``turnstile`` package from another checkout (a baseline commit)."""
    port = free_port()
    s = Server(
        [
            sys.executable,
            str(HERE),
            "turnstile",
            "--port",
            str(port),
            "--engine-url",
            engine_url,
            "--data",
            str(data),
            "--model",
            str(tiny_qwen2()),  # found here: the server may run a baseline without the test bed
        ],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
        env={"TURNSTILE_TOKEN": TOKEN, **pythonpath(src)},
        timeout=300,
    )
    return s, f"http://127.0.0.1:{port}"


def serve_options(engine_url: str, data: Path) -> list[str]:
    """``turnstile serve``'s options in front of the fake engine's token-in route (vLLM's
    ``/inference/v1/generate`` with processed logprobs), as an operator would give them."""
    return [
        "--engine",
        "vllm",
        "--vllm-api",
        "generate",
        "--engine-logprobs-mode",
        "processed_logprobs",
        "--engine-url",
        engine_url,
        "--model",
        str(tiny_qwen2()),
        "--data",
        str(data),
        "--served-model-name",
        MODEL_NAME,
    ]


def litellm_available() -> str | None:
    """None when the bench venv has LiteLLM, else why not."""
    exe = bench_venv() / "bin" / "litellm"
    if not exe.exists():
        return f"LiteLLM is not installed in {bench_venv()} (run benchmarks/setup_bench_venv.sh)"
    return None


def start_litellm(upstream: str, cpu: int | None, log: Path, workdir: Path) -> tuple[Server, str]:
    """The LiteLLM proxy (one worker, no database) forwarding to an OpenAI-shaped server."""
    port = free_port()
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL_NAME}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL_NAME}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: unused\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n"
    )
    env = {
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
    }
    s = Server(
        [
            str(bench_venv() / "bin" / "litellm"),
            "--config",
            str(cfg),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        f"http://127.0.0.1:{port}/health/liveliness",
        cpu,
        log,
        env=env,
        timeout=180,
    )
    return s, f"http://127.0.0.1:{port}"


def _turnstile_app(engine_url: str, data: str, port: int, model: str) -> object:
    """``turnstile serve`` with the vLLM adapter (token-in ``/inference/v1/generate``)."""
    try:
        from turnstile.app.wiring import build_gateway
    except ModuleNotFoundError:  # a baseline checkout from before turnstile/app/ (issue 41)
        from turnstile.wiring import build_gateway  # type: ignore[no-redef]
    from turnstile.engines.vllm import VLLMEngine
    from turnstile.server.app import create_app

    gateway = build_gateway(engine_url, model, data, model_name=MODEL_NAME)
    gateway.engine = VLLMEngine(engine_url, api="generate", logprobs_mode="processed_logprobs")
    import inspect

    auth = {"token": TOKEN} if "token" in inspect.signature(create_app).parameters else {}
    return create_app(gateway, f"http://127.0.0.1:{port}", **auth)


def _serve_main(argv: list[str]) -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument(
        "kind", choices=["relay-aiohttp", "relay-httpx", "turnstile", "floor", "floor-aiohttp"]
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream")
    p.add_argument("--engine-url")
    p.add_argument("--data")
    p.add_argument("--model", help="turnstile: the tokenizer and template folder")
    a = p.parse_args(argv)
    if a.kind == "turnstile":
        app = _turnstile_app(a.engine_url, a.data, a.port, a.model)
    elif a.kind.startswith("floor"):
        from _floor import floor_app

        app = floor_app(a.upstream.rstrip("/"), tiny_qwen2(), a.data, a.kind)
    else:
        from _relays import relay_app

        app = relay_app(a.upstream.rstrip("/"), a.kind)
    # The same server settings as `turnstile serve` (for the floor and the relays too).
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        access_log=False,
        backlog=4096,
        proxy_headers=False,
    )


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
