"""What the engine fakes share besides the toy model: a request recorder, and a Starlette app
served by uvicorn on a free loopback port in a background thread (``FakeServer``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request

from .ports import free_port
from .toy_model import Generation


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


SSE_DONE = b"data: [DONE]\n\n"  # the OpenAI-style stream's end, as every engine fake sends it


def sse(payload: bytes) -> bytes:
    """One server-sent event holding ``payload`` (the fakes' streams are ``data:`` events)."""
    return b"data: " + payload + b"\n\n"
