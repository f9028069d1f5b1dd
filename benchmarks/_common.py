"""Pieces the benchmarks share: a fast fake engine, the minimal relays, Turnstile and LiteLLM as
processes, CPU accounting from /proc, the agent workload and table printing.

Run as a script it starts one server (the benchmarks spawn these, pinned with ``taskset``)::

    python benchmarks/_common.py fake --port P --spec SPEC.json [--pace-ms 10]
    python benchmarks/_common.py relay-aiohttp|relay-httpx|floor --port P --upstream URL
    python benchmarks/_common.py turnstile --port P --engine-url URL --data DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
IM_END = 151645  # <|im_end|> in the Qwen2 vocabulary
QWEN25 = "Qwen-Qwen2.5-7B-Instruct"
MODEL_NAME = "bench"
LITELLM_KEY = "sk-turnstile-bench-0123456789abcdef0123456789"
# The trainer token every Turnstile the benchmarks start runs with (given to each server as
# $TURNSTILE_TOKEN; a baseline checkout older than the token ignores it). Not set in this
# process's environment: importing this module (tests do) changes nothing for other servers.
TOKEN = os.environ.get("TURNSTILE_TOKEN") or "tst-bench-" + secrets.token_urlsafe(24)


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE", Path.home() / ".cache" / "turnstile"))


def bench_venv() -> Path:
    return Path(os.environ.get("TURNSTILE_BENCH_VENV", cache_dir() / "bench-venv"))


def tiny_qwen2() -> Path:
    """Random weights on the real Qwen2 vocabulary with the real Qwen2.5 template: the
    tokenizer and template Turnstile loads (the fake engine does the 'generating')."""
    from turnstile import testbed

    return testbed.tiny_model("qwen2", QWEN25)


# ---------------------------------------------------------------------------------------------
# machine, CPU accounting, processes


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, load average {load[0]:.2f} at start"
    )


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads: utime + stime from /proc/<pid>/stat (clock
    ticks) refined with the nanosecond per-thread ``schedstat`` counters when the kernel has
    them (a tick is 10 ms, too coarse for short cells)."""
    total = 0
    ok = True
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ok = False
    if ok and total > 0:
        return total / 1e9
    return stat_cpu_seconds(pid)


def stat_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(cpu: int | None) -> None:
    """Pin this process to one core (when the machine has more than one)."""
    if cpu is not None and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not up after {timeout}s")


def free_port() -> int:
    from turnstile.testbed import free_port as fp

    return fp()


