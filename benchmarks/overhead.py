"""Per-call overhead of a proxy on the rollout path: Turnstile next to the minimal Python relays
and the LiteLLM proxy, measured side by side in one run.

Set-up (printed with the results):

- a fast fake engine (``turnstile.testing.fake_vllm_replay``): vLLM 0.33
  ``/inference/v1/generate`` for Turnstile
  (token-in: 64 token IDs with logprobs, all at once or one SSE event per token) and an OpenAI
  ``/v1/chat/completions`` with the same reply as text + tool call for the relays and LiteLLM;
- targets: ``direct`` (the client straight to the fake: the baseline for added latency),
  ``relay-aiohttp`` and ``relay-httpx`` (a bare ASGI app on uvicorn+uvloop+httptools that reads
  and parses the body once and forwards it), ``turnstile`` (the real gateway: Qwen2 tokenizer,
  Qwen2.5 template, parsing, SQLite records, vLLM adapter; served like ``turnstile serve``)
  ``litellm`` (the LiteLLM 1.110.2 proxy, one worker, from the bench venv), ``floor``
  (``_floor.py``: the least a token-recording proxy must do, built from the cheapest parts
  there are: the yardstick for what part of Turnstile's cost is the job itself) and
  ``floor-aiohttp`` (the first floor: aiohttp's client, ``tokenizers``, a commit per call);
- after the measured cells, a check pass: one call per agent per mode through each target that
  records tokens, their records (as a trainer reads them) checked against what the fake engine
  received and sampled (``_records.py``); a failed call or a wrong record exits non-zero;
- the load generator is the official ``openai`` client (AsyncOpenAI) driving agent sessions of
  4 turns (each turn resends the history plus the assistant's tool call and the tool's
  output; mean request ~4.9 KB), at concurrency 1, 32 and 256;
- the load generator and the fake engine are pinned to core 0, every proxy to core 1;
- per cell: the proxy process's CPU seconds (all threads, /proc) per call, p50/p99 latency
  added over ``direct`` at the same concurrency, and calls/s;
- modes: ``plain`` (non-streaming), ``stream`` (64 SSE events sent at once), ``paced``
  (streaming, one token every 10 ms, each its own read).

    python benchmarks/overhead.py            # full run (~5 minutes)
    python benchmarks/overhead.py --quick    # smoke run (seconds; no LiteLLM)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import _machine
import _records
import _report
import _servers
import _workload
import orjson

TURNS = 4  # agent turns per session
TOKEN_IN = ("turnstile", "floor")  # the targets named so record tokens (turnstile-base, ...)
LOADGEN_CPU, PROXY_CPU = 0, 1


REPLY_TOKENS = 64  # tokens per completion (--reply-tokens)


class Target:
    def __init__(
        self, name: str, url: str, server: _machine.Server | None, api_key: str = "unused"
    ):
        self.name, self.url, self.server, self.api_key = name, url, server, api_key
        self.client = None
        self.agents: list[Agent] = []

    def make_client(self, conc: int):
        import httpx
        import openai

        http = httpx.AsyncClient(
            timeout=300,
            limits=httpx.Limits(
                max_connections=max(conc, 16) + 16, max_keepalive_connections=max(conc, 16) + 16
            ),
        )
        # Retries only cover a kept-alive connection the server closed while idle (between
        # cells); errors are counted either way.
        self.client = openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=self.api_key, max_retries=2, http_client=http
        )
        return self.client


class Agent:
    """One agent harness: sessions of TURNS turns; each turn resends the history, then the
    reply (a tool call) and the tool's output are appended. It keeps its place between cells,
    and agents start staggered (agent i is at turn i % TURNS), so every cell sees the same mix
    of first turns (a whole prompt to render) and later turns (a delta)."""

    def __init__(self, base: list[dict]):
        self.base = base
        self.answered: list[tuple[str, int]] = []  # (session, call's place in it) per answer
        self.new_session()

    def new_session(self) -> None:
        self.sid = "bench-" + uuid.uuid4().hex[:16]
        self.msgs = list(self.base)
        self.turn = 0

    async def call(self, client, mode: str, sizes: list[int], lat: list[float]) -> bool:
        kw = dict(
            model=_workload.MODEL_NAME,
            messages=self.msgs,
            tools=_workload.TOOLS,
            max_tokens=REPLY_TOKENS,
            temperature=1.0,
            extra_headers={"x-session-id": self.sid},
        )
        sizes.append(len(orjson.dumps({"messages": self.msgs, "tools": _workload.TOOLS})))
        sid, index = self.sid, self.turn
        t0 = time.perf_counter()
        try:
            content, calls = await self._create(client, mode, kw)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            print(f"    error: {type(exc).__name__}: {exc}", flush=True)
            self.new_session()
            return False
        lat.append(time.perf_counter() - t0)
        if not calls:
            raise RuntimeError(f"no tool call in the reply: {content!r}")
        self.answered.append((sid, index))
        self.msgs = [
            *self.msgs,
            {"role": "assistant", "content": content or None, "tool_calls": calls},
            _workload.tool_result(calls[0]["id"], self.turn),
        ]
        self.turn += 1
        if self.turn == TURNS:
            self.new_session()
        return True

    @staticmethod
    async def _create(client, mode: str, kw: dict) -> tuple[str | None, list[dict]]:
        if mode == "plain":
            r = await client.chat.completions.create(**kw)
            m = r.choices[0].message
            return m.content, [tc.model_dump() for tc in m.tool_calls or []]
        content, calls = "", []
        stream = await client.chat.completions.create(**kw, stream=True)
        async for ch in stream:
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                while len(calls) <= tc.index:
                    calls.append(
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                cur = calls[tc.index]
                cur["id"] = tc.id or cur["id"]
                if tc.function:
                    cur["function"]["name"] += tc.function.name or ""
                    cur["function"]["arguments"] += tc.function.arguments or ""
        return content, calls


async def run_cell(target: Target, mode: str, conc: int, per_agent: int) -> dict:
    client = target.client
    lat: list[float] = []
    sizes: list[int] = []
    errors = 0

    async def worker(agent: Agent) -> None:
        nonlocal errors
        for _ in range(per_agent):
            ok = await agent.call(client, mode, sizes, lat)
            errors += not ok  # (not "errors += not await ...": it reads errors before awaiting)

    cpu0 = target.server.cpu_pair() if target.server else (0.0, 0.0)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(a) for a in target.agents[:conc]))
    wall = time.perf_counter() - t0
    cpu1 = target.server.cpu_pair() if target.server else (0.0, 0.0)
    fine, ticks = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    # A thread that exited during the cell is missing from the per-thread counters.
    used = fine if fine >= ticks - 0.02 else ticks
    n = max(1, len(lat))
    return {
        "target": target.name,
        "mode": mode,
        "conc": conc,
        "calls": len(lat),
        "errors": errors,
        "cpu_ms": used / n * 1000,
        "p50": _report.pct(lat, 50) * 1000,
        "p99": _report.pct(lat, 99) * 1000,
        "rps": len(lat) / wall,
        "wall": wall,
        "req_bytes": sum(sizes) / max(1, len(sizes)),
        "cpu_s": used,
        "lat": lat,
    }


def pooled(rows: list[dict]) -> list[dict]:
    """One row per (target, mode, conc) from several rounds: CPU and calls summed, latency
    percentiles over every call, throughput over the summed wall time."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["target"], r["mode"], r["conc"]), []).append(r)
    out = []
    for (target, mode, conc), rs in groups.items():
        lat = [x for r in rs for x in r["lat"]]
        n = max(1, len(lat))
        out.append(
            {
                "target": target,
                "mode": mode,
                "conc": conc,
                "calls": len(lat),
                "errors": sum(r["errors"] for r in rs),
                "cpu_ms": sum(r["cpu_s"] for r in rs) / n * 1000,
                "p50": _report.pct(lat, 50) * 1000,
                "p99": _report.pct(lat, 99) * 1000,
                "rps": len(lat) / sum(r["wall"] for r in rs),
                "wall": sum(r["wall"] for r in rs),
                "req_bytes": sum(r["req_bytes"] for r in rs) / len(rs),
                "rounds": [r["cpu_ms"] for r in rs],
            }
        )
    return out


