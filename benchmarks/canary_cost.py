"""What the drift canary (``serve --canary-fraction F``) costs: the CPU of one canary check
(re-render the harness's messages, encode, compare, locate) against the CPU of one call, side
by side in one run.

Two ``turnstile serve`` processes in front of the same fast fake vLLM
(``turnstile.testing.fake_vllm_replay``, a fixed thought + Hermes tool call reply), one at
``--canary-fraction 0`` and one at ``1``, each given the same agent sessions (a system prompt
and tools, then turns of the reply echoed back plus a tool result). Per arm: the server
process's CPU per call (``/proc``, utime + stime, after the canary drained), and at fraction 1
the canary's own CPU per check (its thread's time, ``turnstile_canary_cpu_seconds``). Exits
non-zero when a call fails or the canary did not check every call it was given.

    ~/.cache/turnstile/venv/bin/python benchmarks/canary_cost.py [--sessions 8] [--turns 16]
    ~/.cache/turnstile/venv/bin/python benchmarks/canary_cost.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer

TOKEN = "tst-canary-" + secrets.token_urlsafe(16)
SYSTEM = (
    "You are a coding agent working in a repository. Use the bash tool to run commands; read "
    "files before editing them; keep changes small and run the tests after each one. "
) * 12
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository.",
            "parameters": {
                "type": "object",
                "required": ["command"],
                "properties": {"command": {"type": "string"}},
            },
        },
    }
]
THOUGHT = "I will run the parser tests to see the failure, then read the code around it."
CALL = {"name": "bash", "arguments": {"command": "cd /repo && python -m pytest -x -q | tail"}}
OUTPUT = "collected 14 items\n\ntests/test_parser.py ......F.......\n1 failed, 13 passed\n" * 4


def model() -> Path:
    return testbed.tiny_model("qwen2", "Qwen-Qwen2.5-7B-Instruct")


def reply_spec() -> dict:
    """The fake engine's reply: the thought and the tool call as the Qwen2 tokenizer encodes
    them, ending with ``<|im_end|>``."""
    tok = load_tokenizer(str(model()))
    text = f"{THOUGHT}\n<tool_call>\n{json.dumps(CALL)}\n</tool_call>"
    ids = [*tok.encode(text), *tok.encode("<|im_end|>")]
    return {
        "token_ids": ids,
        "logprobs": [-0.1] * len(ids),
        "text": text,
        "pieces": [tok.decode([t]) for t in ids[:-1]],
        "thought": THOUGHT,
        "tool_call": {"name": CALL["name"], "arguments": json.dumps(CALL["arguments"])},
    }


def start(cmd: list[str], health: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    out = log.open("ab")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    out.close()
    headers = {"authorization": f"Bearer {TOKEN}"}
    testbed.wait_healthy(health, proc, timeout=180, headers=headers)
    return proc


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def canary_series(url: str) -> dict[str, float]:
    r = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    r.raise_for_status()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name.startswith("turnstile_canary"):
                label = "".join(
                    f":{v}" for k, v in s.labels.items() if k in ("result", "why", "where")
                )
                for key in {s.name, s.name + label}:  # the total, and by result
                    out[key] = out.get(key, 0.0) + s.value
    return out


async def session(client: httpx.AsyncClient, url: str, turns: int) -> int:
    """One agent session of ``turns`` calls; the number that failed."""
    r = await client.post(url + "/v1/sessions", json={"metadata": {}})
    r.raise_for_status()
    base = r.json()["base_url"]
    msgs: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The parser test fails; fix it."},
    ]
    failed = 0
    for turn in range(turns):
        body = {"model": "bench", "messages": msgs, "tools": TOOLS, "max_tokens": 256}
        r = await client.post(base + "/chat/completions", json=body)
        if r.status_code != 200:
            failed += 1
            print(f"call failed: {r.status_code} {r.text[:200]}", file=sys.stderr)
            break
        reply = r.json()["choices"][0]["message"]
        call_id = reply["tool_calls"][0]["id"]
        msgs += [reply, {"role": "tool", "tool_call_id": call_id, "content": OUTPUT + str(turn)}]
    return failed


async def load(url: str, sessions: int, turns: int, concurrency: int) -> int:
    limit = asyncio.Semaphore(concurrency)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=120) as client:

        async def one() -> int:
            async with limit:
                return await session(client, url, turns)

        return sum(await asyncio.gather(*(one() for _ in range(sessions))))


def arm(fraction: float, engine: str, tmp: Path, args: argparse.Namespace) -> dict:
    port = testbed.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "turnstile", "serve",
        "--engine", "vllm", "--vllm-api", "generate",
        "--engine-logprobs-mode", "processed_logprobs",
        "--engine-url", engine, "--model", str(model()), "--served-model-name", "bench",
        "--data", str(tmp / f"data-{fraction}"), "--port", str(port),
        "--canary-fraction", str(fraction),
    ]  # fmt: skip
    env = {**os.environ, "TURNSTILE_TOKEN": TOKEN}
    proc = start(cmd, url + "/v1/models", tmp / f"turnstile-{fraction}.log", env)
    try:
        asyncio.run(load(url, 1, 2, 1))  # warm: the template, the tokenizer, the canary
        deadline = time.monotonic() + 60
        while fraction and canary_series(url).get("turnstile_canary_calls_total", 0) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the canary never checked the warm-up calls")
            time.sleep(0.1)
        warm = canary_series(url)
        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        failed = asyncio.run(load(url, args.sessions, args.turns, args.concurrency))
        calls = args.sessions * args.turns
        got = warm
        deadline = time.monotonic() + 600
        while fraction:  # the canary's work counts too: wait until it drained its queue
            got = canary_series(url)
            done = got.get("turnstile_canary_calls_total", 0) - warm.get(
                "turnstile_canary_calls_total", 0
            )
            dropped = got.get("turnstile_canary_dropped_calls_total", 0)
            if done + dropped - warm.get("turnstile_canary_dropped_calls_total", 0) >= calls:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the canary checked {done} of {calls} calls in 10 minutes")
            time.sleep(0.1)
        cpu = cpu_seconds(proc.pid) - cpu0
        wall = time.perf_counter() - t0
        example = None
        if fraction:  # one session's first drift, as the session API shows it
            r = httpx.get(url + "/v1/sessions", headers={"authorization": f"Bearer {TOKEN}"})
            example = next((c for s in r.json()["data"] if (c := s["canary"]["first_drift"])), None)
    finally:
        proc.terminate()
        proc.wait(15)

    def delta(name: str) -> float:
        return got.get(name, 0.0) - warm.get(name, 0.0)

    return {
        "fraction": fraction,
        "calls": calls,
        "failed": failed,
        "cpu_per_call": cpu / calls,
        "wall": wall,
        "checked": delta("turnstile_canary_calls_total"),
        "drifted": delta("turnstile_canary_calls_total:drifted"),
        "dropped": delta("turnstile_canary_dropped_calls_total"),
        "canary_cpu": delta("turnstile_canary_cpu_seconds_sum"),
        "example": example,
        "where": {
            k.rsplit(":", 1)[1]: int(delta(k))
            for k in got
            if k.startswith("turnstile_canary_drift_calls_total:") and delta(k)
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="2 sessions of 4 turns (a smoke run)")
    args = p.parse_args()
    if args.quick:
        args.sessions, args.turns = 2, 4
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(reply_spec()))
        eport = testbed.free_port()
        engine = f"http://127.0.0.1:{eport}"
        fake = start(
            [sys.executable, "-m", "turnstile.testing.fake_vllm_replay", "--port", str(eport),
             "--spec", str(spec)],
            engine + "/health",
            tmp / "engine.log",
        )  # fmt: skip
        try:
            rows = [arm(f, engine, tmp, args) for f in (0.0, 1.0)]
        finally:
            fake.terminate()
            fake.wait(15)
    off, on = rows
    per_check = on["canary_cpu"] / on["checked"] if on["checked"] else float("nan")
    print(
        f"\n{args.sessions} sessions x {args.turns} turns, concurrency {args.concurrency}, "
        "tiny Qwen2 vocabulary, fake vLLM (one Turnstile process per arm, same engine)\n"
    )
    print(
        "| canary fraction | calls | server CPU per call (ms) | canary checks | drifted | "
        "dropped | canary CPU per check (ms) | check / call (f=0) | call f=1 / f=0 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        check = (
            f"{1000 * per_check:.2f} | {per_check / off['cpu_per_call']:.2f}x"
            if r is on
            else "- | -"
        )
        print(
            f"| {r['fraction']:g} | {r['calls']} | {1000 * r['cpu_per_call']:.2f} | "
            f"{r['checked']:.0f} | {r['drifted']:.0f} | {r['dropped']:.0f} | {check} | "
            f"{r['cpu_per_call'] / off['cpu_per_call']:.2f}x |"
        )
    print(f"\nwhere the drifted calls' first differing token lay: {on['where'] or 'none drifted'}")
    if on["example"]:
        print(f"a first drift, as GET /v1/sessions/{{id}} shows it: {on['example']}")
    bad = sum(r["failed"] for r in rows)
    if bad:
        raise SystemExit(f"{bad} calls failed")
    if on["checked"] + on["dropped"] < on["calls"] or on["checked"] == 0:
        raise SystemExit(f"the canary checked {on['checked']:.0f} of {on['calls']} calls")


if __name__ == "__main__":
    main()