class Server:
    """A server process pinned to a core; stopped (by its own pid) on exit."""

    def __init__(
        self,
        cmd: list[str],
        health: str,
        cpu: int | None,
        log: Path,
        env: dict | None = None,
        timeout: float = 120.0,
    ):
        if cpu is not None and (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu), *cmd]
        out = log.open("ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
        )
        out.close()
        self.log = log
        try:
            wait_http(health, self.proc, timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def cpu_pair(self) -> tuple[float, float]:
        """(per-thread ns counters, /proc/<pid>/stat ticks): the first is precise but loses
        threads that exit; the second keeps them (10 ms ticks)."""
        return cpu_seconds(self.proc.pid), stat_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_fake(spec: Path, cpu: int | None, log: Path, pace_ms: float = 0.0) -> tuple[Server, str]:
    port = free_port()
    s = Server(
        [
            sys.executable,
            str(HERE),
            "fake",
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
    )
    return s, f"http://127.0.0.1:{port}"


def set_pace(fake_url: str, ms: float) -> None:
    req = urllib.request.Request(fake_url + "/pace", orjson.dumps({"ms": ms}), method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def start_relay(
    kind: str, upstream: str, cpu: int | None, log: Path, data: Path | None = None
) -> tuple[Server, str]:
    """A relay (``relay-aiohttp``, ``relay-httpx``) or the floor recorder (``floor``; its
    records under ``data``)."""
    port = free_port()
    extra = ["--data", str(data)] if data else []
    s = Server(
        [sys.executable, str(HERE), kind, "--port", str(port), "--upstream", upstream, *extra],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
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
        ],
        f"http://127.0.0.1:{port}/health",
        cpu,
        log,
        env={"TURNSTILE_TOKEN": TOKEN, **({"TURNSTILE_SRC": src} if src else {})},
        timeout=300,
    )
    return s, f"http://127.0.0.1:{port}"


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


# ---------------------------------------------------------------------------------------------
# the workload: an agent's request and the engine's 64-token reply

SYSTEM = (
    "You are a software engineering agent working in a sandboxed Linux container. The "
    "repository under /repo is checked out at the commit where an issue was reported. Your job "
    "is to reproduce the issue, find its cause, fix it with the smallest correct change, and "
    "verify the fix by running the relevant tests. Work step by step: each of your replies "
    "either calls exactly one tool or, when you are done, calls submit. Think briefly before "
    "each tool call and say what you expect to learn from it.\n\n"
    "Rules:\n"
    "1. Never modify tests unless the issue is in the tests themselves.\n"
    "2. Prefer reading code over guessing; open the file around the lines you need.\n"
    "3. Keep commands non-interactive; pipe long output through head or tail.\n"
    "4. When a command fails, read the error before trying something else.\n"
    "5. Do not install packages; everything the project needs is present.\n"
    "6. Stop and submit when the tests that reproduce the issue pass and nothing else broke.\n"
)
USER = (
    "<issue>\nParsing a config file with a trailing comment after a quoted value raises "
    "ValueError('unterminated string') since 2.3.0. Example:\n\n    name = \"x\"  # comment\n\n"
    "Expected: name == 'x'. Traceback points at parser.py:212 in _read_value. The bug was "
    "probably introduced with the escape handling rewrite. Please fix it and add a regression "
    "test if none covers this case.\n</issue>\n\nThe repository is at /repo. Begin by looking "
    "at the code."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the container and return its "
            "combined stdout and stderr (truncated to 10 000 characters). The working directory "
            "persists between calls; environment variables do not.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "description": "The command line to run with bash -lc.",
                    }
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files. `view` "
            "shows a file with line numbers or lists a directory; `create` writes a new file; "
            "`str_replace` replaces one exact, unique occurrence of old_str with new_str; `insert` "
            "adds text after a line.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "enum": ["view", "create", "str_replace", "insert"],
                    },
                    "path": {"type": "string", "description": "Absolute path of the file."},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer"},
                    "view_range": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the task. Call this once the fix is in place and verified.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
TOOL_OUTPUT = (
    "============================= test session starts ==============================\n"
    "collected 14 items\n\ntests/test_parser.py ......F.......                     [100%]\n\n"
    "=================================== FAILURES ===================================\n"
    "___________________________ test_trailing_comment ____________________________\n"
    "    def test_trailing_comment():\n>       assert parse('name = \"x\"  # c')['name'] == 'x'\n"
    "E       ValueError: unterminated string at line 1, column 8\n"
    "src/confparse/parser.py:212: ValueError\n1 failed, 13 passed in 0.21s\n"
)
THOUGHT = "I'll run the parser tests first to reproduce the failure and see the traceback."
MORE = (
    "Then I will open parser.py around line 212 and read _read_value closely to find where "
    "the comment handling after a closing quote goes wrong in the new escape code."
).split()


def reply_text(words: int) -> tuple[str, str, dict]:
    thought = " ".join([THOUGHT, *MORE[:words]])
    call = {
        "name": "bash",
        "arguments": {
            "command": "cd /repo && python -m pytest tests/test_parser.py -x -q 2>&1 | tail -n 20"
        },
    }
    return f"{thought}\n<tool_call>\n{json.dumps(call)}\n</tool_call>", thought, call


def reply_spec(n_tokens: int = 64) -> dict:
    """The fake engine's reply: a thought and a Hermes tool call, exactly ``n_tokens`` tokens
    (the last is ``<|im_end|>``), tokenized with the Qwen2 tokenizer Turnstile uses."""
    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_qwen2()))
    for words in range(len(MORE) + 1):
        text, thought, call = reply_text(words)
        ids = tok.encode(text)
        if len(ids) >= n_tokens - 1:
            break
    # Cut the thought at a token boundary so that the reply has exactly n_tokens - 1 tokens.
    head = tok.encode(thought)
    tail = tok.encode(text[len(thought) :])
    head = head[: max(1, n_tokens - 1 - len(tail))]
    thought = tok.decode(head)
    text = thought + text[len(text) - len(tok.decode(tail)) :]
    ids = [*head, *tail][: n_tokens - 1]
    ids = [*ids, IM_END]
    return {
        "token_ids": ids,
        "logprobs": [round(-0.05 - (i % 7) * 0.11, 4) for i in range(len(ids))],
        "text": tok.decode(ids[:-1]),
        "pieces": [tok.decode([t]) for t in ids[:-1]],
        "thought": thought.strip(),
        "tool_call": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
    }


