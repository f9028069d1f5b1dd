"""``turnstile serve``'s options: the engine, the mode, the store, the limits, the trainer's
token, the live monitor and the Ray deployment (``turnstile.app.ray`` builds its replicas' options
from them)."""

from __future__ import annotations

import argparse
from typing import Literal, TypedDict

from ..engines import KINDS
from ..engines.http import CONNECT_TIMEOUT_S, ENGINE_TIMEOUT_S
from ..engines.prompt_json import MAX_BYTES as PROMPT_CACHE_BYTES
from ..media import Limits as MediaLimits
from ..parsing import tool_formats
from ..server.limits import Limits

# A request without max_tokens gets this budget (OpenAI's models answer up to their own
# output limit, which is of this order): a turn ends, even when the policy never does.
DEFAULT_MAX_TOKENS = 16384


# How uvicorn serves Turnstile's app (``serve``, each of ``--workers``): uvloop, httptools, no
# access log (error answers are logged by ``server.error_log``), and no proxy headers: nothing
# reads the client's address or scheme, and uvicorn's ProxyHeadersMiddleware cost 2.7% of a
# call's CPU (benchmarks/README.md, round 13). A Ray replica's direct port likewise.
class UvicornSettings(TypedDict):
    loop: Literal["uvloop"]
    http: Literal["httptools"]
    access_log: bool
    proxy_headers: bool


SHUTDOWN_GRACE_S = 10  # default --shutdown-grace (whole seconds, as uvicorn takes them)


def grace(seconds: int) -> int | None:
    """``--shutdown-grace`` as uvicorn's ``timeout_graceful_shutdown`` (0: no limit)."""
    return seconds if seconds > 0 else None


UVICORN: UvicornSettings = {
    "loop": "uvloop",
    "http": "httptools",
    "access_log": False,
    "proxy_headers": False,
}


