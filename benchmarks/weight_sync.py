"""What a weight sync every few seconds costs the rollouts, with ``POST /admin/pause`` in each
mode side by side in one run: ``drain`` (running calls finish first), ``abort`` (they get a
retryable 503 and the harness sends them again) and ``hold`` (they are preempted at a token
boundary and go on after the resume from their partial output; issue 44).

Set-up (printed with the results):

- the agent-session workload's harnesses and replies (``_agent_workload.py``, from
  ``--seed``): a call is one harness's ~25-30k-token system prompt, its tools and a task; the
  reply is one of the workload's (a thought and 1-3 Hermes tool calls), sampled token by token;
- the engine is the vLLM fake (``turnstile.testing.fake_vllm``, token-in route, streamed)
  with a latency model: a prefill of ``--prefill-ms`` per 1k prompt tokens before the first
  token (no prefix cache: after a weight update vLLM clears it), ``--decode-ms`` per token.
  Its reply model continues a reply from what the prompt already holds after the assistant
  header, as a model continues a partial answer;
- ``--sessions`` harnesses call in a loop (half streamed); a 503 is retried at once, as the
  agent harnesses do; ``turnstile serve`` runs as a process (``--hold-stream``);
- the trainer pauses every ``--every`` seconds, holds the pause ``--update-s`` (the weight
  update), resumes under a new version; each mode runs ``--seconds``.

Per mode: syncs, calls answered, 503s the harnesses saw, tokens the engine sent, tokens
re-sampled per sync (sent minus recorded in answered calls: work lost), the trainer's wait in
``/admin/pause``, and each call's time beyond its own prefill + decode + the pause it sat in
(p50 for calls a sync cut (resumed or retried) and for the others).

    ~/.cache/turnstile/venv/bin/python benchmarks/weight_sync.py            # ~2 minutes
    ~/.cache/turnstile/venv/bin/python benchmarks/weight_sync.py --quick    # ~40 s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _agent_workload import Workload  # noqa: E402

import turnstile_testbed as testbed  # noqa: E402
from turnstile.chat.tokenizer import load_tokenizer  # noqa: E402
from turnstile.testing.fake_vllm import VLLMFake  # noqa: E402
from turnstile.testing.toy_model import Generation, Step  # noqa: E402

TOKEN = "tst-sync-" + secrets.token_urlsafe(12)
TEMPLATE = testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"


class ReplyModel:
    """The reply a task names (``task N``), continued from what the prompt holds of it after
    the last assistant header (a held call's resubmission), ended by ``<|im_end|>``."""

    def __init__(self, tok, replies: list[list[int]], header: list[int], end_id: int):  # noqa: ANN001
        self.tok, self.replies, self.header, self.end_id = tok, replies, header, end_id

    def generate(self, prompt: list[int], *, max_tokens: int, **_: object) -> Generation:
        h = len(self.header)
        at = max(i for i in range(len(prompt) - h + 1) if prompt[i : i + h] == self.header)
        done = len(prompt) - at - h
        task = self.tok.decode(prompt[max(0, at - 12) : at])
        v = int(task.rsplit("task ", 1)[1].split("<")[0].strip())
        ids = [*self.replies[v % len(self.replies)], self.end_id][done:]
        steps = [Step(t, -0.5, 1, [(t, -0.5)]) for t in ids[:max_tokens]]
        if len(ids) > max_tokens:
            return Generation(steps, "length")
        return Generation(steps, "stop", stop_token=self.end_id)


class PacedFake(VLLMFake):
    """The fake with a prefill before each request's first token."""

    def __init__(self, prefill_ms: float, decode_ms: float):
        super().__init__(dev_mode=True, max_model_len=131072)
        self.prefill_s, self.token_delay = prefill_ms / 1000, decode_ms / 1000
        self.prompt_len: dict[str, int] = {}
        self.started: set[str] = set()

    def _run(self, rid: str, prompt: list[int], sp: dict) -> Generation:
        self.prompt_len[rid] = len(prompt)
        return super()._run(rid, prompt, sp)

    async def pace(self, rid: str) -> bool:
        if rid not in self.started:
            self.started.add(rid)
            await asyncio.sleep(self.prefill_s * self.prompt_len.get(rid, 0) / 1000)
        return await super().pace(rid)


def sent_tokens(fake: VLLMFake) -> int:
    """Tokens the engine's responses carried, every request."""
    n = 0
    for parts in list(fake.rec.raw.values()):
        for raw in parts:
            for line in raw.decode().splitlines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:]).get("choices") or []:
                        n += len(c.get("token_ids") or [])
    return n


