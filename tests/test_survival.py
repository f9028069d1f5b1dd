"""Survival (issue 12): SIGKILL under load, a locked and a full store, an engine killed
mid-stream, harnesses that go away; bad values that used to poison reads and exports; races
and leaks. Turnstile runs as a real process in front of the vLLM fake (tests/fakes), whose
record of what it received and sampled is the truth the records are checked against."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import turnstile_testbed as testbed
from turnstile.gateway.admission import SERVER_STOPPED
from turnstile.testing.fake_vllm import MODEL, VLLMFake
from turnstile.testing.scripted import first_token_delay
from turnstile.testing.toy_model import EOS

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

TOKEN = "tst-survival-" + secrets.token_urlsafe(16)
AUTH = {"authorization": f"Bearer {TOKEN}"}
NO_EOS = {str(EOS): -100}  # the fake never ends on its own: every call runs to max_tokens


class Server:
    """``turnstile serve --engine vllm`` as a real process (SIGKILL, rlimits, restart)."""

    def __init__(
        self, engine_url: str, model: Path, data: Path, log: Path, *extra: str, preexec=None
    ):  # noqa: ANN001
        self.engine_url, self.model, self.data, self.log = engine_url, model, data, log
        self.extra, self.preexec = extra, preexec
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """One client, kept alive: a fresh ``httpx.post`` builds a TLS context each time
        (~35 ms), which the crash test's 1,000 checks would pay."""
        if self._http is None:
            self._http = httpx.Client(headers=AUTH, timeout=60)
        return self._http

    def start(self) -> Server:
        port = testbed.free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            "--engine",
            "vllm",
            "--engine-url",
            self.engine_url,
            "--model",
            str(self.model),
            "--port",
            str(port),
            "--data",
            str(self.data),
            *self.extra,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TURNSTILE_TOKEN": TOKEN},
                preexec_fn=self.preexec,
            )
        testbed.wait_healthy(self.url + "/v1/models", self.proc, timeout=120, headers=AUTH)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._http is not None:
            self._http.close()
            self._http = None

    def post(self, path: str, body: object = None, **kw: object) -> httpx.Response:
        return self.http.post(self.url + path, json=body, **kw)

    def get(self, path: str) -> dict:
        r = self.http.get(self.url + path)
        r.raise_for_status()
        return r.json()

    def session(self, **body: object) -> dict:
        r = self.post("/v1/sessions", body)
        r.raise_for_status()
        return r.json()

    def calls(self, sid: str) -> list[dict]:
        return self.get(f"/v1/sessions/{sid}/calls")["data"]

    def in_flight(self) -> int:
        return self.get("/admin/status")["in_flight"]


@pytest.fixture
def servers(tmp_path: Path):
    started: list[Server] = []

    def make(
        engine_url: str, model: Path, data: Path | None = None, *extra: str, preexec=None
    ) -> Server:  # noqa: ANN001
        s = Server(
            engine_url,
            model,
            data or tmp_path / "data",
            tmp_path / f"turnstile-{len(started)}.log",
            *extra,
            preexec=preexec,
        )
        started.append(s)
        return s.start()

    yield make
    for s in started:
        s.stop()


def _until(cond, timeout: float = 30.0, what: str = "condition"):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _error(r: httpx.Response, *status: int) -> dict:
    assert r.status_code in status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return err


def _body(messages: list[dict], seed: int, stream: bool = False, max_tokens: int = 8) -> dict:
    return {
        "model": "m",
        "messages": messages,
        "max_tokens": max_tokens,
        "seed": seed,
        "logit_bias": NO_EOS,
        "stream": stream,
    }


def _received(fake: VLLMFake, rid: str) -> list[int]:
    """The prompt the fake engine received for one of its request ids."""
    for r in fake.rec.requests:
        b = r.body
        if (
            r.path == "/inference/v1/generate"
            and isinstance(b, dict)
            and f"generate-tokens-{r.headers.get('x-request-id') or b.get('request_id')}" == rid
        ):
            return b["token_ids"]
    raise AssertionError(f"the fake never received {rid}")


def _check_extends(ts: Server, fake: VLLMFake, sid: str, call: dict, parent_id: str) -> None:
    """``call`` extends ``parent_id``: its trajectory is what the engine received + sampled."""
    assert call["parent_id"] == parent_id and call["segment_reason"] is None, call
    rid = call["engine_request_id"]
    traj = [t for t in ts.get(f"/v1/sessions/{sid}/trajectories")["data"] if t["id"] == call["id"]][
        0
    ]
    assert traj["token_ids"] == _received(fake, rid) + fake.rec.sent[rid].ids


# ---------------------------------------------------------------------------------------------
# crash


