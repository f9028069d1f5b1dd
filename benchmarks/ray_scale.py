"""Turnstile on Ray Serve (issues 15, 28): calls/s and CPU per call with 1 and 2 gateway
replicas, each reached through Serve's HTTP proxy and directly (a session's base URL naming its
replica's own port, ``build_app(direct=True)``), next to the single-process server, against the
fast fake engine.

Set-up (printed with the results): the fake vLLM engine
(``turnstile.testing.fake_vllm_replay``, token-in
``/inference/v1/generate``, 64 token IDs per reply), the agent workload of ``overhead.py`` (the
official ``openai`` AsyncOpenAI client, sessions of 4 turns) on session base URLs, as a
harness is given them: sessions are opened by the trainer before each cell (outside its CPU
window), each agent takes the next one's ``base_url`` (or, for the Serve row of a direct
deployment, its ``fallback_base_url``: Serve's proxy). One local Ray node (``ray.init``, no
dashboard). Targets:

- ``single``: ``turnstile serve`` as one process (uvicorn), the baseline;
- ``ray-N serve``: ``turnstile.app.ray.build_app`` with N replicas (one CPU each), calls through
  Serve's proxy;
- ``ray-N direct``: the same deployment, calls on the replicas' own ports.

CPU per call is summed over the processes that serve it: the gateway (``single``); for Ray the
replicas, the HTTP proxy, and the rest of Ray (controller, raylet, GCS, workers), each shown.
Store write time per call comes from each gateway's own ``/metrics``
(``turnstile_store_write_seconds``, a deployment's two rows together); bytes per call from the
store file.

    python benchmarks/ray_scale.py            # full run (~3 minutes)
    python benchmarks/ray_scale.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
from collections import deque
from pathlib import Path

import _machine
import _records
import _report
import _servers
import _workload
import httpx
import psutil
from overhead import TURNS, Agent, Target, run_cell
from prometheus_client.parser import text_string_to_metric_families


class RayCPU:
    """CPU seconds of this machine's Ray processes, by role (``cpu_pair`` for run_cell)."""

    ROLES = ("replicas", "proxy", "rest of Ray")

    @staticmethod
    def role(p: psutil.Process) -> str | None:
        try:
            name = " ".join(p.cmdline())[:200]
        except psutil.Error:
            return None
        if "ServeReplica" in name or "SERVE_REPLICA" in name:
            return "replicas"
        if "ProxyActor" in name:
            return "proxy"
        if name.startswith("ray::") or "raylet" in name or "gcs_server" in name:
            return "rest of Ray"
        return None

    def by_role(self) -> dict[str, float]:
        out = dict.fromkeys(self.ROLES, 0.0)
        for p in psutil.process_iter():
            r = self.role(p)
            if r is not None:
                try:
                    t = p.cpu_times()
                except psutil.Error:
                    continue
                out[r] += t.user + t.system
        return out

    def cpu_pair(self) -> tuple[float, float]:
        total = sum(self.by_role().values())
        return total, total


def metrics_by_replica(url: str, tries: int = 40) -> dict[str, dict[str, float]]:
    """Store write sum/count per replica, from /metrics (Serve spreads these scrapes)."""
    out: dict[str, dict[str, float]] = {}
    with httpx.Client(headers={"authorization": f"Bearer {_servers.TOKEN}"}, timeout=30) as http:
        for _ in range(tries):
            for fam in text_string_to_metric_families(http.get(url + "/metrics").text):
                for s in fam.samples:
                    kind = s.name.removeprefix("turnstile_store_write_seconds_")
                    if kind in ("sum", "count"):
                        out.setdefault(s.labels["replica"], {})[kind] = s.value
    return out


def store_bytes(data: Path) -> tuple[int, int]:
    db = sqlite3.connect(data / "turnstile.sqlite3")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    calls = db.execute("SELECT count(*) FROM calls").fetchone()[0]
    db.close()
    return (data / "turnstile.sqlite3").stat().st_size, calls


class SessionAgent(Agent):
    """overhead.py's agent on a session's base URL (what a harness is given), each session one
    the trainer opened ahead; ``run_cell``'s shared client is not used."""

    def __init__(self, base: list[dict], pool: deque, http: httpx.AsyncClient):
        self.pool, self.http = pool, http
        super().__init__(base)

    def new_session(self) -> None:
        import openai

        self.sid, url = self.pool.popleft()
        self.oa = openai.AsyncOpenAI(
            base_url=url, api_key="unused", max_retries=2, http_client=self.http
        )
        self.msgs = list(self.base)
        self.turn = 0

    async def call(self, client, mode: str, sizes: list[int], lat: list[float]) -> bool:
        return await super().call(self.oa, mode, sizes, lat)


async def open_sessions(url: str, n: int, field: str) -> deque:
    """``n`` sessions opened by the trainer: ``(id, base URL)``, the URL from ``field``."""
    async with httpx.AsyncClient(
        headers={"authorization": f"Bearer {_servers.TOKEN}"}, timeout=60
    ) as http:
        out = deque()
        for _ in range(n):
            r = await http.post(url + "/v1/sessions", json={"metadata": {}})
            r.raise_for_status()
            s = r.json()
            out.append((s["id"], s[field]))
    return out