def start_turnstile(
    fake_url: str, model: Path, data: Path, log: Path
) -> tuple[subprocess.Popen, str]:
    port = testbed.free_port()
    cmd = [sys.executable, "-m", "turnstile", "serve", "--engine", "vllm", "--engine-url",
           fake_url, "--model", str(model), "--chat-template", str(TEMPLATE), "--port", str(port),
           "--data", str(data), "--hold-stream", "--keepalive", "1"]  # fmt: skip
    env = {**os.environ, "TURNSTILE_TOKEN": TOKEN}
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    testbed.wait_healthy(url + "/v1/models", proc, timeout=120, headers=auth())
    return proc, url


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


async def harness(
    i: int, http: httpx.AsyncClient, url: str, wl: Workload, stop_at: float, out: list
) -> None:
    rng = random.Random(i)
    r = await http.post(url + "/v1/sessions", json={"metadata": {"h": i}}, headers=auth())
    base = r.json()["base_url"]
    h = wl.harnesses[i % len(wl.harnesses)]
    tools = h.tools  # Chat Completions shape already
    while time.monotonic() < stop_at:
        v = rng.randrange(len(wl.replies))
        stream = rng.random() < 0.5
        body = {
            "model": "m", "max_tokens": 4096, "stream": stream, "tools": tools,
            "messages": [{"role": "system", "content": h.system},
                         {"role": "user", "content": f"task {v}"}],
        }  # fmt: skip
        began, errors = time.monotonic(), 0
        while True:
            if stream:
                async with http.stream("POST", base + "/chat/completions", json=body) as resp:
                    raw = b"".join([c async for c in resp.aiter_bytes()])
                status = (
                    resp.status_code if resp.status_code != 200 or b'"error"' not in raw else 503
                )
            else:
                resp = await http.post(base + "/chat/completions", json=body)
                status, raw = resp.status_code, resp.content
            if status == 200:
                break
            if status != 503 or b"policy_update" not in raw:
                raise RuntimeError(f"call failed: {status} {raw[:300]!r}")
            errors += 1  # a 503 from an abort: sent again, as agent harnesses do
        out.append({"session": r.json()["id"], "began": began, "s": time.monotonic() - began,
                    "errors": errors, "reply": len(wl.replies[v].token_ids) + 1})  # fmt: skip


async def trainer(
    http: httpx.AsyncClient, url: str, fake: VLLMFake, mode: str, args, stop_at: float, log: list
) -> None:  # noqa: ANN001
    n = 0
    while True:
        await asyncio.sleep(args.every)
        if time.monotonic() >= stop_at:
            return
        n += 1
        t0 = time.monotonic()
        r = await http.post(url + "/admin/pause", json={"mode": mode}, headers=auth())
        waited = time.monotonic() - t0
        await asyncio.sleep(args.update_s)
        fake.weight_version = f"{mode}-{n}"
        await http.post(
            url + "/admin/resume", json={"weight_version": f"{mode}-{n}"}, headers=auth()
        )
        log.append({"paused_at": t0, "resumed_at": time.monotonic(), "wait": waited, **r.json()})