async def _harness(
    url: str, i: int, stream: bool, acked: dict, stop: asyncio.Event, client: httpx.AsyncClient
) -> None:
    """One rollout: turn after turn until the server dies; ``acked`` keeps every reply whose
    response (or final chunk) arrived, with the messages it answered."""
    msgs = [{"role": "user", "content": f"task {i}"}]
    turn = 0
    while not stop.is_set():
        body = _body(msgs, seed=i * 100 + turn, stream=stream)
        try:
            if not stream:
                r = await client.post(url, json=body)
                if r.status_code != 200:
                    return
                reply = r.json()["choices"][0]["message"]
            else:
                content, finished = "", False
                async with client.stream("POST", url, json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        ch = json.loads(line[6:])
                        if "error" in ch:
                            return
                        for c in ch["choices"]:
                            content += c["delta"].get("content") or ""
                            finished = finished or c["finish_reason"] is not None
                if not finished:
                    return
                reply = {"role": "assistant", "content": content}
        except httpx.HTTPError:
            return
        acked.setdefault(i, []).append((list(msgs), reply))
        msgs = msgs + [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": f"turn {turn + 2} of {i}"},
        ]
        turn += 1


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_sigkill_under_200_sessions_loses_nothing_acknowledged(
    tiny_qwen2, servers, tmp_path, store, request
):
    """200 concurrent rollouts (half streaming) against the fake; SIGKILL once 300 replies
    were acknowledged; restart. Every acknowledged reply is recorded intact, calls cut off
    are aborted or absent, and every rollout continues exactly where its harness left it.

    ``postgres``: the node dies with its disk. The gateways keep their records in one
    PostgreSQL database, and the rollouts continue on a second gateway with a data directory
    of its own (another node), which has never seen these sessions."""
    extra: tuple[str, ...] = ()
    nodes = (tmp_path / "store", tmp_path / "store")
    if store == "postgres":
        extra = ("--store", request.getfixturevalue("postgres").database())
        nodes = (tmp_path / "node-a", tmp_path / "node-b")
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.01  # calls are in flight when the kill lands
        ts = servers(fake.url, tiny_qwen2, nodes[0], *extra)
        sids = [ts.session(group_id="crash", sample_index=i)["id"] for i in range(200)]
        acked: dict[int, list] = {}

        async def run() -> None:
            stop = asyncio.Event()
            limits = httpx.Limits(max_connections=400)
            async with httpx.AsyncClient(headers=AUTH, timeout=120, limits=limits) as client:
                tasks = [
                    asyncio.ensure_future(
                        _harness(
                            f"{ts.url}/s/{sid}/v1/chat/completions",
                            i,
                            i % 2 == 1,
                            acked,
                            stop,
                            client,
                        )
                    )
                    for i, sid in enumerate(sids)
                ]
                while sum(len(v) for v in acked.values()) < 300:
                    await asyncio.sleep(0.01)
                ts.proc.send_signal(signal.SIGKILL)
                stop.set()
                await asyncio.gather(*tasks)

        asyncio.run(run())
        ts.proc.wait()
        n_acked = sum(len(v) for v in acked.values())
        if store == "postgres":  # the first node is gone with its files (it wrote no records)
            assert not list(nodes[0].glob("*.sqlite3*"))
            shutil.rmtree(nodes[0], ignore_errors=True)
        fake.token_delay = 0  # the checks below need no calls in flight
        ts2 = servers(fake.url, tiny_qwen2, nodes[1], *extra)
        streamed = 0
        for i, sid in enumerate(sids):
            calls = ts2.calls(sid)
            ok = [c for c in calls if c["status"] == "ok"]
            assert all(c["status"] in ("ok", "aborted", "error") for c in calls)
            # every acknowledged reply is there, in order along one chain, intact
            parent = None
            for _msgs, reply in acked.get(i, []):
                mine = [
                    c
                    for c in ok
                    if c["parent_id"] == parent and c["message"]["content"] == reply["content"]
                ]
                assert mine, (sid, reply)
                c = mine[0]
                assert c["completion_ids"] == fake.rec.sent[c["engine_request_id"]].ids
                parent = c["id"]
            streamed += i % 2 and len(acked.get(i, []))
            # the harness goes on from its last acknowledged reply: exact continuation
            history = acked.get(i, [])
            msgs = [{"role": "user", "content": f"task {i}"}]
            if history:
                last_msgs, last = history[-1]
                msgs = last_msgs + [
                    {"role": "assistant", "content": last["content"]},
                    {"role": "user", "content": "after the restart"},
                ]
            r = ts2.post(f"/s/{sid}/v1/chat/completions", _body(msgs, seed=7))
            assert r.status_code == 200, r.text
            new = ts2.calls(sid)[-1]
            if parent is not None:
                _check_extends(ts2, fake, sid, new, parent)
        assert n_acked >= 300 and streamed > 0
        before = [c["status"] for s in sids for c in ts2.calls(s)[:-1]]
        print(
            f"\ncrash ({store}): {n_acked} replies acknowledged before SIGKILL; recorded: "
            f"{before.count('ok')} ok, {before.count('aborted')} aborted, "
            f"{before.count('error')} error; 200/200 sessions continued exactly"
        )


# ---------------------------------------------------------------------------------------------
# faults


def _hold_write_lock(db: Path, seconds: int) -> subprocess.Popen:
    """Another process holding the store's write lock for ``seconds`` (returns once held)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sqlite3, time\n"
                f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
                "db.execute('BEGIN IMMEDIATE')\nprint('locked', flush=True)\n"
                f"time.sleep({seconds})\ndb.execute('ROLLBACK')\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_store_locked_for_35_s(tiny_qwen2, servers, tmp_path):
    """Another process holds the write lock for 35 s: calls get a clean 503 after the busy
    wait, the event loop keeps answering, nothing half-recorded becomes a parent; after the
    lock is gone the retried turn extends the last acknowledged call."""
    with VLLMFake("0.33.0") as fake:
        ts = servers(fake.url, tiny_qwen2)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        msgs = [{"role": "user", "content": "one"}]
        r = httpx.post(url, json=_body(msgs, 1), headers=AUTH, timeout=60)
        assert r.status_code == 200
        first = ts.calls(sid)[0]
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "two"}]
        holder = _hold_write_lock(ts.data / "turnstile.sqlite3", 35)
        try:
            out: dict = {}
            t = threading.Thread(
                target=lambda: out.update(
                    r=httpx.post(url, json=_body(msgs, 2), headers=AUTH, timeout=60)
                )
            )
            t.start()
            _until(lambda: len(fake.rec.sent) >= 2, what="the engine call")
            # the loop is not blocked while the write waits
            t0 = time.monotonic()
            assert httpx.get(ts.url + "/admin/status", headers=AUTH, timeout=5).status_code == 200
            assert time.monotonic() - t0 < 2
            t.join(60)
            err = _error(out["r"], 503)
            assert err["code"] == "store_busy"
            s = httpx.post(url, json=_body(msgs, 3, stream=True), headers=AUTH, timeout=60)
            assert '"store_busy"' in s.text and '"finish_reason":"length"' not in s.text
            assert holder.poll() is None  # all of this happened inside the 35 s
        finally:
            holder.wait(60)
        r = httpx.post(url, json=_body(msgs, 4), headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        calls = ts.calls(sid)
        assert [c["status"] for c in calls] == ["ok", "ok"]
        _check_extends(ts, fake, sid, calls[1], first["id"])
        assert ts.in_flight() == 0


def test_new_sessions_wait_for_a_locked_store_off_the_loop(tiny_qwen2, servers, tmp_path):
    """A session created on first use (``X-Session-Id``) or by the trainer is committed by the
    store's writer, not on the event loop: with the write lock held by another process, both
    wait there (then a clean 503 after the busy wait) while the loop keeps answering; with
    the lock gone the same requests create the sessions and the call is recorded in its."""
    with VLLMFake("0.33.0") as fake:
        ts = servers(fake.url, tiny_qwen2)
        url = f"{ts.url}/v1/chat/completions"
        named = {**AUTH, "x-session-id": "first-use"}
        msgs = [{"role": "user", "content": "one"}]
        holder = _hold_write_lock(ts.data / "turnstile.sqlite3", 12)
        try:
            out: dict = {}
            calls = [
                threading.Thread(
                    target=lambda: out.update(
                        call=httpx.post(url, json=_body(msgs, 1), headers=named, timeout=60)
                    )
                ),
                threading.Thread(
                    target=lambda: out.update(
                        created=httpx.post(
                            ts.url + "/v1/sessions",
                            json={"id": "by-trainer"},
                            headers=AUTH,
                            timeout=60,
                        )
                    )
                ),
            ]
            for t in calls:
                t.start()
            time.sleep(1.0)  # both are waiting for the lock by now
            for _ in range(3):  # the loop is not blocked while they wait
                t0 = time.monotonic()
                r = httpx.get(ts.url + "/admin/status", headers=AUTH, timeout=10)
                assert r.status_code == 200 and time.monotonic() - t0 < 1.0
                time.sleep(0.5)
            for t in calls:
                t.join(60)
            assert _error(out["call"], 503)["code"] == "store_busy"
            assert _error(out["created"], 503)["code"] == "store_busy"
            assert len(fake.rec.sent) == 0  # the call never reached the engine
            assert holder.poll() is None  # all of this happened while the lock was held
        finally:
            holder.wait(60)
        r = httpx.post(url, json=_body(msgs, 1), headers=named, timeout=60)
        assert r.status_code == 200, r.text
        [call] = ts.calls("first-use")
        assert call["status"] == "ok"
        r = httpx.post(ts.url + "/v1/sessions", json={"id": "by-trainer"}, headers=AUTH, timeout=60)
        assert r.status_code == 201, r.text
        assert ts.calls("by-trainer") == []


def _ignore_sigxfsz() -> None:
    # a write past RLIMIT_FSIZE then fails with EFBIG instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_disk_full(tiny_qwen2, servers, tmp_path):
    """The store cannot grow (RLIMIT_FSIZE on the server process): the call is refused with a
    clean 507/503, is not recorded, and nothing extends it; with room again, the retried turn
    extends the last acknowledged call."""
    with VLLMFake("0.33.0") as fake:
        data = tmp_path / "data"
        ts = servers(fake.url, tiny_qwen2, data, preexec=_ignore_sigxfsz)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        msgs = [{"role": "user", "content": "one"}]
        r = httpx.post(url, json=_body(msgs, 1), headers=AUTH, timeout=60)
        first = ts.calls(sid)[0]
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "two"}]
        wal = data / "turnstile.sqlite3-wal"
        limit = wal.stat().st_size
        resource.prlimit(ts.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            for seed, stream in ((2, False), (3, True), (4, False)):
                r = httpx.post(url, json=_body(msgs, seed, stream), headers=AUTH, timeout=60)
                if stream:
                    assert '"finish_reason":"length"' not in r.text
                    assert '"store_full"' in r.text or '"store_busy"' in r.text, r.text
                else:
                    assert _error(r, 507, 503)["code"] in ("store_full", "store_busy")
            assert httpx.get(ts.url + "/health").status_code == 200  # still up
        finally:
            resource.prlimit(
                ts.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
        r = httpx.post(url, json=_body(msgs, 5), headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        calls = [c for c in ts.calls(sid) if c["status"] == "ok"]
        assert len(calls) == 2
        _check_extends(ts, fake, sid, calls[1], first["id"])
        assert ts.in_flight() == 0


_FAKE_MAIN = """
import time
from turnstile.testing.fake_vllm import VLLMFake
f = VLLMFake("0.33.0").start()
f.token_delay = 0.05
print(f.url, flush=True)
while True:
    time.sleep(60)
"""


def test_engine_killed_mid_stream(tiny_qwen2, servers):
    # the child imports this checkout's turnstile.testing through $PYTHONPATH (conftest)
    eng = subprocess.Popen([sys.executable, "-c", _FAKE_MAIN], stdout=subprocess.PIPE, text=True)
    try:
        engine_url = eng.stdout.readline().strip()
        ts = servers(engine_url, tiny_qwen2)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        msgs = [{"role": "user", "content": "one"}]
        ok = httpx.post(url, json=_body(msgs, 1), headers=AUTH, timeout=60)
        assert ok.status_code == 200
        msgs += [ok.json()["choices"][0]["message"], {"role": "user", "content": "two"}]
        lines = []
        with httpx.stream(
            "POST", url, json=_body(msgs, 2, True, max_tokens=400), headers=AUTH, timeout=60
        ) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: {") and len(lines) > 4:
                    eng.send_signal(signal.SIGKILL)
                    eng.wait()
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert "error" in events[-1] and events[-1]["error"]["message"]
        assert not any(c.get("choices") and c["choices"][0]["finish_reason"] for c in events[:-1])
    finally:
        eng.kill()
        eng.wait()
    calls = ts.calls(sid)
    assert [c["status"] for c in calls] == ["ok", "error"]
    assert [t["call_ids"] for t in ts.get(f"/v1/sessions/{sid}/trajectories")["data"]] == [
        [calls[0]["id"]]
    ]
    _until(lambda: ts.in_flight() == 0, what="in_flight 0")
    assert httpx.get(ts.url + "/admin/status", headers=AUTH).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_client_gone_mid_call_aborts_the_engine_call(tiny_qwen2, servers, stream):
    """The harness goes away while the engine generates (a long call, 400 tokens at 50 ms):
    the engine call is dropped (the fake sees the disconnect), the call is recorded as aborted
    (not ok), and nothing stays in flight."""
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.05
        ts = servers(fake.url, tiny_qwen2)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        body = _body([{"role": "user", "content": "go"}], 1, stream, max_tokens=400)

        def go() -> None:
            with httpx.Client(headers=AUTH, timeout=httpx.Timeout(60, read=1.5)) as c:
                try:
                    with c.stream("POST", url, json=body) as r:
                        for i, _ in enumerate(r.iter_lines()):
                            if i == 6:
                                break  # a streaming harness stops reading and goes away
                except httpx.ReadTimeout:
                    pass  # the harness gives up and closes the connection

        go()
        _until(lambda: fake.rec.disconnects, timeout=15, what="the engine to see the drop")
        calls = _until(
            lambda: [c for c in ts.calls(sid) if c["status"] == "aborted"],
            what="the aborted record",
        )
        assert len(ts.calls(sid)) == 1 and calls[0]["error"] == "the client disconnected"
        assert len(calls[0]["completion_ids"]) < 400
        _until(lambda: ts.in_flight() == 0, what="in_flight 0")


@pytest.mark.parametrize("mode", ["token-in", "passthrough"])
@pytest.mark.parametrize("stream", [False, True])
def test_sigterm_gives_running_calls_a_grace_then_records_them_aborted(
    tiny_qwen2, servers, tmp_path, stream, mode
):
    """SIGTERM while a call runs (400 tokens at 50 ms: 20 s): the server lets it go on for
    ``--shutdown-grace`` (2 s), then cancels it, records it as aborted with the tokens it had
    (the stream's; a whole call has none before the engine's answer; in passthrough the engine
    is still silent) and why, and exits by
    itself, well before a supervisor's kill (which would record nothing). A second server on
    the same store reads the record back. (Before the grace, the whole call's record was lost
    and the stream's said its client had gone.)"""
    with VLLMFake("0.33.0") as fake, contextlib.ExitStack() as slow:
        fake.token_delay = 0.05
        if mode == "passthrough":  # its replies are short: it waits before its first token
            slow.enter_context(first_token_delay(fake, 30))
        model = tiny_qwen2 if mode == "token-in" else Path(MODEL)
        ts = servers(fake.url, model, tmp_path / "data", "--shutdown-grace", "2", "--mode", mode)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        body = _body([{"role": "user", "content": "go"}], 1, stream, max_tokens=400)
        if mode == "passthrough":
            body["model"] = MODEL  # the engine's own name: the harness speaks to it
        seen: list[str] = []

        def go() -> None:
            with httpx.Client(headers=AUTH, timeout=60) as c:
                try:
                    with c.stream("POST", url, json=body) as r:
                        seen.extend(r.iter_lines())
                except httpx.HTTPError as exc:
                    seen.append(f"{type(exc).__name__}")

        harness = threading.Thread(target=go, daemon=True)
        harness.start()
        _until(lambda: ts.in_flight() == 1 or not harness.is_alive(), what="the call running")
        assert harness.is_alive(), seen
        time.sleep(0.5)  # some tokens out
        assert ts.proc is not None
        began = time.monotonic()
        ts.proc.send_signal(signal.SIGTERM)
        rc = ts.proc.wait(15)
        took = time.monotonic() - began
        assert rc in (0, -signal.SIGTERM), ts.log.read_text()[-2000:]  # uvicorn re-raises it
        assert 1.5 < took < 8, (took, ts.log.read_text()[-3000:], seen)  # the grace, not 20 s
        harness.join(10)
        assert not harness.is_alive()
        again = servers(fake.url, model, tmp_path / "data", "--mode", mode)
        calls = again.calls(sid)
        assert [c["status"] for c in calls] == ["aborted"], (calls, ts.log.read_text()[-4000:])
        got = len(calls[0]["completion_ids"])  # a whole call reads the engine whole: none yet
        assert 0 < got < 400 if stream and mode == "token-in" else got == 0, got
        assert calls[0]["error"] == SERVER_STOPPED


# ---------------------------------------------------------------------------------------------
# bad values, races, leaks


def test_bad_values_are_refused_and_old_ones_do_not_poison(tiny_qwen2, servers, tmp_path):
    from turnstile.store.export import export

    with VLLMFake("0.33.0") as fake:
        data = tmp_path / "data"
        ts = servers(fake.url, tiny_qwen2, data)
        for v in ("99999999999999999999", "--5", "²", 2**64, ""):
            assert (
                _error(ts.post("/admin/resume", {"weight_version": v}), 400)["param"]
                == "weight_version"
            )
        assert (
            _error(ts.post("/v1/sessions", {"sample_index": 3_000_000_000}), 400)["param"]
            == "sample_index"
        )
        assert _error(ts.post("/v1/sessions", {"group_id": "g" * 300}), 400)["param"] == "group_id"
        sid = ts.session(group_id="ok", sample_index=1)["id"]
        r = httpx.post(
            f"{ts.url}/s/{sid}/v1/chat/completions",
            headers=AUTH,
            json=_body([{"role": "user", "content": "hi"}], 1),
            timeout=60,
        )
        assert r.status_code == 200
        assert ts.post("/admin/resume", {"weight_version": "step-7"}).status_code == 200
        # records an older version let in: a huge version, an int32-breaking sample index,
        # a 300-character group id
        db = sqlite3.connect(data / "turnstile.sqlite3")
        info = json.loads(db.execute("SELECT info FROM calls").fetchone()[0])
        info["weight_version"] = "99999999999999999999"
        db.execute("UPDATE calls SET info = ?", (json.dumps(info).encode(),))
        db.execute(
            "UPDATE sessions SET sample_index = 3000000000, group_id = ? WHERE id = ?",
            ("g" * 300, sid),
        )
        db.commit()
        db.close()
        t = ts.get(f"/v1/sessions/{sid}/trajectories")["data"]
        assert t[0]["versions"] == [None] * len(t[0]["versions"])
        assert t[0]["turns"][0]["weight_version"] == "99999999999999999999"
        res = export(data, tmp_path / "out", partition="group", batch="b1")
        assert res.sessions == 1 and res.rows["trajectories"] == 1, res.skipped
        assert res.warnings[0]["field"] == "sample_index"
        files = [Path(f) for fs in res.files.values() for f in fs]
        assert files and all(f.exists() and len(f.parent.name) < 200 for f in files)


def test_export_is_atomic_and_tolerant_and_delete_keeps_late_calls(tmp_path, monkeypatch):
    from turnstile.store import export as ex
    from turnstile.store.records import CallRecord
    from turnstile.store.store import Store

    st = Store(tmp_path / "data")
    from array import array

    def add(sid: str, n: int) -> None:
        c = CallRecord(
            id=f"call_{sid}_{n}",
            session_id=sid,
            seq=n,
            parent_id=None,
            segment_reason="first_call",
            reused_prefix_len=0,
            prompt_delta=array("i", [1, 2]),
            completion_ids=array("i", [3]),
            completion_logprobs=array("f", [-0.5]),
            finish_reason="stop",
            stop_token_id=None,
            seam=None,
            status="ok",
            info={},
        )
        st.add_call(c)

    for sid in ("a", "b", "c"):
        st.create_session({}, sid)
        add(sid, 0)
    st._db.execute("UPDATE calls SET info = x'7b' WHERE session_id = 'b'")  # corrupt JSON
    # a failure while writing the files leaves no file of the batch behind
    real = ex._TableWriter.close
    calls = {"n": 0}

    def failing(self):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(self)

    monkeypatch.setattr(ex._TableWriter, "close", failing)
    with pytest.raises(OSError):
        ex.export(tmp_path / "data", tmp_path / "out", batch="x", store=st, rows_per_file=1)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    monkeypatch.setattr(ex._TableWriter, "close", real)
    # one bad record: that session is skipped and reported, the others exported
    # and --delete keeps a session that got a call after the export read it
    real_export = ex._export_session

    def late(st_, s, *a):  # noqa: ANN001, ANN202
        real_export(st_, s, *a)
        if s["id"] == "c":
            add("c", 1)  # recorded between the export's read and its delete

    monkeypatch.setattr(ex, "_export_session", late)
    res = ex.export(tmp_path / "data", tmp_path / "out", batch="y", store=st, delete=True)
    assert [s["session_id"] for s in res.skipped] == ["b"]
    assert res.session_ids == ["a", "c"] and res.deleted == 1 and res.kept == ["c"]
    assert st.get_session("a") is None and st.get_session("b") is not None
    assert len(st.calls("c")) == 2


def test_delete_during_a_call_and_closed_sessions_stay_closed(tiny_qwen2, servers):
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.05
        ts = servers(fake.url, tiny_qwen2)
        ts.session(id="reused")
        url = f"{ts.url}/s/reused/v1/chat/completions"
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(
                r=httpx.post(
                    url,
                    headers=AUTH,
                    timeout=60,
                    json=_body([{"role": "user", "content": "x"}], 1, max_tokens=40),
                )
            )
        )
        t.start()
        _until(lambda: fake.rec.sent, what="the engine call")
        assert httpx.delete(ts.url + "/v1/sessions/reused", headers=AUTH).status_code == 200
        ts.session(id="reused")  # re-created while the old call still runs
        t.join(60)
        assert _error(out["r"], 404)["code"] == "session_not_found"
        assert ts.calls("reused") == []  # the old incarnation's call did not land here
        # a closed session stays closed when its id is created again
        assert ts.post("/v1/sessions/reused/close", {}).status_code == 200
        ts.session(id="reused")
        r = httpx.post(url, headers=AUTH, json=_body([{"role": "user", "content": "x"}], 1))
        assert _error(r, 409)["code"] == "session_closed"
        # ... and after a restart, through X-Session-Id
        ts.stop()
        ts.start()
        r = httpx.post(
            ts.url + "/v1/chat/completions",
            timeout=60,
            headers={**AUTH, "x-session-id": "reused"},
            json=_body([{"role": "user", "content": "x"}], 1),
        )
        assert _error(r, 409)["code"] == "session_closed"


def _held_write_lock(db: Path) -> subprocess.Popen:
    """Another process holding the store's write lock until a line comes on its stdin."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sqlite3, sys\n"
                f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
                "db.execute('BEGIN IMMEDIATE')\nprint('locked', flush=True)\n"
                "sys.stdin.readline()\ndb.execute('ROLLBACK')\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_calls_of_one_session_ending_together_get_distinct_seqs(tiny_qwen2, servers):
    """Four calls of one session end while the store's write lock is held elsewhere, so all
    four records are built before any is committed: each still gets its own ``seq`` (they
    used to share one), and after a restart the next call follows them."""
    with VLLMFake("0.33.0") as fake:
        ts = servers(fake.url, tiny_qwen2)
        sid = ts.session()["id"]

        def call(i: int) -> httpx.Response:
            body = _body([{"role": "user", "content": f"q{i}"}], i, max_tokens=4)
            url = f"{ts.url}/s/{sid}/v1/chat/completions"  # (a restart listens elsewhere)
            return httpx.post(url, json=body, headers=AUTH, timeout=60)

        holder = _held_write_lock(ts.data / "turnstile.sqlite3")
        try:
            with ThreadPoolExecutor(4) as pool:
                answers = [pool.submit(call, i) for i in range(4)]
                _until(lambda: len(fake.rec.finished) >= 4, what="the engine's four answers")
                time.sleep(0.5)  # (so that the old code's collision shows: seq is not timing)
                assert not any(a.done() for a in answers)  # all wait for their commits
                assert holder.stdin is not None
                holder.stdin.write("\n")
                holder.stdin.flush()
                assert all(a.result().status_code == 200 for a in answers)
        finally:
            holder.kill()
            holder.wait()
        assert sorted(c["seq"] for c in ts.calls(sid)) == [0, 1, 2, 3]
        ts.stop()
        ts.start()
        assert call(4).status_code == 200
        assert [c["seq"] for c in ts.calls(sid)] == [0, 1, 2, 3, 4]


def _sse_events(r: httpx.Response) -> list[dict]:
    return [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]


def test_close_aborts_the_sessions_running_calls(tiny_qwen2, servers):
    """``POST /v1/sessions/{id}/close`` while three calls of the session generate (400 tokens
    at 50 ms each): the engine calls stop, each call is recorded ``aborted`` with the reason
    (before the close answers), and each harness hears that its session was closed in its
    dialect: a 409 (Chat Completions, Messages) or an in-band error event (a stream). Another
    session's call runs on."""
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.05
        ts = servers(fake.url, tiny_qwen2)
        sid, other = ts.session()["id"], ts.session()["id"]
        msgs = [{"role": "user", "content": "go"}]
        requests = {
            "whole": (sid, "chat/completions", _body(msgs, 1, max_tokens=400)),
            "stream": (sid, "chat/completions", _body(msgs, 2, True, max_tokens=400)),
            "messages": (
                sid,
                "messages",
                {"model": "m", "max_tokens": 400, "temperature": 0, "messages": msgs},
            ),
            "other": (other, "chat/completions", _body(msgs, 3, max_tokens=40)),
        }

        def call(key: str) -> httpx.Response:
            session, route, body = requests[key]
            return httpx.post(
                f"{ts.url}/s/{session}/v1/{route}", json=body, headers=AUTH, timeout=60
            )

        with ThreadPoolExecutor(len(requests)) as pool:
            answers = {key: pool.submit(call, key) for key in requests}
            _until(lambda: len(fake.rec.sent) == 4, what="the four engine calls")
            closed = ts.post(f"/v1/sessions/{sid}/close", {})
            assert closed.status_code == 200 and closed.json()["status"] == "closed"
            calls = ts.calls(sid)  # recorded before the close answered
            got = {key: a.result() for key, a in answers.items()}
        assert [c["status"] for c in calls] == ["aborted"] * 3
        assert all("session was closed" in c["error"] for c in calls), calls
        assert all(len(c["completion_ids"]) < 400 for c in calls)
        assert _error(got["whole"], 409)["code"] == "session_closed"
        assert got["messages"].status_code == 409
        err = got["messages"].json()
        assert err["type"] == "error" and "session was closed" in err["error"]["message"]
        assert got["stream"].status_code == 200
        events = _sse_events(got["stream"])
        assert events[-1]["error"]["code"] == "session_closed"
        assert not any(c["choices"][0]["finish_reason"] for c in events[:-1] if c.get("choices"))
        _until(lambda: len(fake.rec.disconnects) == 3, what="the engine to see three drops")
        assert got["other"].status_code == 200
        assert [c["status"] for c in ts.calls(other)] == ["ok"]
        assert ts.in_flight() == 0


def test_pause_abort_answers_how_many_it_aborted(tiny_qwen2, servers):
    """``/admin/pause {"mode": "abort"}`` with two calls generating: its answer counts the two
    it aborted (it said ``in_flight: 0`` and nothing else), as the harnesses and /metrics do."""
    with VLLMFake("0.33.0") as fake:
        fake.token_delay = 0.05
        ts = servers(fake.url, tiny_qwen2)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        msgs = [{"role": "user", "content": "go"}]
        bodies = [_body(msgs, 1, max_tokens=400), _body(msgs, 2, True, max_tokens=400)]
        with ThreadPoolExecutor(2) as pool:
            answers = [
                pool.submit(httpx.post, url, json=b, headers=AUTH, timeout=60) for b in bodies
            ]
            _until(lambda: len(fake.rec.sent) == 2 and ts.in_flight() == 2, what="two calls")
            r = ts.post("/admin/pause", {"mode": "abort"})
            whole, stream = (a.result() for a in answers)
        assert r.status_code == 200, r.text
        paused = r.json()
        assert paused["aborted"] == 2 and paused["in_flight"] == 0, paused
        assert _error(whole, 503)["code"] == "policy_update"
        assert _sse_events(stream)[-1]["error"]["code"] == "policy_update"
        assert [c["status"] for c in ts.calls(sid)] == ["aborted"] * 2
        scraped = httpx.get(ts.url + "/metrics", headers=AUTH, timeout=30).text
        assert (
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in scraped.splitlines()
                if line.startswith("turnstile_errors_total{") and 'kind="policy_update"' in line
            )
            == 2
        )
        assert ts.post("/admin/resume", {}).status_code == 200