def plan(quick: bool, conc: int, mode: str) -> int:
    """Calls per agent in a cell: a multiple of TURNS where the cell is small, so that every
    cell has the same mix of turns (agents are staggered across turns)."""
    if quick:
        return 2
    if mode == "paced":
        return {1: 8, 32: 2}.get(conc, 1)
    return {1: 200, 32: 16}.get(conc, 4)


async def warm_up(targets: list[Target], conc: int, base: list[dict]) -> None:
    """Connections, caches, code paths; and the stagger: agent i makes i % TURNS calls."""
    for t in targets:
        t.make_client(conc)
        t.agents = [Agent(base) for _ in range(conc)]

        async def stagger(i: int, agent: Agent, t: Target = t) -> None:
            for _ in range(i % TURNS + (TURNS if i < 8 else 0)):
                await agent.call(t.client, "plain", [], [])

        await asyncio.gather(*(stagger(i, a) for i, a in enumerate(t.agents)))


async def measure(
    targets: list[Target],
    modes: list[str],
    concs: list[int],
    quick: bool,
    base: list[dict],
    fake_url: str,
    pace_ms: float,
    rounds: int = 1,
    after_warm_up: Callable[[], None] | None = None,
) -> list[dict]:
    """Each cell once per round; the targets' order reversed every other round (ABBA), so a
    drift of the machine over the run falls on every target alike."""
    await warm_up(targets, max(concs), base)
    rows = []
    for mode in modes:
        await asyncio.to_thread(_servers.set_pace, fake_url, pace_ms if mode == "paced" else 0.0)
        if after_warm_up is not None:
            after_warm_up()
            after_warm_up = None
        for conc in concs:
            for rnd in range(rounds):
                for t in targets if rnd % 2 == 0 else targets[::-1]:
                    rows.append(await run_cell(t, mode, conc, plan(quick, conc, mode)))
                    r = rows[-1]
                    print(
                        f"  {mode:<6} conc {conc:>3} {t.name:<13} {r['cpu_ms']:.3f} ms CPU/call "
                        f"p50 {r['p50']:.1f} ms  {r['rps']:.0f} calls/s"
                        + (f"  {r['errors']} errors" if r["errors"] else ""),
                        flush=True,
                    )
    if not any(r["errors"] for r in rows):
        await check_pass(targets, modes, max(concs), fake_url)
    for t in targets:
        await t.client.close()
    return rows


