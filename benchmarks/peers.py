"""Turnstile next to the token-capture systems users might pick instead, in front of the same
fake vLLM engine, side by side in one run: CPU per call (non-streaming, streaming), calls/s at
concurrency 1/32/256, and exactness over multi-turn sessions with a drifting reply.

Set-up (printed with the results):

- the engine is ``_peer_engine.py``: vLLM 0.33's shapes on ``/inference/v1/generate``,
  ``/v1/chat/completions``, ``/v1/completions`` (``return_token_ids``, logprobs with
  ``return_tokens_as_token_ids``) and ``/tokenize``, the real Qwen2 tokenizer and Qwen2.5
  template, a 64-token reply whose sampled IDs are not what its text re-encodes to; it logs
  what it received and sampled per call (the ground truth);
- targets, each its own process(es) on core 1, the load generator and the engine on core 0:
  ``relay`` (the minimal aiohttp relay of ``overhead.py``: the floor, captures nothing),
  ``turnstile`` (this checkout, token-in to ``/inference/v1/generate``),
  ``agentlightning`` (0.3.0's ``LLMProxy``: the LiteLLM proxy + its ``return_token_ids``
  callback + OpenTelemetry spans into an in-memory LightningStore, ``_peer_agentlightning.py``),
  ``agentlightning-1`` (1.0.2, a rewrite: its own FastAPI server, ``python -m
  agentlightning.server``, recording each call's bodies as rollout events),
  ``nemo-gym`` (0.4.0's ``vllm_model`` server with ``return_token_id_information``:
  logprobs with token IDs + a ``/tokenize`` call per request, ``_peer_nemo_gym.py``),
  ``tokin`` (0.0.1 ships no server: its capture core - ``Session``/``Rollout`` and the Qwen
  ``ChatTemplate`` increments - driven in-process behind a minimal proxy written here,
  ``_peer_tokin.py``, token-in to ``/v1/completions``);
- the peers run from their own venvs (``setup_peer_venvs.sh``); a target whose venv is missing
  is left out, and the reason printed;
- workload: sessions of 4 turns (system + task, then each turn the reply and a new user
  message; the harness resends the history), 64-token replies, plain ``httpx`` client;
- CPU per call: the target's processes' CPU (all threads, /proc) over the cell / calls.
- exactness: sessions run one call at a time; for every call, the target's record (prompt IDs,
  completion IDs) is compared with what the engine received and sampled; and whether the
  engine's prompt at turn k+1 starts with turn k's prompt + the sampled IDs (the model saw its
  own tokens again, i.e. one session is one exact token sequence).

    python benchmarks/peers.py            # full run
    python benchmarks/peers.py --quick    # smoke run (< 60 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _machine
import _report
import _servers
import _workload

HERE = Path(__file__).resolve().parent
TURNS = 4
LOADGEN_CPU, PROXY_CPU = 0, 1
ALL = ["relay", "turnstile", "agentlightning", "agentlightning-1", "nemo-gym", "tokin"]
# What each peer's venv holds (setup_peer_venvs.sh); its python is bin/python there.
VENVS = {
    "agentlightning": "peer-agentlightning",
    "agentlightning-1": "peer-agentlightning-1",
    "nemo-gym": "peer-nemo-gym",
    "tokin": "peer-tokin",
}
NO_STREAM = {
    "agentlightning-1": "its proxy answers stream=true with 400 'Streaming responses are not "
    "supported' (agentlightning/server/proxy.py)",
    "nemo-gym": "its vllm_model server takes non-streaming requests only "
    "(NeMoGymChatCompletionCreateParamsNonStreaming)",
    "tokin": "tokin has no streaming path (a library: the caller gets whole responses)",
}


def venv_python(name: str) -> Path:
    return _machine.cache_dir() / VENVS[name] / "bin" / "python"


# ---------------------------------------------------------------------------------------------
# targets


class Target:
    """A capture system as the harness sees it: where to send a session's calls, which
    processes to charge CPU to, and how to read back what it recorded."""

    name = ""
    servers: list[_machine.Server]
    headers: dict[str, str]

    def __init__(self) -> None:
        self.servers = []
        self.headers = {}

    async def new_session(self, http) -> dict:  # noqa: ANN001
        return {"sid": "bench-" + uuid.uuid4().hex[:16]}

    def url(self, session: dict) -> str:
        raise NotImplementedError

    def session_headers(self, session: dict) -> dict:
        return self.headers

    async def records(self, http, session: dict) -> list[tuple[list[int], list[int]]] | None:  # noqa: ANN001
        return None

    def cpu(self) -> float:
        return sum(s.cpu() for s in self.servers)


class Relay(Target):
    name = "relay"

    def __init__(self, engine: str, wd: Path):
        super().__init__()
        s, self.base = _servers.start_relay("relay-aiohttp", engine, PROXY_CPU, wd / "relay.log")
        self.servers = [s]

    def url(self, session: dict) -> str:
        return self.base + "/v1/chat/completions"


class Turnstile(Target):
    name = "turnstile"

    def __init__(self, engine: str, wd: Path):
        super().__init__()
        s, self.base = _servers.start_turnstile(
            engine, wd / "ts-data", PROXY_CPU, wd / "turnstile.log"
        )
        self.servers = [s]
        self.headers = {"authorization": f"Bearer {_servers.TOKEN}"}

    def url(self, session: dict) -> str:
        return self.base + "/v1/chat/completions"

    def session_headers(self, session: dict) -> dict:
        return {**self.headers, "x-session-id": session["sid"]}

    async def records(self, http, session: dict):  # noqa: ANN001
        r = await http.get(
            f"{self.base}/v1/sessions/{session['sid']}/calls",
            headers={**self.headers, "content-type": "application/json"},
        )
        r.raise_for_status()
        full: dict[str, list[int]] = {}
        out = []
        for call in sorted(r.json()["data"], key=lambda x: x["seq"]):
            head: list[int] = []
            if call["parent_id"]:
                head = full[call["parent_id"]][: call["reused_prefix_len"]]
            prompt = head + call["prompt_delta_ids"]
            full[call["id"]] = prompt + call["completion_ids"]
            out.append((prompt, call["completion_ids"]))
        return out


class AgentLightning(Target):
    name = "agentlightning"

    def __init__(self, engine: str, wd: Path):
        super().__init__()
        port, admin = _machine.free_port(), _machine.free_port()
        env = {
            # agentlightning's LLMProxy starts LiteLLM's proxy without a master key, which
            # LiteLLM 1.108 refuses unless told that this is local development.
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
        }
        s = _machine.Server(
            [
                str(venv_python(self.name)),
                str(HERE / "_peer_agentlightning.py"),
                "--port",
                str(port),
                "--admin-port",
                str(admin),
                "--upstream",
                engine,
                "--model",
                _workload.MODEL_NAME,
            ],
            f"http://127.0.0.1:{admin}/health",
            PROXY_CPU,
            wd / "agentlightning.log",
            env=env,
            timeout=240,
        )
        self.servers = [s]
        self.base, self.admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        self.pool: list[dict] = []

    async def prepare(self, http, n: int) -> None:  # noqa: ANN001
        """Rollouts made before a cell (the store is the trainer's; not charged to calls)."""
        while len(self.pool) < n:
            r = await http.post(self.admin + "/bench/rollout")
            r.raise_for_status()
            self.pool.append(r.json())

    async def new_session(self, http) -> dict:  # noqa: ANN001
        if not self.pool:
            await self.prepare(http, 1)
        return self.pool.pop()

    def url(self, session: dict) -> str:
        return (
            f"{self.base}/rollout/{session['rollout_id']}/attempt/{session['attempt_id']}"
            "/v1/chat/completions"
        )

    async def records(self, http, session: dict):  # noqa: ANN001
        for _ in range(50):  # spans are exported in the background
            r = await http.get(
                self.admin + "/bench/records", params={"rollout_id": session["rollout_id"]}
            )
            r.raise_for_status()
            recs = r.json()
            if len(recs) >= session.get("calls", 0):
                break
            await asyncio.sleep(0.2)
        return [(x["prompt_ids"], x["response_ids"]) for x in recs]


class AgentLightning1(Target):
    """agentlightning 1.0.2: a rewrite without LiteLLM. Its server (``python -m
    agentlightning.server``, as shipped: FastAPI on uvicorn, Hydra config) proxies
    ``/proxy/rollout/{r}/attempt/{a}/mode/train/openai/v1/chat/completions`` to a registered
    model server with ``return_token_ids`` and ``logprobs`` added, and records each call's
    request and response bodies as a ``model_request`` event of the rollout."""

    name = "agentlightning-1"

    def __init__(self, engine: str, wd: Path):
        super().__init__()
        port = _machine.free_port()
        s = _machine.Server(
            [
                str(venv_python(self.name)),
                "-m",
                "agentlightning.server",
                "host=127.0.0.1",
                f"port={port}",
                f"default_proxy.model_name={_workload.MODEL_NAME}",
                f"hydra.run.dir={wd / 'agl1-hydra'}",
            ],
            f"http://127.0.0.1:{port}/healthz",
            PROXY_CPU,
            wd / "agentlightning-1.log",
            timeout=240,
        )
        self.servers = [s]
        self.base = f"http://127.0.0.1:{port}"
        import urllib.request

        req = urllib.request.Request(
            self.base + "/api/models",
            json.dumps([{"model": _workload.MODEL_NAME, "endpoint": engine + "/v1"}]).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        self.pool: list[dict] = []

    async def prepare(self, http, n: int) -> None:  # noqa: ANN001
        """Rollouts made before a cell (the trainer's work; not charged to calls)."""
        while len(self.pool) < n:
            k = min(256, n - len(self.pool))
            r = await http.post(self.base + "/api/rollouts", json=[{"input": {}}] * k)
            r.raise_for_status()
            # A rollout's events are read for its default attempt, "0" (agentlightning.schemas).
            self.pool += [{"rollout_id": x["rollout_id"], "attempt_id": "0"} for x in r.json()]

    async def new_session(self, http) -> dict:  # noqa: ANN001
        if not self.pool:
            await self.prepare(http, 1)
        return self.pool.pop()

    def url(self, session: dict) -> str:
        return (
            f"{self.base}/proxy/rollout/{session['rollout_id']}/attempt/"
            f"{session['attempt_id']}/mode/train/openai/v1/chat/completions"
        )

    async def records(self, http, session: dict):  # noqa: ANN001
        # The training view of the events (format=triplet: what its trainer reads).
        r = await http.get(
            f"{self.base}/api/rollouts/{session['rollout_id']}/events",
            params={"event_type": "model_request", "format": "triplet"},
        )
        r.raise_for_status()
        return [(e["data"]["prompt_token_ids"], e["data"]["response_token_ids"]) for e in r.json()]


class VenvPeer(Target):
    """nemo-gym and tokin: a launcher of ours in the peer's venv serving chat completions,
    with ``/bench/records?session=S`` for what the peer recorded."""

    script = ""

    def __init__(self, engine: str, wd: Path):
        super().__init__()
        port = _machine.free_port()
        s = _machine.Server(
            [
                str(venv_python(self.name)),
                str(HERE / self.script),
                "--port",
                str(port),
                "--upstream",
                engine,
                "--model",
                _workload.MODEL_NAME,
                "--tokenizer",
                str(export_tokenizer(wd)),
            ],
            f"http://127.0.0.1:{port}/health",
            PROXY_CPU,
            wd / f"{self.name}.log",
            timeout=240,
        )
        self.servers = [s]
        self.base = f"http://127.0.0.1:{port}"

    def url(self, session: dict) -> str:
        return self.base + "/v1/chat/completions"

    def session_headers(self, session: dict) -> dict:
        return {"x-session-id": session["sid"]}

    async def records(self, http, session: dict):  # noqa: ANN001
        r = await http.get(self.base + "/bench/records", params={"session": session["sid"]})
        r.raise_for_status()
        return [(x["prompt_ids"], x["completion_ids"]) for x in r.json()]


class NemoGym(VenvPeer):
    name = "nemo-gym"
    script = "_peer_nemo_gym.py"

    async def records(self, http, session: dict):  # noqa: ANN001
        return session.get("records", [])


class Tokin(VenvPeer):
    name = "tokin"
    script = "_peer_tokin.py"


CLASSES = {
    "relay": Relay,
    "turnstile": Turnstile,
    "agentlightning": AgentLightning,
    "agentlightning-1": AgentLightning1,
    "nemo-gym": NemoGym,
    "tokin": Tokin,
}


def export_tokenizer(wd: Path) -> Path:
    """The Qwen2 tokenizer + Qwen2.5 template as a Hugging Face tokenizer directory (what the
    peers that tokenize themselves load): the same vocabulary the engine and Turnstile use."""
    out = wd / "hf-tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(_workload.tiny_qwen2()))
    out.mkdir(parents=True, exist_ok=True)
    tok.tokenizer.save(str(out / "tokenizer.json"))
    specials = {t: i for t, i in tok.special_tokens.items()} if tok.special_tokens else {}
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "chat_template": tok.chat_template,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "add_bos_token": False,
                "model_max_length": 32768,
                "clean_up_tokenization_spaces": False,
                "split_special_tokens": False,
                "extra": {k: str(v) for k, v in specials.items()},
            }
        )
    )
    return out