def test_limits_refuse_before_rendering(tiny_qwen2, servers):
    with VLLMFake("0.33.0") as fake:
        ts = servers(fake.url, tiny_qwen2, None, "--max-messages", "100", "--max-depth", "20")
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        many = {"messages": [{"role": "user", "content": ""}] * 1_000_000}
        t0 = time.monotonic()
        err = _error(httpx.post(url, json=many, headers=AUTH, timeout=60), 400)
        assert err["param"] == "messages" and "--max-messages" in err["message"]
        assert time.monotonic() - t0 < 20
        deep: object = "x"
        for _ in range(30):
            deep = {"a": deep}
        body = {"messages": [{"role": "user", "content": "hi"}], "metadata": deep}
        err = _error(httpx.post(url, json=body, headers=AUTH, timeout=60), 400)
        assert err["param"].startswith("metadata") and "--max-depth" in err["message"]
        assert not fake.rec.sent


def test_pause_closes_the_door_first_and_streams_count_in_flight():
    """Unit level: a stream admitted but not yet started is in flight; pause(abort) marks it,
    so it is refused when it starts; a ticket released from another task leaves nothing."""
    from turnstile.gateway.control import PolicyControl

    async def run() -> None:
        c = PolicyControl()
        # admitted in the request's task, which returns (the stream runs in another)
        ticket = await asyncio.ensure_future(c.admit())
        assert c.in_flight == 1
        c.close_door("abort")
        assert c.paused and ticket.abort

        async def elsewhere() -> None:
            c.bind(ticket)
            c.release(ticket)

        await asyncio.ensure_future(elsewhere())
        assert c.in_flight == 0
        c.resume("8")
        assert not c.paused and c.version == "8"

    asyncio.run(run())


