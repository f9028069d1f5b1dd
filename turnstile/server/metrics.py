"""Prometheus metrics of one gateway (``GET /metrics``), with the standard client library.

A fleet watches many gateways, so every series carries a ``replica`` label: the Ray Serve
replica id under Ray (``turnstile.app.ray`` passes it), else ``host:pid``. Two sources feed them:

- the **record store**: every committed call record (``Store.observers``), so the call,
  token and segment counts are exactly what was recorded (a call that was never committed was
  never acknowledged, and is not counted); its timings split a call's latency into engine
  time (``info.timings.engine_s``, the wall time spent waiting on the engine) and own time (the
  rest, before the store write), and the write is timed on its own;
- the **HTTP edge** (an ASGI middleware): calls in flight, calls by dialect (its ``name``;
  which paths are calls is read from the dialects' declared ``call`` routes), and every error
  answer by kind (the OpenAI error's ``code``, else its ``type``, else Google's ``status``),
  including errors a stream reports in-band after its 200 header (any dialect). Each error
  answer is also one log line (``server.error_log``).

Each app has its own registry (several gateways can live in one test process).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..dialects.base import Dialect
from ..errors import APIError
from ..store.records import CallRecord
from . import error_log

_SECONDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)
_OWN = (0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
_EMPTY = {499: "client_gone"}  # answers without a body


def call_suffixes(dialects: Iterable[type[Dialect]]) -> dict[str, str]:
    """How a call's path ends, per dialect: the text after each ``call`` route's last path
    parameter (``/chat/completions``, ``:generateContent``), so the middleware tells a call
    from its path with one ``endswith``, before any routing."""
    out: dict[str, str] = {}
    for dialect in dialects:
        for route in dialect.routes:
            if route.kind == "call":
                out[route.path.rsplit("}", 1)[-1]] = dialect.name
    return out


def default_replica() -> str:
    """The label of a gateway outside Ray: ``$TURNSTILE_REPLICA``, else ``host:pid``."""
    return os.environ.get("TURNSTILE_REPLICA") or f"{socket.gethostname()}:{os.getpid()}"


class Metrics:
    """The series of one gateway, labelled with its replica."""

    def __init__(self, replica: str | None = None):
        self.replica = replica or default_replica()
        self.registry = CollectorRegistry(auto_describe=True)
        r, reg = ["replica"], self.registry
        self.calls = Counter(
            "turnstile_calls",
            "Engine calls recorded, by record status (ok, error, aborted)",
            [*r, "status"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "turnstile_prompt_tokens", "Prompt tokens sent to the engine", r, registry=reg
        )
        self.reused_tokens = Counter(
            "turnstile_reused_prompt_tokens",
            "Prompt tokens reused from the session's recorded tokens (not re-rendered)",
            r,
            registry=reg,
        )
        self.sampled_tokens = Counter(
            "turnstile_sampled_tokens", "Tokens the engine sampled", r, registry=reg
        )
        self.new_segments = Counter(
            "turnstile_new_segments",
            "Calls that started a new segment, by reason",
            [*r, "reason"],
            registry=reg,
        )
        self.latency = Histogram(
            "turnstile_call_seconds",
            "A call's latency up to its store write",
            r,
            buckets=_SECONDS,
            registry=reg,
        )
        self.engine_time = Histogram(
            "turnstile_engine_seconds",
            "Wall time waiting on the engine, per call",
            r,
            buckets=_SECONDS,
            registry=reg,
        )
        self.own_time = Histogram(
            "turnstile_own_seconds",
            "A call's latency minus its engine time (render, parse, bookkeeping)",
            r,
            buckets=_OWN,
            registry=reg,
        )
        self.store_write = Histogram(
            "turnstile_store_write_seconds",
            "Committing one call record (lock wait included)",
            r,
            buckets=_SECONDS,
            registry=reg,
        )
        self.errors = Counter(
            "turnstile_errors",
            "Error answers, by HTTP status and kind (the error's code, else its type)",
            [*r, "status", "kind"],
            registry=reg,
        )
        self.in_flight = Gauge(
            "turnstile_in_flight", "Calls being answered (any dialect)", r, registry=reg
        )
        self.dialect_calls = Counter(
            "turnstile_dialect_calls",
            "Calls received, by the wire dialect the harness spoke",
            [*r, "dialect"],
            registry=reg,
        )
        for series in (
            self.prompt_tokens,
            self.reused_tokens,
            self.sampled_tokens,
            self.latency,
            self.engine_time,
            self.own_time,
            self.store_write,
            self.in_flight,
        ):
            series.labels(self.replica)  # present (at 0) from the first scrape
        # The replica's children, looked up once: ``labels()`` takes a lock and builds a key
        # on every use (~3 us each, eight per call).
        rep = self.replica
        self._prompt = self.prompt_tokens.labels(rep)
        self._reused = self.reused_tokens.labels(rep)
        self._sampled = self.sampled_tokens.labels(rep)
        self._latency = self.latency.labels(rep)
        self._engine = self.engine_time.labels(rep)
        self._own = self.own_time.labels(rep)
        self._write = self.store_write.labels(rep)
        self.flight = self.in_flight.labels(rep)
        self._calls: dict[str, Any] = {}  # by status

    def committed(self, rec: CallRecord, write_seconds: float) -> None:
        """A call record was committed (runs on the store's writer thread)."""
        calls = self._calls.get(rec.status)
        if calls is None:
            calls = self._calls[rec.status] = self.calls.labels(self.replica, rec.status)
        calls.inc()
        usage = rec.info.get("usage") or {}
        self._prompt.inc(int(usage.get("prompt_tokens") or 0))
        self._reused.inc(rec.reused_prefix_len)
        self._sampled.inc(len(rec.completion_ids))
        if rec.segment_reason:
            self.new_segments.labels(self.replica, rec.segment_reason).inc()
        timings = rec.info.get("timings") or {}
        latency = timings.get("latency_s")
        if latency is not None:
            self._latency.observe(latency)
            engine = timings.get("engine_s")
            if engine is not None:
                self._engine.observe(engine)
                self._own.observe(max(0.0, latency - engine))
        self._write.observe(write_seconds)

    def error(self, status: int, kind: str) -> None:
        self.errors.labels(self.replica, str(status), kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def error_kind(body: bytes) -> str:
    """The kind of an error answer: its OpenAI ``code``, else ``type``, else ``unknown``."""
    try:
        err = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    if not isinstance(err, dict):
        return "unknown"
    code = err.get("code")
    if isinstance(code, int):  # Google's shape: the HTTP status; its kind is ``status``
        code = None
    return str(code or err.get("type") or err.get("status") or "unknown")


class MetricsMiddleware:
    """Counts calls in flight (any dialect) and error answers, and logs each error answer (ASGI,
    so streams pass through untouched: an in-band error is the one the gateway's chunks
    raised, noted in the request's :class:`~.error_log.Answer`)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, calls: dict[str, str]):
        self.app = app
        self.metrics = metrics
        self.calls = calls  # call_suffixes of the served dialects
        self._suffixes = tuple(calls)
        self._counted = {
            name: metrics.dialect_calls.labels(metrics.replica, name) for name in calls.values()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        chat = scope["method"] == "POST" and path.endswith(self._suffixes)
        if chat:
            suffix = next(s for s in self._suffixes if path.endswith(s))
            self._counted[self.calls[suffix]].inc()
        state: dict[str, Any] = {"status": 200, "body": b""}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body":
                if state["status"] >= 400:
                    if len(state["body"]) < 4096:
                        state["body"] += message.get("body", b"")
                    if not message.get("more_body"):
                        kind = (
                            error_kind(state["body"])
                            if state["body"]
                            else _EMPTY.get(state["status"], "empty")
                        )
                        self.metrics.error(state["status"], kind)
                        error_log.answered(scope, answer, state["status"], kind)
                elif isinstance(answer.error, APIError) and not state.get("in_band"):
                    # the stream's chunks raised it: this part is the dialect's error event
                    state["in_band"] = True
                    err, kind = answer.error, answer.error.code or answer.error.type
                    self.metrics.error(state["status"], kind)
                    error_log.answered(scope, answer, err.status, kind, in_band=True)
            await send(message)

        if chat:
            self.metrics.flight.inc()
        answer, token = error_log.begin()
        try:
            await self.app(scope, receive, watch)
        finally:
            error_log.end(token)
            if chat:
                self.metrics.flight.dec()


async def metrics_route(request: Request) -> Response:
    """``GET /metrics``: the Prometheus text exposition of this gateway's series."""
    metrics: Metrics = request.app.state.metrics
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