def unavailable(name: str) -> str | None:
    if name in VENVS and not venv_python(name).exists():
        return f"no venv at {venv_python(name).parent.parent} (run benchmarks/setup_peer_venvs.sh)"
    return None


# ---------------------------------------------------------------------------------------------
# the harness

FOLLOW_UP = (
    "The test still fails after that step; here is the new output:\n"
    "E       ValueError: unterminated string at line 1, column {n}\n"
    "Look at the traceback again and continue."
)


class Agent:
    """Sessions of TURNS turns: each call resends the history; the reply and a new user
    message are appended."""

    def __init__(self, target: Target, base: list[dict]):
        self.target, self.base = target, base
        self.session: dict | None = None

    async def start(self, http) -> None:  # noqa: ANN001
        self.session = await self.target.new_session(http)
        self.session["calls"] = 0
        self.msgs = list(self.base)

    async def call(self, http, stream: bool, lat: list[float]) -> bool:  # noqa: ANN001
        if self.session is None:
            await self.start(http)
        s = self.session
        assert s is not None
        body = {
            "model": _workload.MODEL_NAME,
            "messages": self.msgs,
            "max_tokens": 64,
            "temperature": 1.0,
        }
        if stream:
            body["stream"] = True
        t0 = time.perf_counter()
        try:
            msg = await self._post(http, self.target.url(s), body, self.target.session_headers(s))
        except Exception as exc:  # noqa: BLE001 - counted and reported
            print(f"    {self.target.name} error: {type(exc).__name__}: {exc}"[:300], flush=True)
            self.session = None
            return False
        lat.append(time.perf_counter() - t0)
        s["calls"] += 1
        if "generation_token_ids" in msg:  # nemo-gym: the record comes back in the response
            s.setdefault("records", []).append(
                (msg["prompt_token_ids"], [int(t) for t in msg["generation_token_ids"]])
            )
        self.msgs = [
            *self.msgs,
            {"role": "assistant", "content": msg["content"]},
            {"role": "user", "content": FOLLOW_UP.format(n=8 + s["calls"])},
        ]
        if s["calls"] == TURNS:
            self.session = None
        return True

    @staticmethod
    async def _post(http, url: str, body: dict, headers: dict) -> dict:  # noqa: ANN001
        if not body.get("stream"):
            r = await http.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
            return r.json()["choices"][0]["message"]
        text = ""
        async with http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                for ch in ev.get("choices") or []:
                    text += (ch.get("delta") or {}).get("content") or ""
        return {"role": "assistant", "content": text}