def base_messages(pad_to: int | None = None) -> list[dict]:
    system = SYSTEM
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": USER}]
    if pad_to:
        size = len(orjson.dumps({"messages": msgs, "tools": TOOLS}))
        if size < pad_to:
            extra = (
                "Notes on the repository layout: source code lives in src/, tests in "
                "tests/, documentation in docs/. "
            )
            add = (extra * (1 + (pad_to - size) // len(extra)))[: pad_to - size]
            msgs[0] = {"role": "system", "content": system + "\n" + add}
    return msgs


def tool_result(call_id: str, turn: int) -> dict:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": TOOL_OUTPUT.replace("0.21s", f"0.{21 + turn}s"),
    }


# ---------------------------------------------------------------------------------------------
# Turnstile in-process (memory, long-session share): the real Gateway, an engine object that
# answers at once


class InProcessEngine:
    """Token-in engine without HTTP: yields the spec's tokens with logprobs, then a Finish.
    It meets ``turnstile.engines.base.EngineAdapter`` written out (not by subclassing
    ``EngineBase``: this module is also imported against baseline checkouts without it)."""

    name = "fake"
    context_length = 1 << 20
    url = None

    def __init__(self, spec: dict):
        self.ids, self.lps = spec["token_ids"], spec["logprobs"]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def refresh(self) -> None: ...

    async def health(self) -> bool:
        return True

    def pick(self, session_id: str) -> InProcessEngine:
        return self

    def forget(self, session_id: str) -> None: ...

    def sampling_notes(self, params) -> list[str]:  # noqa: ANN001
        return []

    async def pause(self, mode: str) -> str:
        return "no pause route"

    async def resume(self) -> str:
        return "no resume route"

    def replica_health(self) -> None:
        return None

    def logprob_warning(self, params=None) -> None:  # noqa: ANN001
        return None

    async def generate(self, prompt_ids, params, stream=True):  # noqa: ANN001
        from turnstile.engines.base import PROCESSED_LOGPROBS, Finish, TokenEvent

        yield [TokenEvent(t, lp) for t, lp in zip(self.ids, self.lps, strict=True)]
        yield Finish("stop", prompt_tokens=len(prompt_ids), logprob_kind=PROCESSED_LOGPROBS)


def make_gateway(data: Path, spec: dict):
    """The Gateway ``turnstile serve`` builds (template audit left out: Qwen2.5 extends
    exactly), with the in-process engine."""
    from turnstile.chat.audit import Policy
    from turnstile.gateway.token_in import Gateway
    from turnstile.store.store import Store
    from turnstile.wiring import build_renderer, detect_parser

    renderer, _ = build_renderer(str(tiny_qwen2()))
    return Gateway(
        renderer,
        InProcessEngine(spec),
        Store(data),
        MODEL_NAME,
        detect_parser(renderer.template),
        Policy.permissive(),
    )


def echo(message: dict) -> dict:
    """The assistant message as a harness appends it to its history."""
    return {
        "role": "assistant",
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls"),
    }


# ---------------------------------------------------------------------------------------------
# servers


async def asgi_lifespan(receive, send, startup=None, shutdown=None) -> None:  # noqa: ANN001
    """Answer an ASGI ``lifespan`` scope for the bare apps here, running their set-up."""
    while True:
        msg = await receive()
        step = startup if msg["type"] == "lifespan.startup" else shutdown
        if step is not None:
            await step()
        await send({"type": msg["type"] + ".complete"})
        if msg["type"] == "lifespan.shutdown":
            return


async def asgi_body(receive) -> bytes:  # noqa: ANN001
    """A request's whole body."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


def _fake_app(spec: dict, pace: float):
    """A fast fake engine: vLLM 0.33's ``/inference/v1/generate`` (token-in: the reply's token
    IDs with logprobs, whole or one SSE event per token) and an OpenAI ``/v1/chat/completions``
    returning the same reply as text + tool call (for the relays and LiteLLM). Bodies are
    serialized once, at start."""
    ids, lps = spec["token_ids"], spec["logprobs"]
    n = len(ids)
    rid = "generate-tokens-bench"

    def entry(t: int, lp: float) -> dict:
        return {
            "token_id": t,
            "logprob": lp,
            "rank": 1,
            "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
        }

    def gen_choice(tids: list[int], tlps: list[float], finish: str | None) -> dict:
        return {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": tids,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
            "logprobs": {"content": [entry(t, lp) for t, lp in zip(tids, tlps, strict=True)]},
        }

    usage = {"prompt_tokens": 1000, "total_tokens": 1000 + n, "completion_tokens": n}
    gen_whole = orjson.dumps(
        {
            "request_id": rid,
            "model": MODEL_NAME,
            "created": 0,
            "usage": usage,
            "output_mode": "tokens",
            "choices": [gen_choice(ids, lps, "stop")],
        }
    )
    gen_events = [
        b"data: "
        + orjson.dumps(
            {
                "request_id": rid,
                "usage": None,
                "output_mode": "tokens",
                "choices": [gen_choice([t], [lp], "stop" if i == n - 1 else None)],
            }
        )
        + b"\n\n"
        for i, (t, lp) in enumerate(zip(ids, lps, strict=True))
    ]
    gen_events.append(
        b"data: "
        + orjson.dumps({"request_id": rid, "usage": usage, "output_mode": "tokens", "choices": []})
        + b"\n\n"
    )
    gen_events.append(b"data: [DONE]\n\n")

    call = {"id": "call_bench0", "type": "function", "function": spec["tool_call"]}
    message = {"role": "assistant", "content": spec["thought"], "tool_calls": [call]}
    oa_usage = {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}
    chat_whole = orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL_NAME,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
            ],
            "usage": oa_usage,
        }
    )

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return (
            b"data: "
            + orjson.dumps(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": MODEL_NAME,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
            + b"\n\n"
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
    chat_events.append(b"data: [DONE]\n\n")

    models = orjson.dumps(
        {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "max_model_len": 262144}]}
    )
    json_h = [(b"content-type", b"application/json")]
    state = {"pace": pace}
    sse_h = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send)
        path = scope["path"]
        body = await asgi_body(receive)
        if path == "/pace":  # the benchmark switches pacing between modes
            state["pace"] = float(orjson.loads(body)["ms"]) / 1000
            path = "/health"
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
        token_in = path == "/inference/v1/generate"
        if not req.get("stream"):
            await send({"type": "http.response.start", "status": 200, "headers": json_h})
            await send(
                {"type": "http.response.body", "body": gen_whole if token_in else chat_whole}
            )
            return
        await send({"type": "http.response.start", "status": 200, "headers": sse_h})
        events = gen_events if token_in else chat_events
        pace_s = state["pace"]
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


def _relay_app(upstream: str, kind: str):
    """The floor a Python proxy can reach: read the body, parse it once (as any proxy that
    looks at the request must), forward the bytes, stream the answer back."""
    state: dict = {}
    ok_h = [(b"content-type", b"application/json")]

    async def startup() -> None:
        if kind == "relay-aiohttp":
            import aiohttp

            state["s"] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
            )
        else:
            import httpx

            state["c"] = httpx.AsyncClient(
                timeout=600,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024),
            )

    async def shutdown() -> None:
        if "s" in state:
            await state["s"].close()
        if "c" in state:
            await state["c"].aclose()

    async def app(scope, receive, send):  # noqa: ANN001
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send, startup, shutdown)
        body = await asgi_body(receive)
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": ok_h})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        req = orjson.loads(body) if body else {}
        stream = isinstance(req, dict) and bool(req.get("stream"))
        url = upstream + scope["path"]
        headers = {"content-type": "application/json"}
        if kind == "relay-aiohttp":
            async with state["s"].post(url, data=body, headers=headers) as r:
                await send(
                    {
                        "type": "http.response.start",
                        "status": r.status,
                        "headers": [(b"content-type", r.headers.get("content-type", "").encode())],
                    }
                )
                if stream:
                    async for part in r.content.iter_any():
                        await send({"type": "http.response.body", "body": part, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                else:
                    await send({"type": "http.response.body", "body": await r.read()})
            return
        client = state["c"]
        async with client.stream("POST", url, content=body, headers=headers) as r:
            await send(
                {
                    "type": "http.response.start",
                    "status": r.status_code,
                    "headers": [(b"content-type", r.headers.get("content-type", "").encode())],
                }
            )
            if stream:
                async for part in r.aiter_raw():
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                await send({"type": "http.response.body", "body": await r.aread()})

    return app


def _turnstile_app(engine_url: str, data: str, port: int):
    """``turnstile serve`` with the vLLM adapter (token-in ``/inference/v1/generate``)."""
    from turnstile.engines.vllm import VLLMEngine
    from turnstile.server.app import create_app
    from turnstile.wiring import build_gateway

    gateway = build_gateway(engine_url, str(tiny_qwen2()), data, model_name=MODEL_NAME)
    gateway.engine = VLLMEngine(engine_url, api="generate", logprobs_mode="processed_logprobs")
    import inspect

    auth = {"token": TOKEN} if "token" in inspect.signature(create_app).parameters else {}
    return create_app(gateway, f"http://127.0.0.1:{port}", **auth)


def _serve_main(argv: list[str]) -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["fake", "relay-aiohttp", "relay-httpx", "turnstile", "floor"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--spec")
    p.add_argument("--pace-ms", type=float, default=0.0)
    p.add_argument("--upstream")
    p.add_argument("--engine-url")
    p.add_argument("--data")
    a = p.parse_args(argv)
    if a.kind == "fake":
        app = _fake_app(json.loads(Path(a.spec).read_text()), a.pace_ms / 1000)
    elif a.kind == "turnstile":
        app = _turnstile_app(a.engine_url, a.data, a.port)
    elif a.kind == "floor":
        from _floor import floor_app

        app = floor_app(a.upstream.rstrip("/"), tiny_qwen2(), a.data)
    else:
        app = _relay_app(a.upstream.rstrip("/"), a.kind)
    # The same server settings as `turnstile serve`.
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


# ---------------------------------------------------------------------------------------------
# reporting


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    if title:
        lines.append(title)
    lines.append(
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"
    )
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        lines.append(
            "| "
            + " | ".join(
                c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(r, widths, strict=True)
            )
            + " |"
        )
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    return bool(s) and (s[0].isdigit() or s[0] in "-+.") and s not in ("-",)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)


def live_bytes(root: object) -> int:
    """Bytes of every object reachable from ``root`` (``sys.getsizeof``, each object once),
    leaving out what is shared process-wide: classes, modules, functions."""
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


@contextlib.contextmanager
def workdir(name: str, keep: bool = False) -> Iterator[Path]:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=f"turnstile-bench-{name}-"))
    try:
        yield d
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("TURNSTILE_SRC") or str(ROOT))
    _serve_main(sys.argv[1:])
