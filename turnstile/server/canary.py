"""The drift canary (``serve --canary-fraction F``): would a text pipeline have trained on other
token IDs than the ones recorded, and where?

A chat-level pipeline keeps the harness's messages and, to train, renders them through the chat
template and encodes the text again (``verify.rerendered``). The engine saw something else: the
tokens it sampled, reused verbatim in every later prompt. For a sampled fraction of the calls
recorded, the canary renders the request's messages the way such a pipeline would, compares the
IDs with the recorded prompt, and names the part of the conversation holding the first token
that differs: a sampled turn's tool call, its reasoning, the stop/end-of-turn seam, whitespace,
or other. Counts go to ``/metrics``, to the session summary (``canary``) and to the viewer's
session list, so users can see what exact token IDs buy on their own traffic.

Like the live verify monitor (``server/monitor.py``) it never touches a harness's call: the
store's writer thread hands it committed records with their request bodies, at most
``capacity`` wait (more are dropped, and counted), and one thread of its own checks them.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from ..chat.render import Renderer
from ..dialects.chat.request import parse_chat_request
from ..errors import APIError
from ..store.records import CallRecord
from ..store.store import Store
from .metrics import Metrics

log = logging.getLogger("turnstile.canary")

#: Where the first differing token lies, in the order they are tested.
LOCATIONS = ("stop", "tool_call", "reasoning", "whitespace", "other")

_CPU = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)
_CLOSE = re.compile(r"\s*</[^<>\s]{1,32}>")  # a reasoning block's closing tag
_SESSIONS_KEPT = 100_000  # per-session tallies kept in memory (oldest forgotten first)


@dataclass(frozen=True)
class Turn:
    """A sampled completion inside a recorded prompt: its token span ``[start, end)``, the call
    that sampled it, and what the parser made of it (the message the harness got back)."""

    start: int
    end: int
    call_id: str
    message: dict | None
    stop_token_id: int | None = None
    stop_string: str | None = None


@dataclass(frozen=True)
class Drift:
    """The first token where the text pipeline's IDs part from the recorded ones."""

    where: str  # one of LOCATIONS
    position: int  # index in the recorded prompt
    in_call: str | None  # the call whose sampled completion holds it (None: a rendered part)
    recorded: str  # the recorded token's text ('' past the end)
    text_pipeline: str  # the text pipeline's token there


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is a
    prefix of the other), or None when they are equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def _overlaps(c0: int, c1: int, r0: int, r1: int) -> bool:
    return r0 < r1 and c0 < r1 and max(c1, c0 + 1) > r0


def _regions(text: str, body_end: int, turn: Turn) -> dict[str, tuple[int, int]]:
    """Character spans of a completion's text: the stop (its stop token or string), its
    reasoning (from the start through the closing tag), its tool calls (from the first
    character after its content and reasoning, whitespace skipped, to the stop)."""
    m = turn.message or {}
    out: dict[str, tuple[int, int]] = {"stop": (body_end, len(text))}
    after = 0
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if isinstance(reasoning, str) and reasoning.strip():
        at = text.find(reasoning.strip())
        if at >= 0:
            after = at + len(reasoning.strip())
            close = _CLOSE.match(text, after)
            after = close.end() if close else after
            out["reasoning"] = (0, after)
    if m.get("tool_calls"):
        content = m.get("content")
        if isinstance(content, str) and content.strip():
            at = text.find(content.strip(), after)
            if at >= 0:
                after = at + len(content.strip())
        while after < body_end and text[after].isspace():
            after += 1
        out["tool_call"] = (after, body_end)
    return out


def _blank(got: str, want: str) -> bool:
    """Either token is only whitespace, or they differ only by whitespace past a shared start
    (``".\n"`` against ``".\n\n"``)."""
    if any(p != "" and p.strip() == "" for p in (got, want)):
        return True
    k = len(os.path.commonprefix([got, want]))
    rest = got[k:] + want[k:]
    return rest != "" and rest.strip() == ""


