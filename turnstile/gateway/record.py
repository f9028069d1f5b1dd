"""The fields of a call record that every recording mode fills the same way.

Token-in and engine-rendered capture know different things about a call (a renderer's seam
and parse status; a capture's drift report and added fields) but describe the engine, the
sampling, the weight versions, usage and timings alike: :func:`call_info` builds that part of
``CallRecord.info`` once, and each mode adds its own fields.
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable

from ..engines.base import token_versions
from ..errors import APIError
from ..store import database
from ..store.records import CallRecord
from ..store.store import Store
from ..store.writes import CallWrite, SessionGone, SessionWrite

# What a failed commit raises: the harness gets a clean 503/507/404 (store_error), never a 500.
STORE_ERRORS: tuple[type[Exception], ...] = (*database.ERRORS, OSError, SessionGone)


def store_error(exc: BaseException, session_id: str) -> APIError:
    """A record that could not be committed, as the harness sees it: nothing was
    acknowledged, the call did not enter the session's tree, and retrying is safe."""
    if isinstance(exc, SessionGone):
        return APIError(
            404,
            f"Session {session_id!r} was deleted while the call ran; nothing was recorded.",
            "session_id",
            code="session_not_found",
        )
    text = str(exc)
    if "full" in text or "disk" in text or isinstance(exc, OSError):
        return APIError(
            507,
            f"The record store could not save the call ({text}); it was not "
            "recorded. Free space under --data and retry.",
            code="store_full",
            type_="server_error",
        )
    return APIError(
        503,
        f"The record store is busy ({text}); the call was not recorded. Retry it.",
        code="store_busy",
        type_="server_error",
    )


class _Writer:
    """One thread that runs a store's call writes in order and resolves each call's future on
    its loop. The store serialises its writes under one lock anyway, so a thread pool adds
    nothing but its hand-off: ``run_in_executor`` (submit, work item, wrapped future) cost
    ~35 us of CPU per write against ~17 us here (a round trip measured on uvloop).

    Group commit: the writes that queued up while one was committing go to the store
    together (``Store.write``: one transaction, one sync), and each future is resolved
    only after that commit, so the promise (an answered call is on disk) is unchanged. One
    call alone is written as before. The thread ends after a few idle seconds and is started
    again by the next write; at exit the writes already handed to it are finished first."""

    IDLE_S = 5.0
    BATCH = 64  # calls per transaction at most

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._thread: threading.Thread | None = None

    def submit(
        self, loop: asyncio.AbstractEventLoop, store: Store, write: CallWrite | SessionWrite
    ) -> asyncio.Future:
        fut = loop.create_future()
        self._q.put((store, loop, fut, write))
        with self._lock:
            if not self._running:
                self._running = True
                self._thread = threading.Thread(
                    target=self._run, name="turnstile-store", daemon=True
                )
                self._thread.start()
        return fut

    def drain(self) -> None:
        """Finish the writes handed over so far, then end the thread."""
        with self._lock:
            thread = self._thread if self._running else None
            if thread is not None:
                self._q.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=self.IDLE_S)
            except queue.Empty:
                item = None
            if item is None:  # idle, or drained
                with self._lock:
                    if self._q.empty():
                        self._running = False
                        return
                continue
            self._write(self._take(item))
            item = None  # hold nothing (the store) while idle

    def _take(self, first: tuple) -> list:
        """``first`` and the writes queued behind it (a batch)."""
        batch = [first]
        while len(batch) < self.BATCH:
            try:
                more = self._q.get_nowait()
            except queue.Empty:
                break
            if more is None:  # a drain: handled once this batch is written
                self._q.put(None)
                break
            batch.append(more)
        return batch

    @staticmethod
    def _write(batch: list) -> None:
        store = batch[0][0]
        try:
            errors = store.write([write for *_, write in batch])
        except BaseException as e:  # noqa: BLE001 - the transaction failed: every call's answer
            errors = [e] * len(batch)
        settled: dict[asyncio.AbstractEventLoop, list] = {}
        for (_, loop, fut, _), exc in zip(batch, errors, strict=True):
            settled.setdefault(loop, []).append((fut, exc))
        for loop, futs in settled.items():
            try:
                loop.call_soon_threadsafe(_settle, futs)
            except RuntimeError:  # the loop is closed: nobody waits for these writes
                pass