def test_passthrough_store_faults(servers, tmp_path):
    """Capture mode meets the same store faults: a locked store and a full disk give the
    harness a clean 503/507 (never a 500), the event loop keeps answering, the failed turns
    are not parents, and the retried turn links to the last acknowledged call."""
    with VLLMFake("0.33.0") as fake:
        data = tmp_path / "pt"
        ts = servers(fake.url, Path(MODEL), data, "--mode", "passthrough", preexec=_ignore_sigxfsz)
        sid = ts.session()["id"]
        url = f"{ts.url}/s/{sid}/v1/chat/completions"
        msgs = [{"role": "user", "content": "one"}]

        def body(seed: int, stream: bool = False) -> dict:
            return {**_body(msgs, seed, stream), "model": MODEL}

        r = httpx.post(url, json=body(1), headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        first = ts.calls(sid)[0]
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "two"}]

        holder = _hold_write_lock(data / "turnstile.sqlite3", 12)
        try:
            out: dict = {}
            t = threading.Thread(
                target=lambda: out.update(r=httpx.post(url, json=body(2), headers=AUTH, timeout=60))
            )
            t.start()
            _until(
                lambda: sum(q.path == "/v1/chat/completions" for q in fake.rec.requests) >= 2,
                what="the engine call",
            )
            t0 = time.monotonic()
            assert httpx.get(ts.url + "/admin/status", headers=AUTH, timeout=5).status_code == 200
            assert time.monotonic() - t0 < 2  # the loop is not blocked by the waiting write
            t.join(60)
            assert _error(out["r"], 503)["code"] == "store_busy"
            s = httpx.post(url, json=body(3, stream=True), headers=AUTH, timeout=60)
            assert '"store_busy"' in s.text and '"finish_reason":"length"' not in s.text
        finally:
            holder.wait(60)

        wal = data / "turnstile.sqlite3-wal"
        resource.prlimit(
            ts.proc.pid, resource.RLIMIT_FSIZE, (wal.stat().st_size, resource.RLIM_INFINITY)
        )
        try:
            for seed, stream in ((4, False), (5, True)):
                r = httpx.post(url, json=body(seed, stream), headers=AUTH, timeout=60)
                if stream:
                    assert '"finish_reason":"length"' not in r.text
                    assert '"store_full"' in r.text or '"store_busy"' in r.text, r.text
                else:
                    assert _error(r, 507, 503)["code"] in ("store_full", "store_busy")
            assert httpx.get(ts.url + "/health").status_code == 200
        finally:
            resource.prlimit(
                ts.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
        r = httpx.post(url, json=body(6), headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        ok = [c for c in ts.calls(sid) if c["status"] == "ok"]
        assert [c["id"] for c in ok][0] == first["id"] and len(ok) == 2
        assert ok[1]["parent_id"] == first["id"] and ok[1]["segment_reason"] is None, ok[1]
        assert ts.in_flight() == 0