def locate(
    recorded: Sequence[int],
    text_ids: Sequence[int],
    turns: Sequence[Turn],
    decode: Callable[[Sequence[int]], str],
) -> Drift | None:
    """Where ``text_ids`` (the text pipeline's) first part from ``recorded`` (the prompt the
    engine was sent), mapped to the part of the conversation it lies in; None when equal.

    In a sampled turn: its stop (the stop token, or a stop string the harness never sees), its
    tool calls, its reasoning, whitespace (either side's token is only whitespace, or the two
    differ only by whitespace after a shared start), else other.
    In what Turnstile rendered: the first token after a sampled turn is the end-of-turn seam
    (stop) unless it is whitespace; anything else there is whitespace or other."""
    p = first_difference(recorded, text_ids)
    if p is None:
        return None
    got = decode([recorded[p]]) if p < len(recorded) else ""
    want = decode([text_ids[p]]) if p < len(text_ids) else ""
    blank = _blank(got, want)
    for turn in turns:
        if turn.start <= p < turn.end:
            ids = recorded[turn.start : turn.end]
            i = p - turn.start
            text = decode(ids)
            c0, c1 = len(decode(ids[:i])), len(decode(ids[: i + 1]))
            body = (
                ids[:-1]
                if turn.stop_token_id is not None and ids[-1] == turn.stop_token_id
                else ids
            )
            body_end = len(decode(body)) if len(body) < len(ids) else len(text)
            stop = turn.stop_string
            if stop and text[:body_end].endswith(stop):
                body_end -= len(stop)
            regions = _regions(text, body_end, turn)
            where = next(
                (
                    k
                    for k in ("stop", "tool_call", "reasoning")
                    if k in regions and _overlaps(c0, c1, *regions[k])
                ),
                "whitespace" if blank else "other",
            )
            return Drift(where, p, turn.call_id, got, want)
    seam = any(p == t.end for t in turns)
    where = "whitespace" if blank else "stop" if seam else "other"
    return Drift(where, p, None, got, want)


def recorded_prompt(rec: CallRecord, calls: Sequence[CallRecord]) -> tuple[list[int], list[Turn]]:
    """The prompt ``rec`` sent (its ancestors' deltas and completions, then its own delta, as
    ``store.trajectories`` stitches them) and the sampled turns inside it."""
    by_id = {c.id: c for c in calls if c.status == "ok"}
    path: list[CallRecord] = []
    parent = rec.parent_id
    while parent is not None and parent in by_id:
        path.append(by_id[parent])
        parent = by_id[parent].parent_id
    path.reverse()
    ids: list[int] = []
    turns: list[Turn] = []
    for c in path:
        ids += c.prompt_delta
        start = len(ids)
        ids += c.completion_ids
        turns.append(
            Turn(start, len(ids), c.id, c.message, c.stop_token_id, c.info.get("stop_string"))
        )
    ids += rec.prompt_delta
    return ids, turns


@dataclass
class SessionDrift:
    """One session's tally: calls checked, how many drifted, where, and the first drift."""

    checked: int = 0
    drifted: int = 0
    where: dict[str, int] = field(default_factory=dict)
    first: dict | None = None  # the first drifted call: its id and the Drift's fields

    def to_json(self) -> dict:
        return {
            "checked": self.checked,
            "clean": self.checked - self.drifted,
            "drifted": self.drifted,
            "where": dict(self.where),
            "first_drift": self.first,
        }


@dataclass(frozen=True)
class Checked:
    """One call's verdict: None when the text pipeline's prompt IDs equal the recorded ones."""

    call_id: str
    session_id: str
    prompt_tokens: int
    drift: Drift | None


