"""End to end on a real engine: a fixed batch of multi-turn sessions on SmolLM2-135M-Instruct
under llama-server, through Turnstile vs straight to llama-server's own /v1/chat/completions.

Set-up (printed with the results): llama-server from the test bed (``-np 2 -t 1``, 8k context,
pinned to core 0 with its one thread), Turnstile (``turnstile serve`` as a process, llama.cpp
adapter, SQLite records) pinned to core 1, the load generator (the official ``openai``
client, 2 sessions at a time = llama-server's 2 slots) in this process. Each session has 3 user
turns that ask for long answers with ``max_tokens`` fixed, so nearly every call generates
exactly ``max_tokens`` tokens on both paths; the report gives the generated tokens too, and the
time per generated token. The batch runs direct / Turnstile alternately, ``--rounds`` times
each, and the ratio is of the summed wall times.

    python benchmarks/end_to_end.py            # 8 sessions x 3 turns x 64 tokens, 3 rounds
    python benchmarks/end_to_end.py --quick    # 2 sessions x 2 turns x 8 tokens, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import _machine
import _report
import _servers

ENGINE_CPU, PROXY_CPU = 0, 1
TOPICS = [
    "the history of the printing press",
    "how a compiler turns code into machine code",
    "the water cycle and why it matters for farming",
    "how vaccines train the immune system",
    "the rules of chess for a complete beginner",
    "how the stock market works",
    "the life cycle of a star",
    "how to plan a vegetable garden",
]
FOLLOW_UPS = [
    "Go on, and give more detail on the second point.",
    "Now explain the same thing to a ten-year-old, at length.",
]


async def run_batch(
    base_url: str, sessions: int, turns: int, max_tokens: int, per_session_url: bool
) -> tuple[float, int, int]:
    import httpx
    import openai

    http = httpx.AsyncClient(timeout=600)
    sem = asyncio.Semaphore(2)
    counts = {"calls": 0, "tokens": 0}

    async def session(i: int) -> None:
        async with sem:
            url = base_url + "/v1"
            if per_session_url:
                r = await http.post(
                    base_url + "/v1/sessions",
                    json={"metadata": {"i": i}},
                    headers={"authorization": f"Bearer {_servers.TOKEN}"},
                )
                url = r.json()["base_url"]
            client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, http_client=http)
            msgs = [{"role": "system", "content": "You are a helpful, thorough assistant."}]
            for t in range(turns):
                q = (
                    f"Explain {TOPICS[i % len(TOPICS)]} in detail."
                    if t == 0
                    else FOLLOW_UPS[(t - 1) % len(FOLLOW_UPS)]
                )
                msgs.append({"role": "user", "content": q})
                r = await client.chat.completions.create(
                    model="smollm2",
                    messages=msgs,
                    max_tokens=max_tokens,
                    temperature=0.7,
                    seed=1000 * i + t,
                )
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
                counts["calls"] += 1
                counts["tokens"] += r.usage.completion_tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - t0
    await http.aclose()
    return wall, counts["calls"], counts["tokens"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sessions", type=int)
    p.add_argument("--turns", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--rounds", type=int)
    args = p.parse_args()
    sessions = args.sessions or (2 if args.quick else 8)
    turns = args.turns or (2 if args.quick else 3)
    max_tokens = args.max_tokens or (8 if args.quick else 64)
    rounds = args.rounds or (1 if args.quick else 3)
    import turnstile_testbed as testbed

    model = testbed.smollm2_gguf()
    testbed.llama_server_binary()
    print("# End to end: SmolLM2-135M on llama-server, through Turnstile vs direct")
    print(f"machine: {_machine.machine()}")
    print(
        f"set-up: {sessions} sessions x {turns} turns x {max_tokens} tokens, 2 at a time; "
        f"llama-server (-np 2 -t 1) on core {ENGINE_CPU}, Turnstile on core {PROXY_CPU}; "
        f"{rounds} round(s), direct and Turnstile alternating"
    )
    totals = {"direct": [0.0, 0, 0], "turnstile": [0.0, 0, 0]}
    with _machine.workdir("e2e") as wd:
        log = wd / "llama.log"
        port = testbed.free_port()
        cmd = [
            str(testbed.llama_server_binary()),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "8192",
            "-np",
            "2",
            "-t",
            "1",
            "--no-webui",
        ]
        engine = _machine.Server(cmd, f"http://127.0.0.1:{port}/health", ENGINE_CPU, log)
        engine_url = f"http://127.0.0.1:{port}"
        tport = testbed.free_port()
        ts = _machine.Server(
            [
                sys.executable,
                "-m",
                "turnstile.app.cli",
                "serve",
                "--engine-url",
                engine_url,
                "--model",
                str(model),
                "--port",
                str(tport),
                "--data",
                str(wd / "data"),
                "--served-model-name",
                "smollm2",
            ],
            f"http://127.0.0.1:{tport}/health",
            PROXY_CPU,
            wd / "turnstile.log",
            env={"TURNSTILE_TOKEN": _servers.TOKEN},
            timeout=300,
        )
        ts_url = f"http://127.0.0.1:{tport}"
        try:
            # warm-up: both paths once (model pages, prompt cache, connections)
            asyncio.run(run_batch(engine_url, 2, 1, 4, False))
            asyncio.run(run_batch(ts_url, 2, 1, 4, True))
            for r in range(rounds):
                for name in ("direct", "turnstile") if r % 2 == 0 else ("turnstile", "direct"):
                    url = engine_url if name == "direct" else ts_url
                    wall, calls, toks = asyncio.run(
                        run_batch(url, sessions, turns, max_tokens, name == "turnstile")
                    )
                    totals[name][0] += wall
                    totals[name][1] += calls
                    totals[name][2] += toks
                    print(
                        f"  round {r + 1} {name:<9} {wall:.2f} s, {calls} calls, {toks} tokens",
                        flush=True,
                    )
        finally:
            ts.stop()
            engine.stop()
    d, t = totals["direct"], totals["turnstile"]
    rows = [
        [name, v[1], v[2], v[0], v[0] / max(1, v[2]) * 1000]
        for name, v in (
            ("direct (llama-server /v1/chat/completions)", d),
            ("through Turnstile (/completion, token-in)", t),
        )
    ]
    print()
    print(
        _report.table(["path", "calls", "generated tokens", "wall s", "ms / generated token"], rows)
    )
    print(
        f"\nTurnstile / direct wall time: {t[0] / d[0]:.3f} "
        f"({(t[0] / d[0] - 1) * 100:+.1f}%); per generated token: "
        f"{(t[0] / max(1, t[2])) / (d[0] / max(1, d[2])):.3f}; target <= 1.03"
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
