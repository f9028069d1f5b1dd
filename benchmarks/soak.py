"""Soak: many rollouts of many turns through a real ``turnstile serve`` on the vLLM fake
(tests/fakes), checked for exactness against what the fake engine received and sampled, and
the server's memory after the sessions close.

    python benchmarks/soak.py            # 1,000 sessions x 20 turns, then 200 more x 20
    python benchmarks/soak.py --quick    # 40 x 5, then 40 x 5

Every session runs its turns one after the other (half of them streaming), ``--concurrency``
sessions at a time, and is closed when done. Exact means: each session's records form one
chain of all its calls, and the stitched trajectory of the last call equals the prompt the
fake engine received for it plus the tokens it sampled (so every earlier turn was extended
token for token). Memory is the server's RSS after each round's sessions are closed: the
second round must not leave it higher than the first (trees are freed on close).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _report import table
from _workload import tiny_qwen2

import turnstile_testbed as testbed
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.toy_model import EOS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TOKEN = "soak-" + secrets.token_urlsafe(16)
AUTH = {"authorization": f"Bearer {TOKEN}"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def rollout(
    client: httpx.AsyncClient, url: str, sid: str, turns: int, stream: bool, errors: list
) -> None:
    msgs = [{"role": "user", "content": f"task {sid}"}]
    for t in range(turns):
        body = {
            "model": "m",
            "messages": msgs,
            "max_tokens": 8,
            "seed": t,
            "logit_bias": {str(EOS): -100},
            "stream": stream,
        }
        base = f"{url}/s/{sid}/v1/chat/completions"
        if stream:
            content, done = "", False
            async with client.stream("POST", base, json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        ch = httpx.Response(200, content=line[6:]).json()
                        if "error" in ch:
                            errors.append(ch["error"]["message"])
                            return
                        for c in ch["choices"]:
                            content += c["delta"].get("content") or ""
                            done = done or c["finish_reason"] is not None
            if not done:
                errors.append(f"{sid}: stream without a finish")
                return
        else:
            r = await client.post(base, json=body)
            if r.status_code != 200:
                errors.append(r.text[:200])
                return
            content = r.json()["choices"][0]["message"]["content"]
        msgs = msgs + [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"turn {t + 2}"},
        ]
    r = await client.post(f"{url}/v1/sessions/{sid}/close", json={})
    if r.status_code != 200:
        errors.append(r.text[:200])


def exact(client: httpx.Client, url: str, fake: VLLMFake, sid: str, turns: int) -> bool:
    calls = client.get(f"{url}/v1/sessions/{sid}/calls").json()["data"]
    if len(calls) != turns or any(c["status"] != "ok" for c in calls):
        return False
    if any(c["parent_id"] != p["id"] for p, c in zip(calls, calls[1:], strict=False)):
        return False
    trajs = client.get(f"{url}/v1/sessions/{sid}/trajectories").json()["data"]
    if len(trajs) != 1:
        return False
    last = calls[-1]["engine_request_id"]
    received = fake.received[last]
    return trajs[0]["token_ids"] == received + fake.rec.sent[last].ids


class RecordingFake(VLLMFake):
    """The vLLM fake, keeping the prompt of every generate request by its request id."""

    def __init__(self) -> None:
        super().__init__("0.33.0")
        self.received: dict[str, list[int]] = {}

    async def record(self, request):  # noqa: ANN001, ANN201
        body = await super().record(request)
        if isinstance(body, dict) and "token_ids" in body:
            rid = request.headers.get("x-request-id") or body.get("request_id")
            self.received[f"generate-tokens-{rid}"] = body["token_ids"]
        self.rec.requests.clear()  # the prompts above are all this benchmark keeps
        return body


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sessions", type=int)
    p.add_argument("--turns", type=int)
    p.add_argument("--second", type=int, help="sessions in the second round")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--synchronous", choices=["full", "normal"], default="full")
    a = p.parse_args()
    sessions = a.sessions or (40 if a.quick else 1000)
    turns = a.turns or (5 if a.quick else 20)
    second = a.second or (40 if a.quick else 200)
    model = tiny_qwen2()
    rows = []
    with RecordingFake() as fake, tempfile.TemporaryDirectory(prefix="turnstile-soak-") as wd:
        port = testbed.free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(Path(wd) / "turnstile.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnstile.app.cli",
                "serve",
                "--engine",
                "vllm",
                "--engine-url",
                fake.url,
                "--model",
                str(model),
                "--port",
                str(port),
                "--data",
                wd,
                "--synchronous",
                a.synchronous,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "TURNSTILE_TOKEN": TOKEN,
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(ROOT),
            },
        )
        try:
            testbed.wait_healthy(url + "/v1/models", proc, timeout=120, headers=AUTH)
            rss0 = rss_mb(proc.pid)
            sync = httpx.Client(headers=AUTH, timeout=60)
            for rnd, n in ((1, sessions), (2, second)):
                sids = [
                    sync.post(url + "/v1/sessions", json={"group_id": f"soak-{rnd}"}).json()["id"]
                    for _ in range(n)
                ]
                errors: list = []

                async def run(sids: list[str] = sids, errors: list = errors) -> None:
                    sem = asyncio.Semaphore(a.concurrency)
                    limits = httpx.Limits(max_connections=a.concurrency * 2)
                    async with httpx.AsyncClient(
                        headers=AUTH, timeout=120, limits=limits
                    ) as client:

                        async def one(i: int, s_id: str) -> None:
                            async with sem:
                                await rollout(client, url, s_id, turns, i % 2 == 1, errors)

                        await asyncio.gather(*(one(i, s) for i, s in enumerate(sids)))

                t0 = time.perf_counter()
                asyncio.run(run())
                wall = time.perf_counter() - t0
                ok = sum(exact(sync, url, fake, sid, turns) for sid in sids)
                rows.append(
                    [
                        rnd,
                        n,
                        turns,
                        n * turns,
                        f"{ok}/{n}",
                        len(errors),
                        n * turns / wall,
                        rss0,
                        rss_mb(proc.pid),
                    ]
                )
                if errors:
                    print("errors:", errors[:5])
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    print(
        table(
            [
                "round",
                "sessions",
                "turns",
                "calls",
                "exact sessions",
                "errors",
                "calls/s",
                "RSS at start MB",
                "RSS after close MB",
            ],
            rows,
            "Soak: turnstile serve on the vLLM fake, half the sessions streaming "
            f"({a.concurrency} at a time), every session closed when done, "
            f"--synchronous {a.synchronous}",
        )
    )
    growth = rows[1][-1] - rows[0][-1]
    print(f"RSS after close, round 2 - round 1: {growth:+.1f} MB")
    bad = [r for r in rows if r[4] != f"{r[1]}/{r[1]}" or r[5]]
    if bad:
        raise SystemExit("soak: not every session was exact or error-free")


if __name__ == "__main__":
    main()