async def check_pass(targets: list[Target], modes: list[str], conc: int, fake_url: str) -> None:
    """After the measured cells, with the fake engine's recorder on: one call per agent in
    each mode through each target that records tokens (what each answered is kept in
    ``Agent.answered`` for :func:`check_records`)."""
    await asyncio.to_thread(_servers.set_pace, fake_url, 0.0)
    await asyncio.to_thread(_records.start, fake_url)
    for t in targets:
        for a in t.agents:
            a.answered.clear()
    for mode in modes:
        for t in targets:
            if t.name.startswith(TOKEN_IN):
                await run_cell(t, mode, conc, 1)


def check_records(targets: list[Target], fake_url: str, wd: Path) -> list[str]:
    """The check pass's records against what the fake engine received and sampled
    (``_records.check``)."""
    answered = []
    for t in targets:
        calls = [c for a in t.agents for c in a.answered]
        if t.name.startswith("turnstile"):
            answered.append(("turnstile", t.url, calls))
        elif t.name.startswith("floor"):
            answered.append(("floor", str(wd / t.name / "floor.sqlite3"), calls))
    out = _records.check(fake_url, answered, _servers.TOKEN, REPLY_TOKENS)
    checked = {t.name: len(c) for t, (_, _, c) in zip(targets_in(targets), answered, strict=True)}
    print(f"\nrecords checked against the engine's own account: {checked}")
    return out


def targets_in(targets: list[Target]) -> list[Target]:
    """The targets that record tokens."""
    return [t for t in targets if t.name.startswith(TOKEN_IN)]


def corrupt_one(data: Path, session: str, index: int) -> None:
    """The smoke test's negative control (``--corrupt-record``): one checked call's logprobs
    zeroed in Turnstile's SQLite file (docs/schema.md), as a wrong record would be."""
    import sqlite3

    (db,) = [p for p in data.iterdir() if p.suffix in (".sqlite3", ".db", ".sqlite")]
    con = sqlite3.connect(db)
    with con:
        (cid, lps) = con.execute(
            "SELECT id, completion_logprobs FROM calls WHERE session_id = ? "
            "ORDER BY seq LIMIT 1 OFFSET ?",
            (session, index),
        ).fetchone()
        con.execute("UPDATE calls SET completion_logprobs = ? WHERE id = ?", (bytes(len(lps)), cid))
    con.close()


