"""What the engine fakes share: a deterministic toy model, a request recorder, and a Starlette
app served by uvicorn on a free loopback port in a background thread.

The toy model is the "truth" of a fake: every token it sends is generated here, with the
logprobs and top-k alternatives of the distribution the fake's engine would report, and kept
in ``Recorder.sent`` so a test compares an adapter's events with what the fake really sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request

VOCAB = 96
EOS = 95  # the model's own end-of-sequence token
IM_END = 94  # a chat template's end-of-turn token (a stop token only when the request says so)


def token_text(tid: int) -> str:
    return f"<{tid}>"


@dataclass
class Step:
    """One sampled token as a fake engine reports it."""

    token_id: int
    logprob: float  # in the fake's logprob mode
    rank: int  # 1-based, in that distribution
    top: list[tuple[int, float]]  # best first, len = the requested k
    version: str = "default"


@dataclass
class Generation:
    steps: list[Step]
    reason: str  # "stop" | "length" | "abort"
    stop_token: int | None = None
    stop_string: str | None = None

    @property
    def ids(self) -> list[int]:
        return [s.token_id for s in self.steps]


def _logits(context: list[int]) -> list[float]:
    """Deterministic pseudo-logits for the next token; EOS is unlikely unless biased."""
    rng = random.Random(hash((tuple(context[-2:]), len(context))) & 0xFFFFFFFF)
    out = [rng.gauss(0.0, 2.0) for _ in range(VOCAB)]
    out[EOS] -= 6.0
    out[IM_END] -= 3.0
    return out


def _log_softmax(xs: list[float]) -> list[float]:
    finite = [x for x in xs if x != -math.inf]
    m = max(finite)
    s = math.log(sum(math.exp(x - m) for x in finite))
    return [x - m - s if x != -math.inf else -math.inf for x in xs]


class ToyModel:
    """Samples like an engine: logit bias, temperature, top-p; seeded per request."""

    def __init__(self, logprob_mode: str = "raw_logprobs"):
        # raw_logprobs | processed_logprobs | scaled_logprobs (SGLang) | raw_logits
        self.logprob_mode = logprob_mode

    def step(
        self,
        context: list[int],
        temperature: float,
        top_p: float,
        logit_bias: dict[int, float],
        rng: random.Random,
        k: int,
    ) -> Step:
        raw = _logits(context)
        biased = [x + logit_bias.get(i, 0.0) for i, x in enumerate(raw)]
        greedy = temperature == 0
        scaled = biased if greedy else [x / temperature for x in biased]
        lp = _log_softmax(scaled)
        order = sorted(range(VOCAB), key=lambda i: -lp[i])
        keep = set(order)
        if top_p < 1.0 and not greedy:
            keep, acc = set(), 0.0
            for i in order:
                keep.add(i)
                acc += math.exp(lp[i])
                if acc >= top_p:
                    break
        processed = _log_softmax([lp[i] if i in keep else -math.inf for i in range(VOCAB)])
        if greedy:
            tid = order[0]
        else:
            r, acc, tid = rng.random(), 0.0, order[-1]
            for i in order:
                if i in keep:
                    acc += math.exp(processed[i])
                    if r < acc:
                        tid = i
                        break
        if self.logprob_mode == "processed_logprobs" and not greedy:
            report = processed
        elif self.logprob_mode == "scaled_logprobs" and not greedy:
            report = lp
        elif self.logprob_mode == "raw_logits":
            report = raw
        else:
            report = _log_softmax(raw)
        ranked = sorted(range(VOCAB), key=lambda i: -report[i])
        rank = ranked.index(tid) + 1
        top = [(i, report[i]) for i in ranked[:k]]
        return Step(tid, report[tid], rank, top)

    def generate(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        logit_bias: dict | None = None,
        ignore_eos: bool = False,
        k: int = 0,
        version: Callable[[int], str] = lambda i: "default",
    ) -> Generation:
        """The whole generation at once (streaming fakes replay it step by step)."""
        rng = random.Random(seed) if seed is not None else random.Random()
        bias = {int(t): float(v) for t, v in (logit_bias or {}).items()}
        stops = set(stop_token_ids or ())
        if not ignore_eos:
            stops.add(EOS)
        ctx, steps, text = list(prompt), [], ""
        for _ in range(max_tokens):
            s = self.step(ctx, temperature, top_p, bias, rng, k)
            s.version = version(len(steps))
            steps.append(s)
            ctx.append(s.token_id)
            if s.token_id in stops:
                return Generation(steps, "stop", stop_token=s.token_id)
            text += token_text(s.token_id)
            for st in stop or ():
                if st in text:
                    return Generation(steps, "stop", stop_string=st)
        return Generation(steps, "length")


@dataclass
class Received:
    path: str
    body: Any
    headers: dict


@dataclass
class Recorder:
    """What a fake received and did, for tests to compare against."""

    requests: list[Received] = field(default_factory=list)
    sent: dict[str, Generation] = field(default_factory=dict)  # by the engine's request id
    raw: dict[str, list[bytes]] = field(default_factory=dict)  # response bytes, per request id
    aborts: list[str] = field(default_factory=list)  # ids named by abort calls
    disconnects: list[str] = field(default_factory=list)  # requests whose client went away
    finished: list[str] = field(default_factory=list)  # requests that ran to the end

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.path == path]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """A Starlette app on 127.0.0.1 in a thread. Subclasses build ``routes()``."""

    def __init__(self) -> None:
        self.rec = Recorder()
        self.token_delay = 0.0  # seconds per token, to give a test time to cancel
        self.fail_next: int | None = None  # answer the next generation request with this status
        self.fail_mid_stream: int | None = None  # ... or fail its stream after the first token
        self.weight_version = "default"
        self.version_from: dict[int, str] = {}  # output index -> version label from there on
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._aborted: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self) -> list:  # pragma: no cover
        raise NotImplementedError

    def start(self) -> FakeServer:
        app = Starlette(routes=self.routes())
        self.port = free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake engine did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            import json

            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.rec.requests.append(Received(request.url.path, body, dict(request.headers)))
        return body

    def abort(self, ids: list[str]) -> None:
        self.rec.aborts.extend(ids)
        self._aborted.update(ids)

    def is_aborted(self, rid: str) -> bool:
        return rid in self._aborted

    async def until_disconnect_or(
        self, request: Request, rid: str, work: Coroutine[Any, Any, Any]
    ) -> Any:
        """Run ``work``; if the client goes away first, record it and cancel the work (what
        vLLM's ``with_cancellation`` and SGLang's disconnect polling do)."""
        task = asyncio.ensure_future(work)

        async def disconnected() -> None:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    return

        watch = asyncio.ensure_future(disconnected())
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            watch.cancel()
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        self.rec.disconnects.append(rid)
        return None

    def version_of(self, index: int) -> str:
        """The weights that sampled output token ``index`` (a mid-generation update)."""
        label = self.weight_version
        for start, v in sorted(self.version_from.items()):
            if index >= start:
                label = v
        return label

    @staticmethod
    def spans(gen: Generation) -> list[dict]:
        """Contiguous ``{version, start, end}`` spans over the output tokens."""
        out: list[dict] = []
        for i, s in enumerate(gen.steps):
            if out and out[-1]["version"] == s.version:
                out[-1]["end"] = i + 1
            else:
                out.append({"version": s.version, "start": i, "end": i + 1})
        return out

    async def pace(self, rid: str) -> bool:
        """Wait one token's time; False once the request was aborted."""
        if self.token_delay:
            await asyncio.sleep(self.token_delay)
        return not self.is_aborted(rid)
