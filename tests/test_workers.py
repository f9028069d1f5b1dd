"""``turnstile serve --workers 3`` as an operator runs it: three gateway processes, one store.

Against a real llama-server through the recording relay (what the engine received and
returned is the truth): sessions' base URLs name their owning worker's port; each worker's
records are exact; a session reached on the front (its fallback) continues exactly from what
another worker recorded; the trainer's pause, resume and close reach every worker; a worker
killed with SIGKILL comes back on its port and the session continues from its last
acknowledged call; SIGTERM on the front stops them all. One server for the module (the tests
leave it unpaused, each in sessions of its own); the kill and the stop come last.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from conftest import Turnstile
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

WORKERS = 3


@pytest.fixture(scope="module")
def ts(shared_relay, tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("workers")
    t = Turnstile(
        shared_relay.url, tiny_qwen2, tmp / "data", tmp / "turnstile.log", ("--workers", "3")
    )
    t.start()
    yield t
    t.stop()
    if t._http is not None:
        t._http.close()


def _workers(ts: Turnstile) -> dict[str, dict]:
    """The other workers by origin, as the front's status reports them."""
    status = ts.get("/admin/status")
    return {w["origin"]: w for w in status["workers"]}


def _owned(ts: Turnstile, n: int = 3) -> dict[str, dict]:
    """A session owned by each worker (by base URL origin: the front's is its own URL)."""
    found: dict[str, dict] = {}
    for _ in range(60):
        s = ts.session()
        found.setdefault(s["base_url"].split("/s/")[0], s)
        if len(found) == n:
            return found
    raise AssertionError(f"60 sessions went to {sorted(found)} only")


def _chat(base: str, msgs: list[dict], bias: dict, **kw: object):
    oa = openai.OpenAI(base_url=base, api_key="unused", max_retries=kw.pop("retries", 0))
    return oa.chat.completions.create(model="m", messages=msgs, max_tokens=3, logit_bias=bias, **kw)


def _in_flight(ts: Turnstile, origin: str) -> float:
    """The calls a worker's HTTP edge is answering (its ``turnstile_in_flight`` gauge):
    counted from the request's arrival, a call held at the worker's door included."""
    r = ts.http.get(origin + "/metrics", timeout=10)
    r.raise_for_status()
    return sum(
        s.value
        for f in text_string_to_metric_families(r.text)
        if f.name == "turnstile_in_flight"
        for s in f.samples
    )


def _until(what: str, probe, want, timeout: float = 30.0):  # noqa: ANN001, ANN202
    """Poll ``probe()`` until it returns ``want``; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while (got := probe()) != want:
        assert time.monotonic() < deadline, f"{what}: {got!r} after {timeout}s, want {want!r}"
        time.sleep(0.05)
    return got


def _stays(what: str, probe, want, seconds: float) -> None:  # noqa: ANN001
    """``probe()`` keeps returning ``want`` for ``seconds`` (polled, not slept through): the
    negative side of ``_until``, which the tests run on the same probe once it must change."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = probe()
        assert got == want, f"{what}: {got!r}, want {want!r}"
        time.sleep(0.05)


def _calls(ts: Turnstile, sid: str) -> list[dict]:
    return ts.get(f"/v1/sessions/{sid}/calls")["data"]


def _extends(first, second, call: dict) -> None:
    """``second`` (a relay exchange, recorded as ``call``) sent ``first``'s prompt and sampled
    tokens unchanged, and the record says so."""
    head = first.request["prompt"] + first.response["tokens"]
    assert second.request["prompt"][: len(head)] == head
    assert call["reused_prefix_len"] == len(head)
    assert call["prompt_delta_ids"] == second.request["prompt"][len(head) :]


def test_sessions_go_to_every_worker_and_each_records_exactly(ts, shared_relay, no_end_bias):
    others = _workers(ts)
    assert len(others) == WORKERS - 1
    owned = _owned(ts)
    assert set(owned) == {ts.url, *others}  # the front and each worker's own port
    recorded_by: dict[str, int] = {}
    for origin, s in owned.items():
        cap = s["base_url"].split("/s/")[1]
        # the fallback is the front, for every session
        assert s.get("fallback_base_url", s["base_url"]) == f"{ts.url}/s/{cap}"
        msgs = [{"role": "user", "content": "hi"}]
        r = _chat(s["base_url"], msgs, no_end_bias)
        (sent,) = shared_relay.completions()[-1:]
        (call,) = _calls(ts, s["id"])
        assert call["completion_ids"] == sent.response["tokens"]
        recorded_by[origin] = call["worker"]
        # the same session on the front (its fallback): rebuilt from the store, it extends
        # the owner's call exactly
        msgs += [r.choices[0].message.model_dump(include={"role", "content"})]
        msgs.append({"role": "user", "content": "more"})
        _chat(f"{ts.url}/s/{cap}", msgs, no_end_bias)
        (sent2,) = shared_relay.completions()[-1:]
        first, second = _calls(ts, s["id"])
        assert second["worker"] == 0 and second["parent_id"] == first["id"]
        assert second["completion_ids"] == sent2.response["tokens"]
        _extends(sent, sent2, second)
    # each port is one process: the front's sessions recorded by worker 0, each other port's
    # by a worker of its own
    assert recorded_by[ts.url] == 0
    assert sorted(recorded_by.values()) == list(range(WORKERS))


