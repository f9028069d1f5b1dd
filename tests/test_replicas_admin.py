"""Several llama-server replicas, one killed mid-run; and pause/drain/abort/resume for weight
updates. Real processes, real HTTP, the official client."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest

import turnstile_testbed as testbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


class Replica:
    """llama-server as a process the test can kill."""

    def __init__(self, model: Path, log: Path, ctx: int = 8192):
        self.port = testbed.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(testbed.llama_server_binary()),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-c",
                str(ctx),
                "-np",
                "2",
                "-t",
                "1",
                "--no-webui",
            ],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        testbed.wait_healthy(self.url + "/health", self.proc)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def replicas(tiny_qwen2, tmp_path):
    started = [Replica(tiny_qwen2, tmp_path / f"r{i}.log") for i in range(3)]
    yield started
    for r in started:
        r.kill()


def _ask(client: openai.OpenAI, msgs: list[dict], **kw) -> openai.types.chat.ChatCompletion:
    r = client.chat.completions.create(model="t", messages=msgs, **kw)
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "go on"},
    ]
    return r


def _calls(ts, sid: str) -> list[dict]:
    return ts.get(f"/v1/sessions/{sid}/calls")["data"]


def _until(cond, what: str, timeout: float = 60.0) -> None:
    """Poll ``cond`` until it holds (a condition, not a sleep long enough on this machine)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _generating(engine_url: str) -> bool:
    """llama-server is generating for some request (a slot is busy)."""
    return any(s.get("is_processing") for s in httpx.get(engine_url + "/slots", timeout=5).json())


def _in_flight(ts) -> int:
    return ts.get("/admin/status")["in_flight"]