def make_http(conc: int):
    import httpx

    n = max(conc, 16) + 16
    return httpx.AsyncClient(
        timeout=300, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)
    )


async def run_cell(target: Target, stream: bool, conc: int, per_agent: int, base) -> dict:  # noqa: ANN001
    async with make_http(conc) as http:
        agents = [Agent(target, base) for _ in range(conc)]
        # Warm-up: every agent's connection and first session; agents staggered over turns.
        if isinstance(target, (AgentLightning, AgentLightning1)):
            await target.prepare(http, conc * (per_agent // TURNS + 3) + 4)

        async def stagger(i: int, a: Agent) -> None:
            for _ in range(i % TURNS):
                await a.call(http, stream, [])

        await asyncio.gather(*(stagger(i, a) for i, a in enumerate(agents)))
        lat: list[float] = []
        errors = 0

        async def worker(a: Agent) -> None:
            nonlocal errors
            for _ in range(per_agent):
                ok = await a.call(http, stream, lat)
                errors += not ok

        cpu0 = target.cpu()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(a) for a in agents))
        wall = time.perf_counter() - t0
        cpu = target.cpu() - cpu0
    n = max(1, len(lat))
    return {
        "target": target.name,
        "mode": "stream" if stream else "plain",
        "conc": conc,
        "calls": len(lat),
        "errors": errors,
        "cpu_ms": cpu / n * 1000,
        "p50": _report.pct(lat, 50) * 1000,
        "rps": len(lat) / wall,
    }