def test_pause_and_resume_reach_every_worker(ts, shared_relay, no_end_bias):
    owned = _owned(ts)
    sent_before = len(shared_relay.completions())
    r = ts.http.post(ts.url + "/admin/pause", json={"mode": "drain", "timeout": 10})
    assert r.status_code == 200, r.text
    try:
        assert [w["in_flight"] for w in r.json()["workers"]] == [0] * (WORKERS - 1)
        assert all(w["paused"] for w in _workers(ts).values())
        results: dict[str, object] = {}

        def call(origin: str, s: dict) -> None:
            try:
                results[origin] = _chat(s["base_url"], [{"role": "user", "content": "x"}],
                                        no_end_bias, timeout=60)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - shown below
                results[origin] = exc

        threads = [threading.Thread(target=call, args=kv) for kv in owned.items()]
        for t in threads:
            t.start()
        # each call reached its worker (its edge counts it) ...
        flights = lambda: [_in_flight(ts, o) for o in owned]  # noqa: E731
        _until("calls at each worker", flights, [1] * WORKERS)
        # ... and is held at the door: nothing reaches the engine or answers the harness
        sent = lambda: (len(shared_relay.completions()) - sent_before, len(results))  # noqa: E731
        _stays("engine calls and answers while paused", sent, (0, 0), 2.0)
    finally:
        r = ts.http.post(ts.url + "/admin/resume", json={"weight_version": "7"})
    assert r.status_code == 200 and r.json()["weight_version"] == "7"
    assert [w["weight_version"] for w in r.json()["workers"]] == ["7"] * (WORKERS - 1)
    # the positive control: the same probes see the calls go through once resumed
    _until("engine calls and answers after resume", sent, (WORKERS, WORKERS), 60)
    _until("calls at each worker after resume", flights, [0] * WORKERS)
    for t in threads:
        t.join(60)
    for origin, s in owned.items():
        assert not isinstance(results[origin], Exception), results[origin]
        (call,) = _calls(ts, s["id"])
        assert call["weight_version"] == "7", call  # recorded under the new version
    assert not any(w["paused"] for w in _workers(ts).values())


def test_a_close_on_the_front_refuses_the_owners_waiting_call(ts, no_end_bias):
    """A call waiting at a paused worker's door for a session the trainer then closes (on
    the front) is refused when the door opens: the close reached the owner."""
    s = next(s for o, s in _owned(ts).items() if o != ts.url)
    assert ts.http.post(ts.url + "/admin/pause", json={"timeout": 5}).status_code == 200
    out: list[object] = []

    def call() -> None:
        try:
            out.append(_chat(s["base_url"], [{"role": "user", "content": "x"}], no_end_bias))
        except Exception as exc:  # noqa: BLE001
            out.append(exc)

    t = threading.Thread(target=call)
    origin = s["base_url"].split("/s/")[0]
    try:
        t.start()
        _until("the call at its owner's door", lambda: _in_flight(ts, origin), 1)
        assert out == []  # held, not answered
        assert ts.http.post(f"{ts.url}/v1/sessions/{s['id']}/close", json={}).status_code == 200
    finally:
        ts.http.post(ts.url + "/admin/resume", json={})
    t.join(60)
    (err,) = out
    assert isinstance(err, openai.ConflictError) and "closed" in str(err), err
    assert _calls(ts, s["id"]) == []


def test_a_killed_worker_comes_back_on_its_port(ts, shared_relay, no_end_bias):
    s = next(s for o, s in _owned(ts).items() if o != ts.url)
    origin = s["base_url"].split("/s/")[0]
    msgs = [{"role": "user", "content": "hi"}]
    r = _chat(s["base_url"], msgs, no_end_bias)
    (sent,) = shared_relay.completions()[-1:]
    pid = _workers(ts)[origin]["pid"]
    # killed while the trainer has paused: the new process takes the front's door (paused,
    # then resumed under the version the trainer names)
    assert ts.http.post(ts.url + "/admin/pause", json={"timeout": 5}).status_code == 200
    try:
        os.kill(pid, signal.SIGKILL)
        back = _workers(ts)[origin]  # answered once the new process is up
        assert back["pid"] != pid and back["paused"], back
    finally:
        resumed = ts.http.post(ts.url + "/admin/resume", json={"weight_version": "8"}).json()
    assert resumed["workers"] and all(w["weight_version"] == "8" for w in resumed["workers"])
    # the port stays open (the front holds the socket): the next call waits in its backlog
    # for the new process, which continues the session from the store
    msgs += [r.choices[0].message.model_dump(include={"role", "content"})]
    msgs.append({"role": "user", "content": "again"})
    _chat(s["base_url"], msgs, no_end_bias, timeout=120)
    (sent2,) = shared_relay.completions()[-1:]
    first, second = _calls(ts, s["id"])
    assert second["parent_id"] == first["id"] and second["worker"] == first["worker"]
    assert second["weight_version"] == "8"
    _extends(sent, sent2, second)
    assert _workers(ts)[origin]["pid"] != pid