def test_replica_killed_mid_run(replicas, tiny_qwen2, turnstile_factory, no_end_bias):
    ts = turnstile_factory([r.url for r in replicas], tiny_qwen2)
    sessions = []
    # Sessions land by rendezvous hash of a random id, so which replica holds which is not
    # fixed: open sessions until two replicas hold some (9 nearly always suffice).
    for i in range(40):
        if i >= 9 and len({c["engine_url"] for x in sessions for c in _calls(ts, x[0]["id"])}) > 1:
            break
        s = ts.session(n=i)
        client = openai.OpenAI(base_url=s["base_url"], api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": f"session {i}"}]
        _ask(client, msgs, max_tokens=4, seed=i)
        _ask(client, msgs, max_tokens=4, seed=i)
        sessions.append((s, client, msgs))
    used = {}
    for s, _, _ in sessions:
        urls = {c["engine_url"] for c in _calls(ts, s["id"])}
        assert len(urls) == 1  # sticky
        used[s["id"]] = urls.pop()
    victim = next(r for r in replicas if r.url == used[sessions[0][0]["id"]])
    on_victim = [x for x in sessions if used[x[0]["id"]] == victim.url]
    others = [x for x in sessions if used[x[0]["id"]] != victim.url]
    assert on_victim and others

    # A long call in flight on the victim when it dies: a clean 502/503, recorded as an error.
    s, client, msgs = on_victim[0]
    outcome: dict = {}

    def long_call() -> None:
        try:  # no end token can be sampled: it runs until the replica dies
            client.chat.completions.create(
                model="t", messages=msgs, max_tokens=6000, seed=1, logit_bias=no_end_bias
            )
            outcome["status"] = 200
        except openai.APIStatusError as e:
            outcome["status"] = e.status_code

    t = threading.Thread(target=long_call)
    t.start()
    _until(lambda: _in_flight(ts) >= 1 and _generating(victim.url), "the long call to run")
    victim.kill()
    t.join(60)
    assert outcome["status"] in (502, 503)
    calls = _calls(ts, s["id"])
    assert calls[-1]["status"] == "error" and calls[-1]["parent_id"] == calls[1]["id"]

    # Sessions elsewhere are unaffected and stay on their replica.
    for s2, c2, m2 in others:
        _ask(c2, m2, max_tokens=4, seed=7)
        last = _calls(ts, s2["id"])[-1]
        assert last["status"] == "ok" and last["engine_url"] == used[s2["id"]]
    # The victim's sessions move on: the next call extends their last good call elsewhere.
    for s3, c3, m3 in on_victim:
        _ask(c3, m3, max_tokens=4, seed=8)
        ok = [c for c in _calls(ts, s3["id"]) if c["status"] == "ok"]
        assert ok[-1]["engine_url"] != victim.url
        assert ok[-1]["parent_id"] == ok[-2]["id"] and ok[-1]["segment_reason"] is None
        traj = ts.get(f"/v1/sessions/{s3['id']}/trajectories")["data"]
        assert [t["call_ids"] for t in traj] == [[c["id"] for c in ok]]
    # New sessions avoid the dead replica.
    for _ in range(6):
        s4 = ts.session()
        c4 = openai.OpenAI(base_url=s4["base_url"], api_key="x", max_retries=0)
        _ask(c4, [{"role": "user", "content": "new"}], max_tokens=2)
        assert _calls(ts, s4["id"])[0]["engine_url"] != victim.url
    status = ts.get("/admin/status")
    assert [r["healthy"] for r in status["replicas"]] == [r is not victim for r in replicas]


def test_pause_drain_resume_and_abort(tiny_qwen2, turnstile_factory, tmp_path, no_end_bias):
    """What happens to a call is forced, never left to what the model samples or to how long
    a sleep lasts: running calls sample no end token (logit bias), so they run to max_tokens
    or until aborted; "running" and "waiting" are read from /admin/status and the engine's
    slots, and the records' start/end times show which side of pause/resume a call was on."""
    engine = Replica(tiny_qwen2, tmp_path / "engine.log", ctx=16384)
    try:
        ts = turnstile_factory(engine.url, tiny_qwen2)
        s = ts.session()
        sent: dict = {}  # when each call's request left the harness
        http = httpx.Client(
            event_hooks={
                "request": [
                    lambda req: sent.setdefault(
                        orjson.loads(req.content)["messages"][0]["content"], time.time()
                    )
                ]
            }
        )
        client = openai.OpenAI(base_url=s["base_url"], api_key="x", max_retries=0, http_client=http)
        results: dict = {}

        def call(key: str, max_tokens: int) -> None:
            try:
                r = client.chat.completions.create(
                    model="t",
                    messages=[{"role": "user", "content": key}],
                    max_tokens=max_tokens,
                    seed=2,
                    logit_bias=no_end_bias,
                )
                results[key] = r.choices[0].finish_reason
            except openai.APIStatusError as e:
                results[key] = e.body.get("code") if isinstance(e.body, dict) else e.status_code

        # drain: the running call finishes (to its max_tokens) before pause returns
        t = threading.Thread(target=call, args=("drained", 1000))
        t.start()
        _until(lambda: _in_flight(ts) >= 1 and _generating(engine.url), "the call to run")
        paused_at = time.time()
        r = ts.http.post(ts.url + "/admin/pause", json={"mode": "drain"}, timeout=300).json()
        assert r["paused"] and r["in_flight"] == 0
        t.join(30)
        assert results["drained"] == "length"
        (drained,) = _calls(ts, s["id"])
        assert drained["status"] == "ok" and len(drained["completion_ids"]) == 1000
        # it was still generating when the pause came, and the pause waited for it
        assert drained["timings"]["started"] + drained["timings"]["latency_s"] > paused_at

        # while paused, a new call waits at the door: sent, unanswered, and not running
        # (in_flight counts calls past the door; the engine is idle)
        t2 = threading.Thread(target=call, args=("waited", 2))
        t2.start()
        _until(lambda: "waited" in sent, "the call to be sent")
        held_until = time.monotonic() + 1.0
        while time.monotonic() < held_until:
            assert "waited" not in results
            assert _in_flight(ts) == 0 and not _generating(engine.url)
            time.sleep(0.1)
        resumed_at = time.time()
        r = ts.http.post(ts.url + "/admin/resume", json={"weight_version": "7"}).json()
        assert r == {"paused": False, "weight_version": "7", "engines": r["engines"]}
        t2.join(30)
        assert results["waited"] == "length"
        waited = _calls(ts, s["id"])[-1]
        assert waited["status"] == "ok" and waited["timings"]["started"] >= resumed_at
        assert waited["weight_version"] == "7" and waited["policy_version"] == "7"

        # abort: the running call is cut, answered 503 policy_update, recorded as aborted
        t3 = threading.Thread(target=call, args=("aborted", 12000))
        t3.start()
        _until(lambda: _in_flight(ts) >= 1 and _generating(engine.url), "the call to run")
        r = ts.http.post(ts.url + "/admin/pause", json={"mode": "abort"}, timeout=60).json()
        t3.join(30)
        assert r["in_flight"] == 0 and results["aborted"] == "policy_update"
        assert _calls(ts, s["id"])[-1]["status"] == "aborted"
        ts.http.post(ts.url + "/admin/resume", json={})
        call("after", 2)
        assert results["after"] == "length"
        bad = ts.http.post(ts.url + "/admin/pause", json={"mode": "later"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
    finally:
        engine.kill()