def _seconds(value: str) -> float:
    """A positive number of seconds (argparse type)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {value!r}")
    return seconds


def _fraction(value: str) -> float:
    """A number in [0, 1] (argparse type)."""
    try:
        f = float(value)
    except ValueError:
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, not {value!r}")
    return f


def add_arguments(s: argparse.ArgumentParser) -> None:
    """Every option of ``turnstile serve`` on ``s``."""
    s.add_argument(
        "--engine",
        choices=KINDS,
        default="llama-cpp",
        help="the inference engine behind --engine-url (default: llama-cpp)",
    )
    s.add_argument(
        "--mode",
        choices=["token-in", "passthrough"],
        default="token-in",
        help="token-in: render prompts here and send token IDs (exact); passthrough: "
        "forward messages to the engine's /v1/chat/completions and record the "
        "token IDs it reports (vLLM, or SGLang with --engine sglang); drift is "
        "detected, not prevented",
    )
    s.add_argument(
        "--engine-url",
        required=True,
        action="append",
        help="engine base URL; repeat it (or give @FILE, one URL a line) for "
        "replicas: sessions stick to one, dead replicas are avoided",
    )
    s.add_argument(
        "--model",
        required=True,
        help="GGUF file, Hugging Face model directory, or hub id in the local cache "
        "(passthrough: the model name to report, as the engine serves it)",
    )
    s.add_argument(
        "--engine-timeout",
        type=_seconds,
        default=ENGINE_TIMEOUT_S,
        metavar="SECONDS",
        help="how long one engine call may take, from sending it to its last token (a "
        "call that runs past it is a 504 to the harness, recorded as an error, and the "
        f"engine is told to stop it; default: {ENGINE_TIMEOUT_S:g})",
    )
    s.add_argument(
        "--engine-connect-timeout",
        type=_seconds,
        default=CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help="how long a new connection to the engine may take (an engine that refuses "
        "connections fails at once; one starved under load may take seconds to accept); "
        f"default: {CONNECT_TIMEOUT_S:g}",
    )
    s.add_argument("--chat-template", help="Jinja file overriding the model's template")
    s.add_argument(
        "--served-model-name",
        help="the model name reported to harnesses (default: the --model's name)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only)",
    )
    s.add_argument("--port", type=int, default=8400, help="port to listen on (default: 8400)")
    s.add_argument("--public-url", help="base URL harnesses reach this server at")
    s.add_argument(
        "--verify-fraction",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="score this fraction of recorded calls again on the engine, in the background, "
        "and export the agreement per weight version in /metrics (default: 0, off)",
    )
    s.add_argument(
        "--verify-engine-url",
        metavar="URL",
        help="the engine that scores them (default: the replica that served each call)",
    )
    s.add_argument(
        "--verify-threshold",
        type=float,
        default=None,
        metavar="DELTA",
        help="a call whose worst |recorded - recomputed| logprob exceeds this (or whose mean "
        "exceeds 0.05) is counted as parted, and logged once per weight version (default: "
        "0.5, above a healthy bf16 engine's noise; docs/verification.md)",
    )
    s.add_argument(
        "--canary-fraction",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="for this fraction of calls, render the harness's messages as a text pipeline "
        "would (template, then encode) and count, in /metrics, the session summary and the "
        "viewer, whether and where its prompt IDs differ from the recorded ones; in the "
        "background, dropped when busy (default: 0, off; token-in mode)",
    )
    s.add_argument(
        "--keepalive",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a stream silent this long (a long prefill, a pause) sends a keep-alive each "
        "harness's idle timer counts: an empty chunk of the same completion (Chat), OpenAI's "
        "keepalive event (Responses), Anthropic's ping (Messages), an empty model turn "
        "(Gemini) (default: 10; 0: never)",
    )
    s.add_argument(
        "--hold-preemptions",
        type=int,
        default=3,
        metavar="N",
        help='a call held by POST /admin/pause {"mode": "hold"} goes on after the '
        "resume from its partial output; preempted more than N times it is aborted as "
        "'abort' does (default: 3; docs/weight_sync.md)",
    )
    s.add_argument(
        "--hold-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a held call waits this long for the resume, then is aborted (default: 600)",
    )
    s.add_argument(
        "--shutdown-grace",
        type=int,
        default=SHUTDOWN_GRACE_S,
        metavar="SECONDS",
        help="on SIGTERM, how long running calls (and calls held at a paused door) may go on; "
        "then they are cancelled and recorded as aborted, and the process exits: a "
        "supervisor's kill, which records nothing, comes later (Kubernetes: 30 s) "
        "(default: %(default)s; 0: no limit)",
    )
    s.add_argument(
        "--hold-stream",
        action="store_true",
        help="read whole (non-streamed) calls from the engine as a stream, so a hold keeps "
        "what was sampled of them too (default: a held whole call re-samples its cut chunk; "
        "llama-server answers whole either way)",
    )
    s.add_argument(
        "--token",
        help="the trainer's token (default: $TURNSTILE_TOKEN, else the "
        "one in DATA/turnstile.token, generated there with mode "
        "0600 the first time); harnesses get per-session base URLs",
    )
    s.add_argument(
        "--no-auth",
        action="store_true",
        help="no trainer token: every route open (refused unless --host is a loopback address)",
    )
    s.add_argument(
        "--data",
        default="turnstile-data",
        help="directory for the record store, created if missing (default: ./turnstile-data)",
    )
    s.add_argument(
        "--store",
        metavar="URL",
        help="keep the records in PostgreSQL instead of --data's SQLite file "
        "(postgresql://user@host/db; a fleet of gateways shares one; the token file stays "
        "under --data)",
    )
    s.add_argument(
        "--max-body-mb",
        type=int,
        default=32,
        help="largest request body in MiB (larger: 413; default: 32)",
    )
    s.add_argument(
        "--prompt-cache-mb",
        type=int,
        default=PROMPT_CACHE_BYTES >> 20,
        metavar="MIB",
        help="memory for prompt IDs already written as the engine's JSON, reused by a "
        "session's next call (~10 bytes per token; default: "
        f"{PROMPT_CACHE_BYTES >> 20}; 0: write every prompt whole)",
    )
    images = MediaLimits()
    s.add_argument(
        "--max-image-mb",
        type=float,
        default=images.max_image_bytes / (1 << 20),
        metavar="MIB",
        help="the largest image a request may carry, decoded from base64 (docs/images.md)",
    )
    s.add_argument(
        "--max-images-per-request",
        type=int,
        default=images.max_images_per_request,
        help="images one request may carry (default: %(default)s)",
    )
    s.add_argument(
        "--max-images-per-session",
        type=int,
        default=images.max_images_per_session,
        help="images one prompt may hold, over all its turns (default: %(default)s)",
    )
    s.add_argument(
        "--image-url-allow",
        action="append",
        default=[],
        metavar="PREFIX",
        help="fetch image URLs under this http(s) prefix (repeatable; scheme, host and port "
        "must match, redirects must stay under a prefix; default: none, every remote image "
        "URL refused; docs/images.md)",
    )
    s.add_argument(
        "--image-url-timeout",
        type=float,
        default=images.url_timeout,
        metavar="S",
        help="seconds one allowed image fetch may take, redirects included (default: %(default)s)",
    )
    defaults = Limits()
    s.add_argument(
        "--max-messages",
        type=int,
        default=defaults.max_messages,
        help="messages in one request (more: 400)",
    )
    s.add_argument(
        "--max-tools", type=int, default=defaults.max_tools, help="tools in one request (more: 400)"
    )
    s.add_argument(
        "--max-string-kb",
        type=int,
        default=defaults.max_string >> 10,
        help="KiB of characters in any one JSON string of a request (more: 400)",
    )
    s.add_argument(
        "--max-depth",
        type=int,
        default=defaults.max_depth,
        help="nesting of objects/arrays in a request (deeper: 400)",
    )
    s.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default="full",
        help="SQLite durability: full (default) syncs every commit, so an "
        "acknowledged call survives an OS crash or power loss; normal survives "
        "a killed process only (faster)",
    )
    s.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="the completion budget of a request that names none (aider and Codex send no "
        "max_tokens; without a budget a policy that never ends its turn samples the whole "
        "context); recorded as max_tokens_default (default: %(default)s; 0: the room left "
        "in the context)",
    )
    s.add_argument(
        "--max-trees",
        type=int,
        default=1024,
        help="session call trees kept in memory (least recently used beyond it are "
        "dropped and rebuilt from the store on demand)",
    )
    s.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error", "critical"],
        help="server log verbosity (default: warning)",
    )
    s.add_argument(
        "--no-template-patches",
        action="store_true",
        help="use the template exactly as shipped (see turnstile/chat/patches.py)",
    )
    s.add_argument(
        "--tool-parser",
        choices=[*tool_formats(), "none"],
        help="override the tool-call format detected from the template",
    )
    s.add_argument(
        "--keep-bodies",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also keep each call's raw request/response body (default: tokens only)",
    )
    s.add_argument(
        "--vllm-api",
        choices=["auto", "generate", "completions"],
        default="auto",
        help="vLLM: /inference/v1/generate (needs --enable-scale-out from 0.31) or "
        "/v1/completions with token IDs",
    )
    s.add_argument(
        "--engine-logprobs-mode",
        help="vLLM: the server's --logprobs-mode, if it cannot be read from it",
    )
    s.add_argument(
        "--sglang-original-logprobs",
        action="store_true",
        help="SGLang: the server returns logprobs before temperature scaling",
    )
    s.add_argument(
        "--routed-experts",
        nargs="?",
        const="on",
        default=None,
        metavar="on|LAYERS,TOPK[,EXPERTS]",
        help="vLLM, SGLang (MoE models): record the experts the router picked for every "
        "prompt and completion token (router replay; the engine runs with "
        "--enable-return-routed-experts). SGLang needs the layers and top-k: given here, or "
        "read from the served model's config.json",
    )
    s.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes on this machine (default: 1): the first on --port, each other "
        "on a port of its own that its sessions' base_url names, all recording into one "
        "store; pause, resume, close and delete reach every one (docs/scale.md)",
    )
    s.add_argument(
        "--ray",
        action="store_true",
        help="run gateway replicas as a Ray Serve application behind Serve's HTTP "
        "proxy on --host/--port (sessions stick to a replica; see "
        "docs/scale.md); needs the ray extra",
    )
    s.add_argument(
        "--ray-address",
        help="the Ray cluster to join (default: $RAY_ADDRESS, else start one on this machine)",
    )
    s.add_argument("--ray-replicas", type=int, default=2, help="gateway replicas (default: 2)")
    s.add_argument("--ray-min-replicas", type=int, help="autoscale: at least this many replicas")
    s.add_argument("--ray-max-replicas", type=int, help="autoscale: at most this many")
    s.add_argument(
        "--ray-replica-cpus",
        type=float,
        default=1.0,
        help="CPUs Ray reserves per replica (default: 1)",
    )
    s.add_argument(
        "--ray-direct",
        action="store_true",
        help="each replica also serves on a port of its own and a session's base_url names "
        "its replica there (calls skip Serve's proxy: ~3.5x less CPU per call than through it); "
        "fallback_base_url goes through Serve's proxy, for when that replica is gone. "
        "Harnesses must reach the replicas' nodes (docs/scale.md)",
    )