async def run_mode(mode: str, url: str, fake: VLLMFake, wl: Workload, args) -> dict:  # noqa: ANN001
    calls: list[dict] = []
    syncs: list[dict] = []
    sent0 = sent_tokens(fake)
    stop_at = time.monotonic() + args.seconds
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(
            trainer(http, url, fake, mode, args, stop_at, syncs),
            *(harness(i, http, url, wl, stop_at, calls) for i in range(args.sessions)),
        )
        recorded = 0
        for sid in {c["session"] for c in calls}:
            r = await http.get(url + f"/v1/sessions/{sid}/calls", headers=auth())
            for rec in r.json()["data"]:
                if rec["status"] == "ok":
                    recorded += len(rec["completion_ids"])
    sent = sent_tokens(fake) - sent0
    # a call's time beyond its own work: prefill + decode, and any pause it sat in
    prefill = args.prefill_ms / 1000 * 28.0  # ~28k-token prompts (the harnesses' system + tools)
    cut: list[float] = []
    plain: list[float] = []
    for c in calls:
        end = c["began"] + c["s"]
        hit = any(c["began"] < s["paused_at"] < end for s in syncs)
        # the pause it sat in: at the door (any mode), or cut and held or retried (abort,
        # hold); a call drain let run on was not delayed by the pause it overlapped
        paused = sum(
            max(0.0, min(end, s["resumed_at"]) - max(c["began"], s["paused_at"]))
            for s in syncs
            if not (mode == "drain" and c["began"] < s["paused_at"] < end)
        )
        extra = c["s"] - paused - prefill - c["reply"] * args.decode_ms / 1000
        (cut if hit else plain).append(extra)
    lost = sent - recorded
    return {
        "mode": mode,
        "syncs": len(syncs),
        "calls": len(calls),
        "errors_503": sum(c["errors"] for c in calls),
        "sent": sent,
        "lost_per_sync": lost / max(1, len(syncs)),
        "pause_wait_s": statistics.median([s["wait"] for s in syncs]) if syncs else 0.0,
        "cut_calls": len(cut),
        "cut_extra_s": statistics.median(cut) if cut else float("nan"),
        "plain_extra_s": statistics.median(plain) if plain else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=36.0)
    ap.add_argument("--every", type=float, default=4.0, help="seconds between weight syncs")
    ap.add_argument("--update-s", type=float, default=0.5, help="the weight update's length")
    ap.add_argument("--prefill-ms", type=float, default=20.0, help="per 1k prompt tokens")
    ap.add_argument("--decode-ms", type=float, default=15.0, help="per sampled token")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.seconds, args.every = 6, 10.0, 3.0
    model = testbed.tiny_model("qwen2", TEMPLATE.read_text())
    tok = load_tokenizer(str(model))
    wl = Workload(args.seed, tok)
    for r in wl.replies:
        r.token_ids = r.token_ids or tok.encode(r.text())
    fake = PacedFake(args.prefill_ms, args.decode_ms)
    [end_id] = tok.encode("<|im_end|>")
    header = tok.encode("<|im_start|>assistant\n")
    fake.model = ReplyModel(tok, [r.token_ids for r in wl.replies], header, end_id)  # type: ignore[assignment]
    rows = []
    with fake, tempfile.TemporaryDirectory() as tmp:
        proc, url = start_turnstile(fake.url, model, Path(tmp) / "data", Path(tmp) / "ts.log")
        try:
            for mode in ("drain", "abort", "hold"):
                rows.append(asyncio.run(run_mode(mode, url, fake, wl, args)))
        finally:
            proc.terminate()
            proc.wait(15)
    lens = [len(r.token_ids) for r in wl.replies]
    print(f"weight sync every {args.every:g} s (update {args.update_s:g} s), {args.sessions} "
          f"agent sessions, {args.seconds:g} s per mode; engine: prefill {args.prefill_ms:g} ms "
          f"per 1k prompt tokens, decode {args.decode_ms:g} ms per token; replies "
          f"{min(lens)}-{max(lens)} "
          "tokens, prompts ~25-30k")  # fmt: skip
    head = ("mode", "syncs", "calls", "503s", "tokens sent", "re-sampled/sync", "pause wait s",
            "cut calls", "cut: extra s p50", "others: extra s p50")  # fmt: skip
    print(" | ".join(head))
    for row in rows:
        print(" | ".join(str(x) for x in (
            row["mode"], row["syncs"], row["calls"], row["errors_503"], row["sent"],
            f"{row['lost_per_sync']:.1f}", f"{row['pause_wait_s']:.2f}", row["cut_calls"],
            f"{row['cut_extra_s']:.2f}", f"{row['plain_extra_s']:.2f}",
        )))  # fmt: skip


if __name__ == "__main__":
    main()