def test_the_peer_route_is_the_trainers_and_checks_its_input(ts):
    """``/internal/peer`` (the front's steps on each worker) takes the trainer's token only,
    and a malformed step is a 400 that names the field, never a 500."""
    s = ts.session()
    cap = s["base_url"].split("/s/")[1]
    for origin in [ts.url, *_workers(ts)]:
        url = origin + "/internal/peer"
        assert httpx.post(url, json={"op": "status"}).status_code == 401
        bearer = {"authorization": f"Bearer {cap}"}  # a harness's capability: not enough
        assert httpx.post(url, json={"op": "status"}, headers=bearer).status_code in (401, 403)
        for op, field in (
            ({"op": "pause", "timeout": "x"}, "timeout"),
            ({"op": "pause", "mode": "now"}, "mode"),
            ({"op": "resume", "weight_version": [1]}, "weight_version"),
            ({"op": "close"}, "session"),
            ({"op": "reboot", "session": "s"}, "op"),
            ([1], "op"),
        ):
            r = ts.http.post(url, json=op)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (op, r.text)
    assert not ts.get("/admin/status")["paused"]


def test_refusals_name_the_fix(tiny_qwen2: Path, tmp_path: Path):
    base = [sys.executable, "-m", "turnstile", "serve", "--engine-url", "http://127.0.0.1:9"]
    base += ["--model", str(tiny_qwen2), "--data", str(tmp_path)]
    for extra, says in (
        (["--workers", "0"], "--workers takes a count >= 1"),
        (["--workers", "2", "--ray"], "not with --ray"),
        (["--workers", "2", "--mode", "passthrough"], "passthrough"),
    ):
        p = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and says in p.stderr, (extra, p.stderr[-500:])


def test_workers_outlive_no_front(turnstile_factory, shared_relay, tiny_qwen2, no_end_bias):
    """The front SIGKILLed (nothing of it runs to stop the others) while the fleet is paused
    and a call waits at a worker's door: every worker exits within its grace period anyway
    (no orphan holds a port or the store)."""
    t = turnstile_factory(shared_relay.url, tiny_qwen2, extra=("--workers", "2"))
    s = next(s for o, s in _owned(t, 2).items() if o != t.url)
    assert t.http.post(t.url + "/admin/pause", json={"timeout": 5}).status_code == 200
    ended = threading.Event()

    def call() -> None:
        with contextlib.suppress(openai.APIError):  # its connection drops with the worker
            _chat(s["base_url"], [{"role": "user", "content": "x"}], no_end_bias, timeout=60)
        ended.set()

    threading.Thread(target=call, daemon=True).start()
    origin = s["base_url"].split("/s/")[0]
    _until("the call at the worker's door", lambda: _in_flight(t, origin), 1)
    assert not ended.is_set()  # held there, not answered
    assert t.proc is not None
    kids = psutil.Process(t.proc.pid).children(recursive=True)
    assert kids
    t.stop(signal.SIGKILL)
    _, alive = psutil.wait_procs(kids, timeout=40)
    assert not alive, alive


def test_sigterm_on_the_front_stops_every_worker(ts, no_end_bias):
    """Also while paused with a call held at a worker's door (a graceful shutdown would wait
    for it for ever): within the workers' grace period."""
    s = next(s for o, s in _owned(ts).items() if o != ts.url)
    assert ts.http.post(ts.url + "/admin/pause", json={"timeout": 5}).status_code == 200

    def call() -> None:
        with contextlib.suppress(openai.APIError):
            _chat(s["base_url"], [{"role": "user", "content": "x"}], no_end_bias, timeout=60)

    threading.Thread(target=call, daemon=True).start()
    origin = s["base_url"].split("/s/")[0]
    _until("the call at the worker's door", lambda: _in_flight(ts, origin), 1)
    assert ts.proc is not None
    kids = psutil.Process(ts.proc.pid).children(recursive=True)
    assert len([k for k in kids if "turnstile.app.workers" in " ".join(k.cmdline())]) == WORKERS - 1
    ts.stop()  # SIGTERM; SIGKILL after 15 s
    assert ts.proc.returncode is not None and ts.proc.returncode != -signal.SIGKILL
    assert "did not stop" not in ts.log.read_text()  # each worker stopped by itself
    _, alive = psutil.wait_procs(kids, timeout=30)
    assert not alive, alive
    with pytest.raises(httpx.ConnectError):
        httpx.get(ts.url + "/health")
