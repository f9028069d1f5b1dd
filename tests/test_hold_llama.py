"""A hold across a real weight swap: llama-server restarted on another GGUF (the test bed's tiny
Qwen2-vocab model with other random weights, seed 1) on the same port, under the same Turnstile.

llama-server answers whole (``engines/llamacpp.py``: its stream can drop a token's ID), so a
held call keeps nothing of its cut request: it goes on from its prompt under the new weights,
and the harness still gets one answer, never an error. The truth is the recording relay (what
llama-server received and returned) and llama-server itself: the resumed request, replayed to
the new weights, samples the same tokens (same seed)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from conftest import QWEN25_TEMPLATE, _relayed

import turnstile_testbed as testbed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

N = 300  # ~1.5 s of the tiny model on one thread: the pause lands mid-generation


class Swappable:
    """llama-server on one port, restarted on another model file."""

    def __init__(self, model: Path, log: Path):
        self.port = testbed.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._stack = contextlib.ExitStack()
        self.start(model)

    def start(self, model: Path) -> None:
        self._stack.enter_context(
            testbed.llama_server(model, ctx=4096, parallel=1, log=self.log, port=self.port)
        )

    def swap(self, model: Path) -> None:
        """A crash-like stop (SIGKILL: llama-server's graceful stop waits out the cut request
        the relay still holds open, ~10 s), then the other model on the same port."""
        for child in psutil.Process().children():
            if any(c.laddr.port == self.port for c in child.net_connections("tcp")):
                child.kill()  # ours: the llama-server this object started on its port
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self.start(model)

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def weights(tiny_qwen2: Path) -> tuple[Path, Path]:
    return tiny_qwen2, testbed.tiny_model("qwen2", QWEN25_TEMPLATE, seed=1)


@pytest.fixture
def engine(weights, tmp_path) -> Iterator[Swappable]:
    e = Swappable(weights[0], tmp_path / "llama-server.log")
    yield e
    e.close()


def test_a_call_held_across_a_gguf_swap_is_one_answer_from_the_new_weights(
    engine, weights, turnstile_factory, no_end_bias
):
    """Streamed to the harness (llama-server's request is the same whole one either way; the
    whole answers' path is test_hold.py's, against the vLLM fake)."""
    with _relayed(engine.url) as relay:
        ts = turnstile_factory(relay.url, weights[0])
        session = ts.session()
        client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)

        def ask(stream: bool = True) -> str:
            args = {
                "model": "t",
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": N,
                "seed": 11,
                "logit_bias": no_end_bias,
            }
            if stream:
                chunks = client.chat.completions.create(stream=True, **args)  # type: ignore[call-overload]
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return client.chat.completions.create(**args).choices[0].message.content  # type: ignore[call-overload]

        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(ask)
            deadline = time.monotonic() + 60
            while ts.get("/admin/status")["in_flight"] < 1:
                assert time.monotonic() < deadline and not fut.done()
                time.sleep(0.05)
            time.sleep(0.5)  # generating on the old weights
            paused = ts.http.post(ts.url + "/admin/pause", json={"mode": "hold"}).json()
            assert paused["preempted"] == 1 and paused["held"] == 1, paused
            engine.swap(weights[1])  # the weight update: another GGUF on the same port
            assert not fut.done()
            r = ts.http.post(ts.url + "/admin/resume", json={"weight_version": "gguf-seed1"})
            assert r.status_code == 200
            text = fut.result(120)

        [rec] = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
        assert rec["status"] == "ok" and rec["message"]["content"] == text
        resumed = relay.completions()[-1]
        assert rec["completion_ids"] == resumed.response["tokens"] and len(text) > 0
        assert len(rec["completion_ids"]) == N
        # llama-server's cut request kept nothing: the call went on from its prompt, whole
        assert resumed.request["n_predict"] == N
        assert rec["chunks"][0]["start"] == rec["chunks"][0]["end"] == 0
        assert rec["chunks"][0]["finish_reason"] == "preempted"
        assert rec["chunks"][1]["end"] == N and rec["hold"]["preemptions"] == 1
        assert rec["weight_versions"] == [{"version": "gguf-seed1", "start": 0, "end": N}]
        # the new weights sampled it: replayed to llama-server on the seed-1 GGUF, same tokens
        again = httpx.post(engine.url + "/completion", json=resumed.request, timeout=60).json()
        assert again["tokens"] == rec["completion_ids"]
