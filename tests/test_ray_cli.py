"""``turnstile serve --ray --ray-direct`` as an operator runs it: it starts a Ray instance on
this machine, serves 2 gateway replicas behind Serve's HTTP proxy (each also on its own
port), answers a harness (the openai client, on the session's base URL: its replica's port,
and on its fallback base URL: Serve's proxy) and the trainer, labels /metrics with Serve's
replica ids, and stops on SIGTERM taking its Ray processes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import ray  # noqa: F401  pinned (requirements.lock): a broken install fails, not skips
from prometheus_client.parser import text_string_to_metric_families

import turnstile_testbed as testbed

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

TOKEN = "tst-ray-cli-" + "y" * 20
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _sampled_by_replica(url: str, timeout: float = 60) -> dict[str, float]:
    """``turnstile_sampled_tokens_total`` of each of the 2 replicas, scraped through Serve's
    proxy (which spreads requests without a session) until both have answered."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < 2:
        assert time.monotonic() < deadline, seen
        text = httpx.get(url + "/metrics", headers=AUTH).text
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == "turnstile_sampled_tokens_total":
                    seen[sample.labels["replica"]] = sample.value
    return seen


def test_serve_ray_runs_and_stops(tmp_path: Path, tiny_qwen2: Path, relay, no_end_bias):
    port = testbed.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnstile.app.cli",
                "serve",
                "--ray",
                "--ray-replicas",
                "2",
                "--ray-replica-cpus",
                "0.5",
                "--ray-direct",
                "--engine-url",
                relay.url,
                "--model",
                str(tiny_qwen2),
                "--data",
                str(tmp_path / "data"),
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={
                **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                "TURNSTILE_TOKEN": TOKEN,
            },
        )
    ray_procs: list[psutil.Process] = []
    try:
        testbed.wait_healthy(url + "/v1/models", proc, timeout=180, headers=AUTH)
        # Serve's proxy answers once one replica runs; a session minted while the other is
        # still starting is owned by the ring of one replica, and moves (as consistent hashing
        # moves it) when the second joins. Affinity is claimed for a settled replica set.
        assert all(v == 0 for v in _sampled_by_replica(url).values())  # both replicas run
        s = httpx.post(url + "/v1/sessions", json={"metadata": {}}, headers=AUTH).json()
        # the base URL names a replica's own port (on loopback, as --host); the fallback is
        # Serve's proxy, the address the operator gave
        assert s["fallback_base_url"] == f"{url}/s/" + s["base_url"].split("/s/")[1]
        direct = s["base_url"].split("/s/")[0]
        assert direct.startswith("http://127.0.0.1:") and direct != url
        # the direct port asks for the same credentials as Serve's proxy
        assert httpx.get(direct + "/v1/sessions").status_code == 401
        assert httpx.get(direct + "/metrics", headers=AUTH).status_code == 200
        msgs = [{"role": "user", "content": "hi"}]
        for base in (s["base_url"], s["fallback_base_url"]):
            oa = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
            r = oa.chat.completions.create(
                model="m", max_tokens=3, logit_bias=no_end_bias, messages=msgs
            )
            assert r.usage.completion_tokens == 3
            msgs = [*msgs, r.choices[0].message.model_dump(include={"role", "content"})]
            msgs.append({"role": "user", "content": "more"})
        first, call = httpx.get(f"{url}/v1/sessions/{s['id']}/calls", headers=AUTH).json()["data"]
        sent = relay.completions()
        assert [first["completion_ids"], call["completion_ids"]] == [
            e.response["tokens"] for e in sent[-2:]
        ]
        # one replica recorded both: the one Serve's ring gives the session, which its base
        # URL names
        assert first["replica"] == call["replica"] and call["parent_id"] == first["id"]
        # both replicas answer /metrics (Serve spreads requests without a session), each
        # with its own Serve replica id; the one that recorded the call counted it
        seen = _sampled_by_replica(url)
        assert call["replica"] in seen and seen[call["replica"]] == 6
        assert sum(seen.values()) == 6 and ":" not in call["replica"]  # not host:pid
        ray_procs += [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "raylet" in " ".join(p.cmdline()) or "gcs_server" in p.name()
        ]
        assert ray_procs
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
    _, alive = psutil.wait_procs(ray_procs, timeout=30)
    assert not alive, alive  # its Ray instance went with it
