"""What recording routed experts (``serve --routed-experts``, issue 42) costs: server CPU per
call and bytes per token on disk with routing on, beside routing off, at coding-agent context
lengths, in one run.

Two ``turnstile serve`` processes (``--engine vllm``, one with ``--routed-experts``) in front of
one fake vLLM (this script, ``--serve-fake``): ``/inference/v1/generate`` answers a fixed thought +
Hermes tool call (``canary_cost.reply_spec``), and, where the request names
``routed_experts_prompt_start``, the rows vLLM 0.32 would return: base64 of a ``.npy``
``(prompt + completion - 1 - start, 48, 8)`` uint8 (a Qwen3-30B-A3B-sized router: 48 MoE
layers, 8 of 128 experts), cut from random rows made with numpy (the fake's CPU is not counted).
Per cell, sessions open with a system prompt of the cell's context length (that first call,
the whole context's rows, is a warm-up), then turns that append the reply and a tool result
(each call asks the engine only for the rows after its parent's). The arms alternate cell by
cell and see the same sessions. Reported: the server process's CPU per measured call
(``/proc`` utime + stime, read once the server is idle after the warm-up and after the last
measured turn, so the store writer's work on the warm-up's rows is not counted and that on the
measured calls' is), the ratio over all ``--rounds`` and each round's, and from each arm's
SQLite file after the run: stored bytes per recorded token (the file, and the ``arrays``
column alone) against the uint8 size of a token's routing (48 x 8 = 384 bytes).
``--control`` runs both arms without routing: the ratio's noise floor on a shared machine.
``--profile DIR`` py-spies each server over its measured turns only and prints where the
on arm's extra samples fall (wall samples of busy threads, not CPU: a guide, not a figure).

    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --turns 150 --rounds 4
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --rounds 4 --control
    ~/.cache/turnstile/venv/bin/python benchmarks/routed_experts_cost.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

import turnstile_testbed as testbed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from canary_cost import OUTPUT, SYSTEM, TOKEN, TOOLS, cpu_seconds, model, reply_spec, start  # noqa: E402

LAYERS, TOPK, EXPERTS = 48, 8, 128
CONTEXTS = (4_000, 32_000, 110_000)  # tokens of context a session's turns run at


# --- the fake engine ------------------------------------------------------------------------


def serve_fake(port: int, spec_path: Path, always: int = 0) -> None:
    """``always``: answer every request with that many rows, asked or not (the transport
    ablation: the bytes cross HTTP and the JSON parse of a server that records nothing)."""
    from aiohttp import web

    spec = json.loads(spec_path.read_text())
    ids = spec["token_ids"]
    pool = np.random.default_rng(0).integers(0, EXPERTS, (4096, LAYERS, TOPK), dtype=np.uint8)

    def routing(n: int, start: int) -> str:
        rows = pool[np.arange(start, n - 1) % len(pool)]
        buf = io.BytesIO()
        np.save(buf, rows, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode()

    async def generate(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if not body.get("token_ids"):
            return web.json_response({"error": "token_ids required"}, status=400)
        sp = body.get("sampling_params") or {}
        choice = {
            "index": 0,
            "token_ids": ids,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.1} for t in ids]},
            "finish_reason": "stop",
            "stop_reason": None,
        }
        if always:
            total = len(body["token_ids"]) + len(ids)
            choice["routed_experts"] = routing(total, max(0, total - 1 - always))
        elif "routed_experts_prompt_start" in sp:
            total = len(body["token_ids"]) + len(ids)
            choice["routed_experts"] = routing(total, int(sp["routed_experts_prompt_start"]))
        usage = {"prompt_tokens": len(body["token_ids"]), "completion_tokens": len(ids)}
        answer = {"request_id": body.get("request_id"), "choices": [choice], "usage": usage}
        if not body.get("stream"):
            return web.json_response(answer)
        # streamed: the whole reply in one event, as a burst of tokens arrives
        sse = b"data: " + json.dumps(answer).encode() + b"\n\ndata: [DONE]\n\n"
        return web.Response(body=sse, content_type="text/event-stream")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "bench", "max_model_len": 262_144}]})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", ok)
    app.router.add_get("/health", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


# --- the load -------------------------------------------------------------------------------


def system_prompt(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (the canary benchmark's, repeated)."""
    per = max(1, len(SYSTEM) // 4)  # ~4 characters per token on this text
    return SYSTEM * max(1, tokens // per)


async def settled(pid: int, quiet: float = 0.3, limit: float = 60.0) -> float:
    """The process's CPU seconds once it is idle for ``quiet`` seconds (its store writer
    done with the last record), or after ``limit`` seconds."""
    last, t0 = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - t0 < limit:
        await asyncio.sleep(quiet)
        now = cpu_seconds(pid)
        if now == last:  # not a tick (10 ms) in ``quiet`` seconds
            return now
        last = now
    return last


def run_cell(
    url: str, pid: int, context: int, sessions: int, turns: int, profile: Path | None = None
) -> tuple[float, int]:
    """Server CPU over ``sessions`` sessions' measured turns (their first calls excluded);
    ``profile``: py-spy the server over those turns only (collapsed stacks to that file)."""
    headers = {"authorization": f"Bearer {TOKEN}"}

    async def go() -> float:
        async with httpx.AsyncClient(headers=headers, timeout=600) as client:
            cpu = 0.0
            for _ in range(sessions):
                r = await client.post(url + "/v1/sessions", json={"metadata": {}})
                r.raise_for_status()
                base = r.json()["base_url"]
                msgs: list[dict] = [
                    {"role": "system", "content": system_prompt(context)},
                    {"role": "user", "content": "The parser test fails; fix it."},
                ]
                before = 0.0
                for turn in range(turns + 1):
                    body = {"model": "bench", "messages": msgs, "tools": TOOLS, "max_tokens": 256}
                    r = await client.post(base + "/chat/completions", json=body)
                    if r.status_code != 200:
                        raise SystemExit(f"call failed: {r.status_code} {r.text[:300]}")
                    if turn == 0:  # the first call (the whole context) is the warm-up:
                        before = await settled(pid)  # its record written (the store's
                        # writer runs after the answer: 42 MB of rows at 110k tokens)
                        spying = spy(profile, pid) if profile else None
                    reply = r.json()["choices"][0]["message"]
                    tool_id = reply["tool_calls"][0]["id"]
                    content = OUTPUT + str(turn)
                    msgs += [reply, {"role": "tool", "tool_call_id": tool_id, "content": content}]
                cpu += await settled(pid) - before  # the measured turns, their records written
                if spying is not None:
                    spying.send_signal(signal.SIGINT)  # it writes its file then
                    spying.wait(60)
            return cpu

    return asyncio.run(go()), sessions * turns


def stored(data: Path) -> dict:
    """Tokens recorded, the file's bytes and the arrays column's bytes of one arm's store."""
    db = sqlite3.connect(data / "turnstile.sqlite3")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    tokens, arrays = db.execute(
        "SELECT sum(length(prompt_delta) + length(completion_ids)) / 4, "
        "coalesce(sum(length(arrays)), 0) FROM calls"
    ).fetchone()
    pages = (
        db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    )
    rows = db.execute("SELECT info FROM calls").fetchall()
    db.close()
    asked = [json.loads(r[0]).get("arrays_asked", {}).get("routed_experts") for r in rows]
    return {"tokens": tokens, "file": pages, "arrays": arrays, "asked": asked}


def spy(out: Path, pid: int) -> subprocess.Popen:
    """py-spy (the venv's) on a server until SIGINT; collapsed stacks appended to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    part = out.with_name(f"{out.name}.{time.monotonic_ns()}")
    return subprocess.Popen(
        [
            str(exe),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "1000",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(part),
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# where a sample's time goes: the first of these (leaf up) its stack passes through
BUCKETS = (
    ("routing: read (base64, .npy header, checks)", ("turnstile/engines/routing.py",)),
    ("store: pack", ("turnstile/token_arrays.py",)),
    ("store: writer thread (SQLite)", ("turnstile/store/writer.py", "turnstile/store/writes.py")),
    ("engine answer: JSON", ("turnstile/engines/vllm_reader.py", "json_object (")),
    ("engine HTTP (connection)", ("turnstile/engines/connection.py",)),
    ("harness request (parse, template)", ("turnstile/dialects/", "turnstile/chat/")),
)


def profile_table(out: Path) -> str:
    """Samples per bucket in each arm (busy samples only), and the on arm's extra."""
    got: dict[str, dict[str, int]] = {}
    for name in ("off", "on"):
        counts: dict[str, int] = {}
        text = "".join(f.read_text() for f in sorted(out.glob(f"{name}.*")))
        (out / f"{name}.txt").write_text(text)
        for line in text.splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")[::-1]
            where = "other"
            for f in frames:
                hit = next((label for label, keys in BUCKETS if any(k in f for k in keys)), None)
                if hit is not None:
                    where = hit
                    break
            counts[where] = counts.get(where, 0) + int(n)
        got[name] = counts
    labels = [b[0] for b in BUCKETS] + ["other"]
    rows = [
        "| where (py-spy samples, measured turns) | off | on | on - off |",
        "|---|---|---|---|",
    ]
    for label in labels:
        a, b = got["off"].get(label, 0), got["on"].get(label, 0)
        rows.append(f"| {label} | {a} | {b} | {b - a:+d} |")
    a, b = sum(got["off"].values()), sum(got["on"].values())
    rows.append(f"| all | {a} | {b} | {b - a:+d} ({(b - a) / max(a, 1):+.1%}) |")
    return "\n".join(rows)


def serve_arm(
    name: str, engine: str, tmp: Path, routing: bool, synchronous: str = "full"
) -> tuple[str, object]:
    port = testbed.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "turnstile", "serve",
        "--engine", "vllm", "--vllm-api", "generate",
        "--engine-logprobs-mode", "processed_logprobs",
        "--engine-url", engine, "--model", str(model()), "--served-model-name", "bench",
        "--data", str(tmp / f"data-{name}"), "--port", str(port), "--engine-timeout", "120",
        "--synchronous", synchronous,
        *(["--routed-experts"] if routing else []),
    ]  # fmt: skip
    env = {**os.environ, "TURNSTILE_TOKEN": TOKEN}
    return url, start(cmd, url + "/v1/models", tmp / f"turnstile-{name}.log", env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--quick", action="store_true", help="1 session of 10 turns per cell")
    p.add_argument(
        "--rounds", type=int, default=1, help="repeat the cells, arms alternating (ABBA...)"
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="A/A: both arms without routing (the ratio's noise floor on this machine)",
    )
    p.add_argument(
        "--contexts",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=CONTEXTS,
        help="the cells' context lengths in tokens (default %(default)s)",
    )
    p.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default="full",
        help="both servers' SQLite durability (serve --synchronous; full: an fsync a commit)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy each arm's server over the measured cells (DIR/off.txt, DIR/on.txt: "
        "collapsed stacks) and print where the on arm's extra samples go",
    )
    p.add_argument(
        "--transport-only",
        action="store_true",
        help="ablation: the on arm records no routing, but its engine (a second fake) sends "
        "160 rows with every answer: what the bytes' way in costs without reading or storing",
    )
    p.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--always", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake, args.spec, args.always)
        return
    if args.quick:
        args.sessions, args.turns = 1, 10
    with tempfile.TemporaryDirectory(prefix="routed-cost-") as d:
        tmp = Path(d)
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(reply_spec()))
        eport = testbed.free_port()
        engine = f"http://127.0.0.1:{eport}"
        fake = start(
            [sys.executable, __file__, "--serve-fake", str(eport), "--spec", str(spec)],
            engine + "/health",
            tmp / "engine.log",
        )
        procs = []
        try:
            off_url, off = serve_arm("off", engine, tmp, False, args.synchronous)
            procs.append(off)
            on_engine, routed = engine, not args.control
            if args.transport_only:  # a second fake that always sends rows
                port2 = testbed.free_port()
                on_engine, routed = f"http://127.0.0.1:{port2}", False
                cmd = [sys.executable, __file__, "--serve-fake", str(port2), "--spec", str(spec)]
                procs.append(
                    start([*cmd, "--always", "160"], on_engine + "/health", tmp / "e2.log")
                )
            on_url, on = serve_arm("on", on_engine, tmp, routed, args.synchronous)
            procs.append(on)
            for url, proc in ((off_url, off), (on_url, on)):  # warm: template, tokenizer
                run_cell(url, proc.pid, 2_000, 1, 1)  # type: ignore[attr-defined]
            cells: dict[int, list[dict]] = {c: [] for c in args.contexts}
            order = 0
            for _ in range(args.rounds):
                for context in args.contexts:
                    arms = [("off", off_url, off), ("on", on_url, on)]
                    got = {}
                    for name, url, proc in arms if order % 2 == 0 else arms[::-1]:  # ABBA
                        spied = args.profile / name if args.profile else None
                        cpu, calls = run_cell(
                            url,
                            proc.pid,
                            context,
                            args.sessions,
                            args.turns,
                            spied,  # type: ignore[attr-defined]
                        )
                        got[name] = cpu / calls
                    order += 1
                    cells[context].append(got)
        finally:
            for proc in procs:
                proc.terminate()  # type: ignore[attr-defined]
                proc.wait(15)  # type: ignore[attr-defined]
            fake.terminate()
            fake.wait(15)
        disk = {name: stored(tmp / f"data-{name}") for name in ("off", "on")}
    print(
        f"\n{args.sessions} session(s) x {args.turns} measured turns per cell; routing "
        f"{LAYERS} layers x top-{TOPK} of {EXPERTS} experts (uint8: {LAYERS * TOPK} bytes a "
        "token); one turnstile serve per arm, same fake vLLM, arms alternating (ABBA)\n"
    )
    print(
        "| context (tokens) | CPU per call, off (ms) | on (ms) | on / off "
        f"(all {args.rounds} rounds) | each round |"
    )
    print("|---|---|---|---|---|")
    for context, got in cells.items():
        a = statistics.mean(g["off"] for g in got)
        b = statistics.mean(g["on"] for g in got)
        each = " ".join(f"{g['on'] / g['off']:.3f}" for g in got)
        print(f"| {context:,} | {1000 * a:.3f} | {1000 * b:.3f} | {b / a:.3f}x | {each} |")
    print()
    print(
        "| arm | tokens recorded | file bytes / token | arrays bytes / token | "
        "arrays / uint8 routing size |"
    )
    print("|---|---|---|---|---|")
    for name, s in disk.items():
        per = s["arrays"] / s["tokens"]
        print(
            f"| {name} | {s['tokens']:,} | {s['file'] / s['tokens']:.1f} | {per:.1f} | "
            f"{per / (LAYERS * TOPK):.4f} |"
        )
    if args.profile:
        print()
        print(profile_table(args.profile))
    missing = [a for a in disk["on"]["asked"] if not a or a.get("rows") is None]
    if missing and not (args.control or args.transport_only):
        raise SystemExit(f"{len(missing)} call(s) recorded no routing: {missing[:2]}")


if __name__ == "__main__":
    main()