async def exactness(target: Target, engine: str, sessions: int, stream: bool, base) -> dict:  # noqa: ANN001
    """Sessions one call at a time; each call's record vs the engine's log of that call."""
    import httpx

    async with make_http(1) as http:
        await http.post(engine + "/bench/log")  # clear
        done = []
        for _ in range(sessions):
            a = Agent(target, base)
            await a.start(http)
            s = a.session
            for _ in range(TURNS):
                if not await a.call(http, stream, []):
                    break
            done.append(s)
        truth = (await http.get(engine + "/bench/log")).json()
        calls = sum(s["calls"] for s in done)
        recs: list = []
        why = "captures nothing (the floor)" if isinstance(target, Relay) else ""
        for s in done:
            try:
                r = await target.records(http, s)
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                r, why = None, f"{type(exc).__name__}: {exc}"
            if r is None:
                recs = None  # type: ignore[assignment]
                break
            recs.extend(r)
    prompts_ok = completions_ok = 0
    if recs is not None:
        for rec, t in zip(recs, truth, strict=False):
            prompts_ok += list(map(int, rec[0])) == t["prompt"]
            completions_ok += list(map(int, rec[1])) == t["completion"]
    # The session as one sequence: turn k+1's prompt extends turn k's prompt + sampled IDs.
    cont = ok = 0
    i = 0
    for s in done:
        seq = truth[i : i + s["calls"]]
        i += s["calls"]
        for prev, nxt in zip(seq, seq[1:], strict=False):
            cont += 1
            head = prev["prompt"] + prev["completion"]
            ok += nxt["prompt"][: len(head)] == head
    return {
        "target": target.name,
        "mode": "stream" if stream else "plain",
        "calls": calls,
        "engine_calls": len(truth),
        "records": None if recs is None else len(recs),
        "prompts_ok": prompts_ok,
        "completions_ok": completions_ok,
        "continuations": cont,
        "continuations_ok": ok,
        "why": why,
    }