async def drive(
    fake_url: str,
    target: Target,
    conc: int,
    per_agent: int,
    base: list[dict],
    cpu: RayCPU | None = None,
    field: str = "base_url",
) -> dict:
    """Open the sessions, warm up (connections, trees, code paths), then one measured cell;
    with ``cpu``, the cell's CPU per call of each Ray role."""
    pool = await open_sessions(target.url, conc * ((per_agent + 2) // TURNS + 3), field)
    http = httpx.AsyncClient(
        timeout=300,
        limits=httpx.Limits(max_connections=conc + 16, max_keepalive_connections=conc + 16),
    )
    target.agents = [SessionAgent(base, pool, http) for _ in range(conc)]
    await run_cell(target, "plain", conc, 2)
    await asyncio.to_thread(_records.start, fake_url)
    for a in target.agents:
        a.answered.clear()
    before = cpu.by_role() if cpu else {}
    row = await run_cell(target, "plain", conc, per_agent)
    if cpu:
        after = cpu.by_role()
        row["parts"] = {k: (after[k] - before[k]) / max(1, row["calls"]) * 1000 for k in after}
    await http.aclose()
    answered = [c for a in target.agents for c in a.answered]
    row["problems"] = await asyncio.to_thread(
        _records.check, fake_url, [("turnstile", target.url, answered)], _servers.TOKEN, 64
    )
    row["checked"] = len(answered)
    return row


def ray_target(n: int, fake_url: str, data: Path, port: int):
    from ray import serve

    from turnstile.app.cli import build_parser
    from turnstile.app.ray import build_app, replica_options

    options = _servers.serve_options(fake_url, data)
    args = build_parser().parse_args(
        ["serve", *options, "--public-url", f"http://127.0.0.1:{port}"]
    )
    args.trainer_token = _servers.TOKEN
    app = build_app(replica_options(args), replicas=n, direct=True)
    serve.run(app, name="turnstile", route_prefix="/")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--conc", type=int, default=None, help="concurrent agents (default 32)")
    p.add_argument("--json")
    a = p.parse_args()
    conc = a.conc or (4 if a.quick else 32)
    per_agent = 2 if a.quick else 16
    import ray
    from ray import serve

    spec, base = _workload.reply_spec(64), _workload.base_messages(pad_to=3500)
    _workload.tiny_qwen2()  # built here, before the replicas load it
    print(
        "# Turnstile on Ray Serve: 1 vs 2 gateway replicas (Serve's proxy / direct) vs one process"
    )
    print(f"machine: {_machine.machine()}")
    print(
        f"workload: {conc} concurrent agents x {per_agent} calls (sessions of 4 turns, 64-token "
        f"completions) on session base URLs, non-streaming, against the fake vLLM engine; "
        "nothing pinned"
    )
    rows: list[dict] = []
    with _machine.workdir("ray-scale") as wd:
        (wd / "spec.json").write_text(json.dumps(spec))
        fake, fake_url = _servers.start_fake(wd / "spec.json", None, wd / "fake.log")
        try:
            s, url = _servers.start_turnstile(fake_url, wd / "single", None, wd / "single.log")
            try:
                row = asyncio.run(
                    drive(fake_url, Target("single", url, s, _servers.TOKEN), conc, per_agent, base)
                )
                size, calls = store_bytes(wd / "single")
                row.update(bytes_per_call=size / calls, parts={"gateway": row["cpu_ms"]})
                w = metrics_by_replica(url, 1)
                row["store_ms"] = {k: v["sum"] / v["count"] * 1000 for k, v in w.items()}
                rows.append(row)
            finally:
                s.stop()
            # the replicas and Serve's proxy import this checkout's turnstile
            os.environ.update(_servers.pythonpath())
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            port = _machine.free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            url = f"http://127.0.0.1:{port}"
            cpu = RayCPU()
            for n in (1, 2):
                data = wd / f"ray-{n}"
                ray_target(n, fake_url, data, port)
                for how, field in (("serve", "fallback_base_url"), ("direct", "base_url")):
                    target = Target(f"ray-{n} {how}", url, cpu, _servers.TOKEN)  # type: ignore[arg-type]
                    rows.append(
                        asyncio.run(drive(fake_url, target, conc, per_agent, base, cpu, field))
                    )
                size, calls = store_bytes(data)
                w = metrics_by_replica(url)
                store_ms = {
                    k[:8]: v["sum"] / v["count"] * 1000 for k, v in w.items() if v.get("count")
                }
                for row in rows[-2:]:
                    row.update(bytes_per_call=size / calls, store_ms=store_ms)
                serve.delete("turnstile")
            serve.shutdown()
            ray.shutdown()
        finally:
            fake.stop()
    single = rows[0]
    table = []
    for r in rows:
        parts = r["parts"]
        table.append(
            [
                r["target"],
                r["calls"],
                r["errors"],
                r["rps"],
                r["p50"],
                r["p99"],
                r["cpu_ms"],
                r["cpu_ms"] - single["cpu_ms"],
                f"x{r['cpu_ms'] / single['cpu_ms']:.2f}",
                " ".join(f"{k} {v:.2f}" for k, v in parts.items()),
                " ".join(f"{v:.2f}" for v in r["store_ms"].values()),
                r["bytes_per_call"],
            ]
        )
    print(
        _report.table(
            [
                "target",
                "calls",
                "errors",
                "calls/s",
                "p50 ms",
                "p99 ms",
                "CPU ms/call",
                "vs single",
                "ratio",
                "CPU ms/call by process",
                "store write ms/call (per replica)",
                "store bytes/call",
            ],
            table,
            "\n### 1 vs 2 replicas, through Serve's proxy and direct, vs one process\n",
        )
    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    checked = {r["target"]: r["checked"] for r in rows}
    print(f"records checked against the engine's own account: {checked}")
    problems = [f"{r['target']}: {p}" for r in rows for p in r["problems"]]
    problems += [f"{r['target']}: {r['errors']} calls failed" for r in rows if r["errors"]]
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems[:20]))
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