def report(rows: list[dict], concs: list[int], pace: float = 10.0) -> str:
    out = []
    for mode in ("plain", "stream", "paced"):
        mrows = [r for r in rows if r["mode"] == mode]
        if not mrows:
            continue
        table_rows = []
        for conc in concs:
            crow = [r for r in mrows if r["conc"] == conc]
            direct = next((r for r in crow if r["target"] == "direct"), None)
            relays = [r for r in crow if r["target"].startswith("relay")]
            floor = min((r["cpu_ms"] for r in relays), default=float("nan"))
            recorder = next((r["cpu_ms"] for r in crow if r["target"] == "floor"), None)
            old = next((r["cpu_ms"] for r in crow if r["target"] == "floor-aiohttp"), None)
            for r in crow:
                if r["target"] == "direct":
                    continue
                add50 = r["p50"] - direct["p50"] if direct else float("nan")
                add99 = r["p99"] - direct["p99"] if direct else float("nan")
                table_rows.append(
                    [
                        conc,
                        r["target"],
                        r["calls"] + r["errors"],
                        r["errors"],
                        r["cpu_ms"],
                        r["cpu_ms"] / floor if floor == floor else float("nan"),
                        *([r["cpu_ms"] / recorder] if recorder else []),
                        *([r["cpu_ms"] / old] if old else []),
                        add50,
                        add99,
                        r["rps"],
                    ]
                )
        title = {
            "plain": "non-streaming",
            "stream": f"streaming ({REPLY_TOKENS} events at once)",
            "paced": f"streaming, one token every {pace:g} ms",
        }[mode]
        out.append(
            _report.table(
                [
                    "conc",
                    "proxy",
                    "calls",
                    "errors",
                    "CPU ms/call",
                    "x fastest relay",
                    *(["x floor"] if any(r["target"] == "floor" for r in mrows) else []),
                    *(
                        ["x floor-aiohttp"]
                        if any(r["target"] == "floor-aiohttp" for r in mrows)
                        else []
                    ),
                    "added p50 ms",
                    "added p99 ms",
                    "calls/s",
                ],
                table_rows,
                f"\n### {title}\n",
            )
        )
        for conc in concs:
            crow = {r["target"]: r for r in mrows if r["conc"] == conc}
            floor_rounds = crow.get("floor", {}).get("rounds", [])
            for name, r in crow.items():
                if len(floor_rounds) > 1 and name not in ("floor", "direct"):
                    each = ", ".join(
                        f"{a / b:.2f}" for a, b in zip(r["rounds"], floor_rounds, strict=True)
                    )
                    out.append(f"{name} x floor, each round at conc {conc}: {each}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few calls per cell, no LiteLLM")
    p.add_argument("--conc", default=None, help="concurrencies, e.g. 1,32,256")
    p.add_argument("--modes", default="plain,stream,paced")
    p.add_argument(
        "--targets",
        default="direct,relay-aiohttp,relay-httpx,floor,floor-aiohttp,turnstile,litellm",
    )
    p.add_argument("--pace-ms", type=float, default=None, help="10 (1 with --quick)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument(
        "--reply-tokens",
        type=int,
        default=64,
        help="tokens per completion (64; longer ones show what each sampled token costs)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every cell this many times, the targets' order reversed every other round; "
        "the table pools them (and lists each round's CPU per call)",
    )
    p.add_argument(
        "--stop-engine",
        action="store_true",
        help="a negative control: the fake engine is stopped after the warm-up, so every "
        "measured call fails and the run must exit non-zero",
    )
    p.add_argument(
        "--corrupt-record",
        action="store_true",
        help="a negative control: one of Turnstile's checked records is changed before the "
        "check, which must fail the run",
    )
    p.add_argument(
        "--baseline",
        metavar="SRC",
        help="also run 'turnstile-base': the turnstile package of another checkout "
        "(e.g. a git worktree of an earlier commit), side by side",
    )
    args = p.parse_args()
    args.pace_ms = args.pace_ms if args.pace_ms is not None else (1.0 if args.quick else 10.0)
    concs = [int(x) for x in (args.conc or ("2" if args.quick else "1,32,256")).split(",")]
    modes = args.modes.split(",")
    names = args.targets.split(",")
    skipped = {}
    if args.quick and "litellm" in names:
        names.remove("litellm")
        skipped["litellm"] = "left out of --quick runs (it takes ~25 s to start)"
    elif "litellm" in names and (why := _servers.litellm_available()):
        names.remove("litellm")
        skipped["litellm"] = why
    _machine.pin(LOADGEN_CPU)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    global REPLY_TOKENS
    REPLY_TOKENS = args.reply_tokens
    spec = _workload.reply_spec(REPLY_TOKENS)
    base = _workload.base_messages(pad_to=3500)
    print("# Per-call overhead: Turnstile vs minimal relays vs LiteLLM")
    print(f"machine: {_machine.machine()}")
    print(
        f"pinning: load generator (openai {__import__('openai').__version__} AsyncOpenAI) and "
        f"fake engine on core {LOADGEN_CPU}, each proxy on core {PROXY_CPU}"
    )
    print(
        f"workload: agent sessions of {TURNS} turns, {REPLY_TOKENS}-token completions (a thought "
        f"+ a Hermes tool call), tools={len(_workload.TOOLS)}; concurrency {concs}; modes {modes}"
    )
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    rows: list[dict] = []
    t_start = time.time()
    with _machine.workdir("overhead") as wd:
        spec_path = wd / "spec.json"
        spec_path.write_text(json.dumps(spec))
        fake, fake_url = _servers.start_fake(spec_path, LOADGEN_CPU, wd / "fake.log")
        servers: list[_machine.Server] = [fake]
        try:
            targets = []
            for name in names:
                if name == "direct":
                    targets.append(Target(name, fake_url, None))
                elif name.startswith(("relay", "floor")):
                    (wd / name).mkdir()
                    s, url = _servers.start_relay(
                        name, fake_url, PROXY_CPU, wd / f"{name}.log", wd / name
                    )
                    servers.append(s)
                    targets.append(Target(name, url, s))
                elif name == "turnstile":
                    s, url = _servers.start_turnstile(
                        fake_url, wd / "data", PROXY_CPU, wd / "turnstile.log"
                    )
                    servers.append(s)
                    targets.append(Target(name, url, s, _servers.TOKEN))
                    if args.baseline:
                        s, url = _servers.start_turnstile(
                            fake_url,
                            wd / "data-base",
                            PROXY_CPU,
                            wd / "turnstile-base.log",
                            args.baseline,
                        )
                        servers.append(s)
                        targets.append(Target("turnstile-base", url, s, _servers.TOKEN))
                elif name == "litellm":
                    s, url = _servers.start_litellm(fake_url, PROXY_CPU, wd / "litellm.log", wd)
                    servers.append(s)
                    targets.append(Target(name, url, s, _servers.LITELLM_KEY))
                else:
                    raise SystemExit(f"unknown target {name!r}")
            rows += asyncio.run(
                measure(
                    targets,
                    modes,
                    concs,
                    args.quick,
                    base,
                    fake_url,
                    args.pace_ms,
                    args.rounds,
                    fake.stop if args.stop_engine else None,
                )
            )
            errors = sum(r["errors"] for r in rows)
            if errors:
                problems = [f"{errors} calls failed"]
            else:
                if args.corrupt_record:
                    t = next(t for t in targets if t.name == "turnstile")
                    corrupt_one(wd / "data", *next(a for a in t.agents if a.answered).answered[0])
                problems = check_records(targets, fake_url, wd)
        finally:
            for s in reversed(servers):
                s.stop()
    rows = pooled(rows)
    sizes = [r["req_bytes"] for r in rows]
    print(
        f"\nmean request body: {sum(sizes) / len(sizes) / 1000:.2f} KB; run took "
        f"{time.time() - t_start:.0f} s; CPU = utime+stime of the proxy process "
        f"(per-thread schedstat, ns) over the cell / calls"
    )
    print(report(rows, concs, args.pace_ms))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if problems:
        print("\nFAILED:\n  " + "\n  ".join(problems[:20]))
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