class Canary:
    """Checks a sampled fraction of committed token-in calls on a thread of its own; its series
    go into the gateway's registry, per-session tallies stay in memory (this process's)."""

    def __init__(
        self,
        store: Store,
        renderer: Renderer,
        fraction: float,
        registry: CollectorRegistry,
        replica: str,
        capacity: int = 64,
        rng: Callable[[], float] = random.random,
    ):
        self.store, self.renderer = store, renderer
        self.fraction, self.capacity, self.rng, self.replica = fraction, capacity, rng, replica
        self.queue: queue.Queue[tuple[CallRecord, object] | None] = queue.Queue(capacity)
        self.sessions: OrderedDict[str, SessionDrift] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.checks = Counter(
            "turnstile_canary_calls",
            "Calls whose request a text pipeline would render and encode again "
            "(--canary-fraction), by result: clean (the recorded prompt IDs) or drifted",
            ["replica", "result"],
            registry=registry,
        )
        self.drift = Counter(
            "turnstile_canary_drift_calls",
            "Drifted calls by where the first differing token lies: stop, tool_call, "
            "reasoning, whitespace, other",
            ["replica", "where"],
            registry=registry,
        )
        self.session_count = Counter(
            "turnstile_canary_sessions",
            "Sessions with a checked call, by result: checked (each once), drifted (at its "
            "first drifted call)",
            ["replica", "result"],
            registry=registry,
        )
        self.dropped = Counter(
            "turnstile_canary_dropped_calls",
            "Calls picked for the canary but not checked: queue_full (it was busy), "
            "unreadable (no Chat Completions request to render)",
            ["replica", "why"],
            registry=registry,
        )
        self.cpu = Histogram(
            "turnstile_canary_cpu_seconds",
            "CPU time of one canary check (render, encode, compare), on its own thread",
            ["replica"],
            buckets=_CPU,
            registry=registry,
        )
        for result in ("clean", "drifted"):
            self.checks.labels(replica, result)
        for where in LOCATIONS:
            self.drift.labels(replica, where)
        for result in ("checked", "drifted"):
            self.session_count.labels(replica, result)
        _BY_STORE[store] = self

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="turnstile-canary", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            try:
                self.queue.put(None, timeout=timeout)
            except queue.Full:
                return
            self._thread.join(timeout)
            self._thread = None

    def committed(self, rec: CallRecord, request_body: object) -> None:
        """A record was committed (the store's writer thread): pick it with the fraction."""
        if rec.status != "ok" or self.rng() >= self.fraction:
            return
        try:
            self.queue.put_nowait((rec, request_body))
        except queue.Full:
            self.dropped.labels(self.replica, "queue_full").inc()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            rec, body = item
            began = time.thread_time()
            try:
                checked = self.check(rec, body)
            except (APIError, ValueError, TypeError, KeyError) as exc:
                self.dropped.labels(self.replica, "unreadable").inc()
                log.debug("canary: call %s not checked: %r", rec.id, exc)
                continue
            except Exception:  # a template that raises on its own input, ...: never fatal
                self.dropped.labels(self.replica, "unreadable").inc()
                log.exception("canary: call %s not checked", rec.id)
                continue
            self.cpu.labels(self.replica).observe(time.thread_time() - began)
            self.tally(checked)

    def check(self, rec: CallRecord, body: object) -> Checked:
        """The text pipeline's prompt for ``rec``'s request against the recorded one."""
        if rec.info.get("dialect", "chat") != "chat" or not isinstance(body, dict):
            raise ValueError("not a Chat Completions request")
        req = parse_chat_request(body)
        r = self.renderer
        text = r.render(req.messages, req.tools, add_generation_prompt=True, **req.template_kwargs)
        text_ids = r.tok.encode(text)
        ids, turns = recorded_prompt(rec, self.store.calls(rec.session_id))
        drift = locate(ids, text_ids, turns, r.tok.decode)
        return Checked(rec.id, rec.session_id, len(ids), drift)

    def tally(self, c: Checked) -> None:
        """Count a verdict: the series, and the session's tally."""
        result = "clean" if c.drift is None else "drifted"
        self.checks.labels(self.replica, result).inc()
        if c.drift is not None:
            self.drift.labels(self.replica, c.drift.where).inc()
        with self._lock:
            s = self.sessions.get(c.session_id)
            if s is None:
                s = self.sessions[c.session_id] = SessionDrift()
                self.session_count.labels(self.replica, "checked").inc()
                if len(self.sessions) > _SESSIONS_KEPT:
                    self.sessions.popitem(last=False)
            s.checked += 1
            if c.drift is not None:
                s.drifted += 1
                s.where[c.drift.where] = s.where.get(c.drift.where, 0) + 1
                if s.first is None:
                    s.first = {"call_id": c.call_id, **asdict(c.drift)}
                    self.session_count.labels(self.replica, "drifted").inc()

    def session(self, session_id: str) -> dict:
        """The session's tally as the session API shows it (zeros when none was checked)."""
        with self._lock:
            s = self.sessions.get(session_id)
            return (s or SessionDrift()).to_json()


_BY_STORE: weakref.WeakKeyDictionary[Store, Canary] = weakref.WeakKeyDictionary()


def canary_of(store: object) -> Canary | None:
    """The canary watching ``store`` (None: ``--canary-fraction`` is 0, or capture mode)."""
    return _BY_STORE.get(store) if isinstance(store, Store) else None


def attach(store: Store, renderer: Renderer, fraction: float, metrics: Metrics) -> Canary | None:
    """A canary on ``store``'s committed calls, its series in ``metrics``' registry, started
    (None when ``fraction`` is 0: nothing is computed)."""
    if fraction <= 0:
        return None
    canary = Canary(store, renderer, fraction, metrics.registry, metrics.replica)
    store.observe_requests(canary.committed)
    canary.start()
    return canary
