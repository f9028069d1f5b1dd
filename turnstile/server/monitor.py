"""The live mismatch monitor (``serve --verify-fraction F``): a random fraction of the calls
recorded is scored again by the engine in the background (``turnstile.verify``), and the
agreement is exported per weight version, so a stale weight sync, a logprob mode that is not
the sampling distribution, or a batch-variant kernel shows while training runs.

It never touches a harness's call: the store's writer thread hands it committed records, it
keeps at most ``capacity`` of them waiting (more are dropped, and counted), and one task on the
event loop scores them one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram

from ..store.contracts import CallReader
from ..store.records import CallRecord
from ..store.trajectories import stitch
from ..verify import BF16_TOLERANCE, NotSupported, Scorer, scorer, verify
from ..verify.routing import DIAGNOSES, ROUTING_AGREE

log = logging.getLogger("turnstile.monitor")

# |Δ logprob| of the worst token of a call: exact records sit at 0 (or the engine's noise)
_DELTA = (0.0, 1e-6, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, float("inf"))
# share of a call's (token, layer) routing rows whose expert set the re-feed agrees with:
# exact records at 1 (less only a real engine's ties), other weights near chance
_SHARE = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)


@dataclass(frozen=True)
class Threshold:
    """A verified call parts when its worst token's |Δ logprob| passes ``max_abs`` (a broken
    token) or its mean |Δ| passes ``mean_abs`` (a drift over every token: other weights).
    The defaults pass a healthy bf16 engine and fail the broken records measured in
    tests/test_verify_vllm.py (figures in docs/verification.md)."""

    max_abs: float = BF16_TOLERANCE
    mean_abs: float = 0.05


DEFAULT_THRESHOLD = Threshold()


@dataclass(frozen=True)
class VerifyOptions:
    """``serve --verify-fraction F [--verify-engine-url URL] [--verify-threshold T]``."""

    fraction: float
    engine: str  # the engine kind: "llama-cpp", "vllm", "sglang"
    url: str | None = None  # None: the replica that served each call
    threshold: float | None = None  # the max |Δ| threshold (None: DEFAULT_THRESHOLD's)


class Monitor:
    """Scores a sample of committed calls; its series go into the gateway's registry. ``url``:
    the engine that scores (None: the replica that served each call)."""

    def __init__(
        self,
        store: CallReader,
        kind: str,
        url: str | None,
        fraction: float,
        registry: CollectorRegistry,
        replica: str,
        threshold: float | None = None,
        capacity: int = 64,
        rng: Callable[[], float] = random.random,
    ):
        self.store, self.kind, self.url = store, kind, url
        self.threshold = Threshold(
            DEFAULT_THRESHOLD.max_abs if threshold is None else threshold,
            DEFAULT_THRESHOLD.mean_abs,
        )
        self.fraction, self.capacity = fraction, capacity
        self.rng, self.replica = rng, replica
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue[tuple[str, str, str]] | None = None
        self._task: asyncio.Task | None = None
        self._warned: set[str] = set()  # weight versions whose mismatch was logged
        labels = ["replica", "weight_version"]
        self.verified = Counter(
            "turnstile_verify_calls",
            "Calls scored again by the engine (--verify-fraction), by weight version",
            labels,
            registry=registry,
        )
        self.parted = Counter(
            "turnstile_verify_parted_calls",
            "Verified calls whose recorded logprobs the engine's recompute misses: the worst "
            f"token by more than {self.threshold.max_abs}, or all on average by more than "
            f"{self.threshold.mean_abs}",
            labels,
            registry=registry,
        )
        self.delta = Histogram(
            "turnstile_verify_max_abs_delta",
            "A verified call's largest |recorded - recomputed| logprob over its sampled tokens",
            labels,
            buckets=_DELTA,
            registry=registry,
        )
        self.routing = Histogram(
            "turnstile_verify_routing_agreement",
            "A verified call's share of (token, layer) routed-expert rows whose expert set the "
            "engine's re-feed agrees with (calls recorded with routing, on an engine that "
            "re-feeds it)",
            labels,
            buckets=_SHARE,
            registry=registry,
        )
        self.routing_parted = Counter(
            "turnstile_verify_routing_parted_calls",
            f"Verified calls whose routing agrees on fewer than {ROUTING_AGREE} of their rows",
            labels,
            registry=registry,
        )
        self.diagnosed = Counter(
            "turnstile_verify_diagnosis",
            "Verified calls by what logprobs and routing together say: "
            + ", ".join(DIAGNOSES)
            + " (docs/verification.md)",
            [*labels, "diagnosis"],
            registry=registry,
        )
        self.dropped = Counter(
            "turnstile_verify_dropped_calls",
            "Calls picked for verification but dropped: the queue was full (queue_full), the "
            "engine could not be asked (engine), the call's sampling cannot be recomputed "
            "(refused: e.g. a grammar), or the top N could not bound any token (undecided)",
            ["replica", "why"],
            registry=registry,
        )

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue(self.capacity)
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def committed(self, rec: CallRecord, write_seconds: float) -> None:
        """A record was committed (the store's writer thread): pick it with the fraction."""
        url = self.url or rec.info.get("engine_url")
        if rec.status != "ok" or not url or self.loop is None or self.rng() >= self.fraction:
            return
        self.loop.call_soon_threadsafe(self._enqueue, rec.session_id, rec.id, url)

    def _enqueue(self, session_id: str, call_id: str, url: str) -> None:
        assert self.queue is not None
        try:
            self.queue.put_nowait((session_id, call_id, url))
        except asyncio.QueueFull:
            self.dropped.labels(self.replica, "queue_full").inc()

    async def _run(self) -> None:
        assert self.queue is not None
        async with httpx.AsyncClient(timeout=300) as client:
            engines: dict[str, Scorer] = {}
            while True:
                session_id, call_id, url = await self.queue.get()
                try:
                    engine = engines.get(url) or engines.setdefault(
                        url, scorer(self.kind, client, url)
                    )
                    await self._check(engine, session_id, call_id)
                except (NotSupported, httpx.HTTPError, KeyError, ValueError) as exc:
                    self.dropped.labels(self.replica, "engine").inc()
                    log.warning("verify: call %s not scored: %r", call_id, exc)

    async def _check(self, engine: Scorer, session_id: str, call_id: str) -> None:
        calls = await asyncio.to_thread(self.store.calls, session_id)
        traj = next((t for t in stitch(calls, "per_call") if t.call_ids[-1] == call_id), None)
        if traj is None:  # the session was deleted meanwhile
            return
        report = await verify(traj, engine, None, {c.id: c for c in calls if c.id == call_id})
        version = ",".join(report.versions) or "none"
        agreement = report.exact
        if not agreement.tokens:
            if agreement.refused or agreement.undecided:
                why = "refused" if agreement.refused else "undecided"
                self.dropped.labels(self.replica, why).inc()
                log.warning("verify: call %s not scored: %s", call_id, "; ".join(report.notes))
            return
        self.verified.labels(self.replica, version).inc()
        self.delta.labels(self.replica, version).observe(agreement.max_abs)
        self.diagnosed.labels(self.replica, version, report.diagnosis).inc()
        routed = report.routing
        if routed is not None and routed.rows:
            self.routing.labels(self.replica, version).observe(routed.share)
            if routed.share < ROUTING_AGREE:
                self.routing_parted.labels(self.replica, version).inc()
                log.warning(
                    "verify: call %s (weights %s) routing agrees on %d of %d rows (first "
                    "differing: token %s, layer %s); diagnosis %s",
                    call_id,
                    version,
                    routed.agree,
                    routed.rows,
                    routed.first_disagreement,
                    routed.first_layer,
                    report.diagnosis,
                )
        if (
            agreement.max_abs > self.threshold.max_abs
            or agreement.mean_abs > self.threshold.mean_abs
        ):
            self.parted.labels(self.replica, version).inc()
            if version not in self._warned:
                self._warned.add(version)
                log.warning(
                    "verify: call %s (weights %s) parts from the engine's recompute: max |Δ "
                    "logprob| %.4g, mean %.4g over %d tokens (thresholds %g, %g); logged once "
                    "per version",
                    call_id,
                    version,
                    agreement.max_abs,
                    agreement.mean_abs,
                    agreement.tokens,
                    self.threshold.max_abs,
                    self.threshold.mean_abs,
                )
