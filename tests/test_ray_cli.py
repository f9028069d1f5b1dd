"""``turnstile serve --ray`` as an operator runs it: it starts a Ray instance on this machine,
serves 2 gateway replicas behind Serve's HTTP proxy, answers a harness (the openai client)
and the trainer, labels /metrics with Serve's replica ids, and stops on SIGTERM taking its
Ray processes with it."""

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
from prometheus_client.parser import text_string_to_metric_families

from turnstile import testbed

pytest.importorskip("ray")
pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

TOKEN = "tst-ray-cli-" + "y" * 20
AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_serve_ray_runs_and_stops(tmp_path: Path, tiny_qwen2: Path, relay, no_end_bias):
    port = testbed.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnstile.cli",
                "serve",
                "--ray",
                "--ray-replicas",
                "2",
                "--ray-replica-cpus",
                "0.5",
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
        s = httpx.post(url + "/v1/sessions", json={"metadata": {}}, headers=AUTH).json()
        assert s["base_url"] == f"{url}/s/" + s["base_url"].split("/s/")[1]
        oa = openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0)
        r = oa.chat.completions.create(
            model="m",
            max_tokens=3,
            logit_bias=no_end_bias,
            messages=[{"role": "user", "content": "hi"}],
        )
        (call,) = httpx.get(f"{url}/v1/sessions/{s['id']}/calls", headers=AUTH).json()["data"]
        assert call["completion_ids"] == relay.completions()[-1].response["tokens"]
        assert r.usage.completion_tokens == 3
        # both replicas answer /metrics (Serve spreads requests without a session), each
        # with its own Serve replica id; the one that recorded the call counted it
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while len(seen) < 2:
            assert time.monotonic() < deadline, seen
            text = httpx.get(url + "/metrics", headers=AUTH).text
            for fam in text_string_to_metric_families(text):
                for sample in fam.samples:
                    if sample.name == "turnstile_sampled_tokens_total":
                        seen[sample.labels["replica"]] = sample.value
        assert call["replica"] in seen and seen[call["replica"]] == 3
        assert sum(seen.values()) == 3 and ":" not in call["replica"]  # not host:pid
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