def _settle(futs: list[tuple[asyncio.Future, BaseException | None]]) -> None:
    for fut, exc in futs:
        if fut.cancelled():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(None)


_writers: weakref.WeakKeyDictionary[Store, _Writer] = weakref.WeakKeyDictionary()
_writers_lock = threading.Lock()


@atexit.register
def _drain_all() -> None:
    for w in list(_writers.values()):
        w.drain()


def _writer(store: Store) -> _Writer:
    w = _writers.get(store)
    if w is None:
        with _writers_lock:
            w = _writers.get(store)
            if w is None:
                w = _writers[store] = _Writer()
    return w


def commit(
    store: Store,
    rec: CallRecord,
    request_body: object = None,
    response_body: object = None,
    session_created: float | None = None,
    then: Callable[[], object] | None = None,
) -> asyncio.Future:
    """Write ``rec`` off the event loop (a locked store waits there, not in the loop). ``then``
    runs on the loop once the row is committed: the in-memory tree follows the store, never
    leads it. A failed write of a call nobody waits for is reported on stderr."""
    fut = _writer(store).submit(
        asyncio.get_running_loop(),
        store,
        CallWrite(rec, request_body, response_body, session_created),
    )

    def done(f: asyncio.Future) -> None:
        if f.cancelled():
            return
        exc = f.exception()
        if exc is None:
            if then is not None:
                then()
        elif rec.status != "ok":
            print(
                f"turnstile: call {rec.id} ({rec.status}) of session {rec.session_id} was "
                f"not recorded: {exc}",
                file=sys.stderr,
            )

    fut.add_done_callback(done)
    return fut


async def create_session(
    store: Store,
    metadata: dict,
    session_id: str | None = None,
    *,
    group_id: str | None = None,
    sample_index: int | None = None,
    task_id: str | None = None,
) -> str:
    """Create a session (idempotent on its id) through the store's writer, with the writes
    queued beside it: a locked store or a slow sync waits there, not on the event loop."""
    w = store.session_write(
        metadata, session_id, group_id=group_id, sample_index=sample_index, task_id=task_id
    )
    fut = _writer(store).submit(asyncio.get_running_loop(), store, w)
    await committed(fut, w.session_id)
    return w.session_id


async def committed(fut: asyncio.Future, session_id: str) -> None:
    """Wait for a commit (a cancellation lets it finish); store failures as the harness's
    error."""
    try:
        await asyncio.shield(fut)
    except STORE_ERRORS as exc:
        raise store_error(exc, session_id) from exc


def weight_version(spans: list[dict] | None, n: int, whole: object, policy: str | None) -> object:
    """The version a call ran under: per sampled token when the engine reported spans, else
    the engine's one version, else the policy version the trainer declared."""
    return token_versions(spans, n) or (whole if whole is not None else policy)


def call_info(
    *,
    model: str,
    engine: str,
    fingerprint: str | None,
    segment_detail: str | None,
    sampling: dict,
    logprob_kind: str | None,
    logprob_warning: str | None,
    engine_request_id: str | None,
    weight_versions: list[dict] | None,
    version: object,
    policy_version: str | None,
    stop_string: str | None,
    usage: dict,
    started: float,
    timings: dict | None = None,
    dialect: str = "chat",
) -> dict:
    """The shared part of a call record's ``info``; ``usage`` holds at least
    ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens``; ``dialect`` is the wire
    dialect the harness spoke (the record is the same whichever it was)."""
    return {
        "dialect": dialect,
        "model": model,
        "engine": engine,
        "fingerprint": fingerprint,
        "segment_detail": segment_detail,
        "sampling": sampling,
        "logprob_kind": logprob_kind,
        "logprob_warning": logprob_warning,
        "engine_request_id": engine_request_id,
        "weight_version": version,
        "policy_version": policy_version,
        "weight_versions": weight_versions,
        "stop_string": stop_string,
        "usage": usage,
        "timings": {"started": started, "latency_s": time.time() - started, **(timings or {})},
    }
