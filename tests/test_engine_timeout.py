"""``turnstile serve --engine-timeout SECONDS``: an engine call that runs past it is a clean 504
to the harness (in-band when streamed), recorded as an error, and the engine is told to stop;
never a hang. Each engine kind runs against a fake that takes a minute per token, far past the
one-second timeout, so the timeout is the only way the call can end in the time allowed."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from turnstile.app.cli import build_parser
from turnstile.testing.fake_server import FakeServer
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.toy_model import ToyModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOKEN_DELAY = 60.0  # seconds per token: no answer comes before the timeout
TIMEOUT = 1.0  # --engine-timeout
WITHIN = 15.0  # the harness hears of it well before TOKEN_DELAY


class LlamaServerFake(FakeServer):
    """llama-server's ``/props`` and non-streamed ``/completion``, pacing each token by
    ``token_delay`` and stopping when the client goes away (as llama-server stops a task whose
    connection closed). Only what a timed-out call needs: the real server is tested elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.model = ToyModel()
        self._ids = itertools.count()

    def routes(self) -> list:
        return [
            Route("/props", self.props, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/completion", self.completion, methods=["POST"]),
        ]

    async def props(self, request: Request) -> Response:
        return JSONResponse(
            {"default_generation_settings": {"n_ctx": 4096}, "model_path": "fake.gguf"}
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def completion(self, request: Request) -> Response:
        body = await self.record(request)
        rid = f"llama-{next(self._ids)}"
        gen = self.model.generate(body["prompt"], max_tokens=body["n_predict"])
        self.rec.sent[rid] = gen

        async def work() -> None:
            for _ in gen.steps:
                await self.pace(rid)

        if await self.until_disconnect_or(request, rid, work()) is None:
            return Response(status_code=499)
        self.rec.finished.append(rid)
        return JSONResponse({"tokens": gen.ids, "stop_type": "limit", "timings": {}})


FAKES = {
    "llama-cpp": LlamaServerFake,
    "vllm": lambda: VLLMFake("0.33.0"),
    "sglang": lambda: SGLangFake(incremental=True),
}


@pytest.fixture(params=list(FAKES))
def stalled(request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeServer]]:
    fake = FAKES[request.param]()
    fake.token_delay = TOKEN_DELAY
    with fake:
        yield request.param, fake


def _serve(turnstile_factory, kind: str, fake: FakeServer, model: Path):
    return turnstile_factory(
        fake.url, model, extra=("--engine", kind, "--engine-timeout", f"{TIMEOUT:g}")
    )


def _engine_let_go(fake: FakeServer) -> bool:
    """The engine saw the call end: its connection dropped, or an abort naming it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if fake.rec.disconnects or fake.rec.aborts:
            return True
        time.sleep(0.05)
    return False


def _the_error_call(ts, session: dict) -> dict:
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["status"] for c in calls] == ["error"]
    assert "within 1 s" in calls[0]["error"]
    return calls[0]


def test_a_call_past_the_engine_timeout_is_a_504(stalled, tiny_qwen2, turnstile_factory):
    kind, fake = stalled
    ts = _serve(turnstile_factory, kind, fake, tiny_qwen2)
    session = ts.session()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    started = time.monotonic()
    r = httpx.post(session["base_url"] + "/chat/completions", json=body, timeout=60)
    took = time.monotonic() - started
    assert r.status_code == 504, r.text
    err = r.json()["error"]
    assert err["type"] == "engine_error" and "engine timeout" in err["message"]
    assert TIMEOUT <= took < WITHIN, took
    assert not fake.rec.finished  # the engine never got to answer
    _the_error_call(ts, session)
    assert _engine_let_go(fake)


def test_a_streamed_call_past_the_engine_timeout_ends_in_band(
    stalled, tiny_qwen2, turnstile_factory
):
    kind, fake = stalled
    ts = _serve(turnstile_factory, kind, fake, tiny_qwen2)
    session = ts.session()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    started = time.monotonic()
    with httpx.stream(
        "POST", session["base_url"] + "/chat/completions", json=body, timeout=60
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    took = time.monotonic() - started
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "engine_error" and "engine timeout" in err["message"]
    assert TIMEOUT <= took < WITHIN, took
    _the_error_call(ts, session)
    assert _engine_let_go(fake)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon"])
def test_the_engine_timeout_is_a_positive_number_of_seconds(value, capsys):
    argv = ["serve", "--engine-url", "http://x", "--model", "m", "--engine-timeout", value]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "positive number of seconds" in capsys.readouterr().err
    assert build_parser().parse_args(argv[:-1] + ["2.5"]).engine_timeout == 2.5


def test_the_engine_timeout_reaches_every_adapter():
    from turnstile.app.wiring import build_engine, engine_options

    argv = ["serve", "--engine-url", "http://x", "--model", "m", "--engine-timeout", "7"]
    for kind in FAKES:
        args = build_parser().parse_args([*argv, "--engine", kind])
        engine = build_engine(kind, "http://x", engine_options(args))
        assert engine._timeout.total == 7.0


def test_the_connect_timeout_is_long_by_default_and_reaches_every_adapter():
    """A starved engine may accept a connection seconds late: the default waits (the old 5 s
    failed such calls with a 502); the flag reaches every adapter, bounded by the call's."""
    from turnstile.app.wiring import build_engine, engine_options
    from turnstile.engines.http import CONNECT_TIMEOUT_S

    argv = ["serve", "--engine-url", "http://x", "--model", "m"]
    assert CONNECT_TIMEOUT_S >= 30
    for kind in FAKES:
        for extra, want in (
            ([], CONNECT_TIMEOUT_S),
            (["--engine-connect-timeout", "12"], 12.0),
            (["--engine-connect-timeout", "90", "--engine-timeout", "7"], 7.0),
        ):
            args = build_parser().parse_args([*argv, "--engine", kind, *extra])
            engine = build_engine(kind, "http://x", engine_options(args))
            assert engine._timeout.sock_connect == want, (kind, extra)


def test_a_retry_after_a_timeout_is_a_sibling_of_the_failed_call(tiny_qwen2, turnstile_factory):
    """A harness retries a call that timed out (the openai client does by default): the retry
    extends the same recorded call the failed one did, a sibling in the tree, not a new
    segment."""
    fake = VLLMFake("0.33.0")
    with fake:
        ts = _serve(turnstile_factory, "vllm", fake, tiny_qwen2)
        session = ts.session()
        url = session["base_url"] + "/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        first = httpx.post(url, json={"messages": msgs, "max_tokens": 3}, timeout=60).json()
        msgs += [first["choices"][0]["message"], {"role": "user", "content": "more"}]
        body = {"messages": msgs, "max_tokens": 3}
        fake.token_delay = TOKEN_DELAY
        assert httpx.post(url, json=body, timeout=60).status_code == 504
        fake.token_delay = 0.0
        assert httpx.post(url, json=body, timeout=60).status_code == 200
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["status"] for c in calls] == ["ok", "error", "ok"]
    assert calls[1]["parent_id"] == calls[2]["parent_id"] == calls[0]["id"]
    assert calls[2]["segment_reason"] is None