def plan(quick: bool, conc: int) -> int:
    if quick:
        return 2
    return {1: 40, 32: 8}.get(conc, 2)


async def measure(targets, engine, concs, modes, quick, base, sessions):  # noqa: ANN001
    rows, exact = [], []
    for t in targets:
        for stream in [m == "stream" for m in modes]:
            if stream and t.name in NO_STREAM:
                continue
            exact.append(await exactness(t, engine, sessions, stream, base))
            e = exact[-1]
            print(
                f"  exactness {t.name:<14} {e['mode']:<6} prompts {e['prompts_ok']}/{e['calls']} "
                f"completions {e['completions_ok']}/{e['calls']} continuations "
                f"{e['continuations_ok']}/{e['continuations']} {e['why']}",
                flush=True,
            )
    for stream in [m == "stream" for m in modes]:
        for conc in concs:
            for t in targets:
                if stream and t.name in NO_STREAM:
                    continue
                rows.append(await run_cell(t, stream, conc, plan(quick, conc), base))
                r = rows[-1]
                print(
                    f"  {r['mode']:<6} conc {conc:>3} {t.name:<14} {r['cpu_ms']:.2f} ms CPU/call "
                    f"{r['rps']:.1f} calls/s p50 {r['p50']:.0f} ms"
                    + (f"  {r['errors']} errors" if r["errors"] else ""),
                    flush=True,
                )
    return rows, exact


