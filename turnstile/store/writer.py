"""A store's writer: one thread that commits the store's writes in order, grouped, and
resolves each write's future on the event loop that handed it over (``Store.queue``)."""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

from .writes import CallWrite, SessionWrite

Write = CallWrite | SessionWrite


class Writes(Protocol):
    def write(self, writes: Sequence[Write]) -> list[BaseException | None]:
        """The writes in one transaction, each in a savepoint: one error (or None) each."""
        ...


class Writer:
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

    def __init__(self, store: Writes) -> None:
        self._store = store
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._thread: threading.Thread | None = None
        _writers.add(self)

    def submit(self, write: Write) -> asyncio.Future:
        """The write's future on the running loop, resolved once it is committed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put((loop, fut, write))
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
        _no_wakeup_preemption()
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
            item = None  # hold nothing while idle

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

    def _write(self, batch: list) -> None:
        try:
            errors = self._store.write([write for *_, write in batch])
        except BaseException as e:  # noqa: BLE001 - the transaction failed: every call's answer
            errors = [e] * len(batch)
        settled: dict[asyncio.AbstractEventLoop, list] = {}
        for (loop, fut, _), exc in zip(batch, errors, strict=True):
            settled.setdefault(loop, []).append((fut, exc))
        for loop, futs in settled.items():
            try:
                loop.call_soon_threadsafe(_settle, futs)
            except RuntimeError:  # the loop is closed: nobody waits for these writes
                pass


def _no_wakeup_preemption() -> None:
    """This thread as SCHED_BATCH (Linux): woken by a submit, it no longer preempts the event
    loop's thread, which holds the GIL at that moment; it runs once the loop blocks (and
    drops the GIL). Under SCHED_OTHER each wake-up on a shared core cost the loop a context
    switch and a GIL hand-off: 5% of a call's CPU at concurrency 32 (benchmarks/README.md,
    round 12). Its share of the CPU is unchanged."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: as before
        pass


def _settle(futs: list[tuple[asyncio.Future, BaseException | None]]) -> None:
    for fut, exc in futs:
        if fut.cancelled():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(None)


# every live writer, finished at exit (the writes already handed over are committed first)
_writers: weakref.WeakSet[Writer] = weakref.WeakSet()


@atexit.register
def drain_all() -> None:
    """Commit every write handed to any writer so far (at exit; and by the server before a
    re-raised SIGTERM ends the process, which runs no ``atexit``)."""
    for w in list(_writers):
        w.drain()