def report(rows: list[dict], exact: list[dict], concs: list[int], skipped: dict) -> str:
    out = []
    for mode, title in (("plain", "non-streaming"), ("stream", "streaming")):
        mrows = [r for r in rows if r["mode"] == mode]
        if not mrows:
            continue
        names = list(dict.fromkeys(r["target"] for r in mrows))
        table = []
        for name in names:
            line: list = [name]
            for conc in concs:
                r = next((x for x in mrows if x["target"] == name and x["conc"] == conc), None)
                ts = next(
                    (x for x in mrows if x["target"] == "turnstile" and x["conc"] == conc), None
                )
                if r is None:
                    line += ["-", "-", "-"]
                    continue
                line += [
                    r["cpu_ms"],
                    r["cpu_ms"] / ts["cpu_ms"] if ts else float("nan"),
                    r["rps"],
                ]
            errs = sum(x["errors"] for x in mrows if x["target"] == name)
            calls = sum(x["calls"] + x["errors"] for x in mrows if x["target"] == name)
            table.append([*line, f"{errs}/{calls}"])
        heads = ["peer"]
        for conc in concs:
            heads += [f"CPU ms/call @{conc}", f"x Turnstile @{conc}", f"calls/s @{conc}"]
        heads.append("errors")
        out.append(_report.table(heads, table, f"\n### {title}\n"))
    table = []
    for e in exact:
        rec = "-" if e["records"] is None else e["records"]
        table.append(
            [
                e["target"],
                e["mode"],
                e["calls"],
                rec,
                f"{e['prompts_ok']}/{e['calls']}",
                f"{e['completions_ok']}/{e['calls']}",
                f"{e['continuations_ok']}/{e['continuations']}",
                e["why"] or "",
            ]
        )
    out.append(
        _report.table(
            [
                "peer",
                "mode",
                "calls",
                "records",
                "record prompt = engine's",
                "record completion = sampled",
                "next prompt extends prompt + sampled",
                "note",
            ],
            table,
            "\n### exactness (drifting reply, sessions of 4 turns, one call at a time)\n",
        )
    )
    for k, v in skipped.items():
        out.append(f"\nnot run: {k}: {v}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few calls per cell (< 60 s)")
    p.add_argument("--conc", default=None, help="concurrencies (default 1,32,256; quick: 2)")
    p.add_argument("--modes", default="plain,stream")
    p.add_argument("--targets", default=",".join(ALL))
    p.add_argument("--sessions", type=int, default=None, help="exactness sessions (3; quick 1)")
    p.add_argument(
        "--engine-keep-alive",
        type=float,
        default=5.0,
        help="the engine's idle keep-alive timeout, s (vLLM's default: 5)",
    )
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    concs = [int(x) for x in (args.conc or ("2" if args.quick else "1,32,256")).split(",")]
    modes = args.modes.split(",")
    sessions = args.sessions or (1 if args.quick else 3)
    names = [n for n in args.targets.split(",") if n]
    skipped = {n: why for n in names if (why := unavailable(n))}
    names = [n for n in names if n not in skipped]
    _machine.pin(LOADGEN_CPU)
    print("# Peers that capture tokens: Turnstile vs agentlightning (0.3, 1.0), nemo-gym, tokin")
    print(f"machine: {_machine.machine()}")
    print(
        f"pinning: load generator (httpx) and fake engine on core {LOADGEN_CPU}, each target "
        f"on core {PROXY_CPU}; sessions of {TURNS} turns, 64-token drifting replies; "
        f"concurrency {concs}; modes {modes}; engine keep-alive {args.engine_keep_alive:g} s"
    )
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    base = _workload.base_messages()
    t_start = time.time()
    with _machine.workdir("peers") as wd:
        port = _machine.free_port()
        engine_srv = _machine.Server(
            [
                sys.executable,
                str(HERE / "_peer_engine.py"),
                "--port",
                str(port),
                "--keep-alive",
                str(args.engine_keep_alive),
            ],
            f"http://127.0.0.1:{port}/health",
            LOADGEN_CPU,
            wd / "engine.log",
        )
        engine = f"http://127.0.0.1:{port}"
        targets: list[Target] = []
        try:
            export_tokenizer(wd)
            # Started side by side (agentlightning 0.3.0 alone takes ~20 s to start).
            with ThreadPoolExecutor(len(names) or 1) as pool:
                futures = {n: pool.submit(CLASSES[n], engine, wd) for n in names}
            for n, fut in futures.items():
                try:
                    targets.append(fut.result())
                except Exception as exc:  # noqa: BLE001 - reported
                    log = wd / f"{n}.log"
                    tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
                    skipped[n] = f"did not start: {type(exc).__name__}: {exc}; log tail: {tail!r}"
                    print(f"skipped {n}: {skipped[n]}", flush=True)
            for t in targets:
                vers = version_of(t.name)
                print(f"  {t.name}: {vers}", flush=True)
            rows, exact = asyncio.run(
                measure(targets, engine, concs, modes, args.quick, base, sessions)
            )
        finally:
            for t in reversed(targets):
                for s in t.servers:
                    s.stop()
            engine_srv.stop()
    print(f"\nrun took {time.time() - t_start:.0f} s; CPU = the target's processes (all threads)")
    print(report(rows, exact, concs, skipped))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "exactness": exact}, indent=1))


def version_of(name: str) -> str:
    import subprocess

    if name in ("relay", "turnstile"):
        return f"this checkout, Python {sys.version.split()[0]}"
    pkg = {"nemo-gym": "nemo-gym", "tokin": "tokin"}.get(name, "agentlightning")
    code = (
        "import sys, importlib.metadata as m; "
        f"print(m.version('{pkg}'), 'on Python', sys.version.split()[0])"
    )
    r = subprocess.run([str(venv_python(name)), "-c", code], capture_output=True, text=True)
    return f"{pkg} {r.stdout.strip() or r.stderr.strip()[-200:]}"


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
