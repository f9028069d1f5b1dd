"""Group commit: the calls and new sessions that queue up while one is committing are written
in one transaction (``Store.write``), on SQLite and on PostgreSQL.

The truth each batch is checked against is the one-call-per-transaction path
(``Store.add_call``, what every other test of the store exercises): the same writes applied
one by one to a second store must give the same answers (which call failed, and how) and the
same contents. The writer thread is checked for the promise it keeps: a call's future
resolves only once its row can be read from another connection, and a transaction that fails
fails every call in it (none was written)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import threading
from array import array
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.errors import APIError
from turnstile.gateway.record import commit, committed
from turnstile.store.records import CallRecord
from turnstile.store.store import Store
from turnstile.store.writes import CallWrite, SessionWrite

pytestmark = pytest.mark.integration

SIDS = ["a", "b", "c"]


def _record(n: int, sid: str, call_id: str, tokens: list[int]) -> CallRecord:
    return CallRecord(
        id=call_id,
        session_id=sid,
        seq=n,
        parent_id=None,
        segment_reason="first_call",
        reused_prefix_len=0,
        prompt_delta=array("i", tokens),
        completion_ids=array("i", tokens[::-1]),
        completion_logprobs=array("f", [-0.25 * i for i in range(len(tokens))]),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        error=None,
        message={"role": "assistant", "content": str(n)},
        history_hash=bytes(8),
        prefix_hashes=[bytes(8)],
        info={"n": n},
        created=1000.0 + n,
    )


# A batch: calls and new sessions. A call names a session (one created before, one created in
# this batch or an earlier one, or one not created yet; maybe deleted since the call began),
# an id (maybe one already written, in this batch or before), tokens, bodies.
NEW = ["d", "e"]
call_write = st.tuples(
    st.just("call"),
    st.sampled_from(SIDS + NEW),
    st.integers(0, 5),  # call id: collisions on purpose
    st.lists(st.integers(0, 2**31 - 1), max_size=12),
    st.booleans(),  # bodies
    st.sampled_from(["live", "deleted"]),
)
session_write = st.tuples(st.just("session"), st.sampled_from(NEW))
batches = st.lists(
    st.lists(st.one_of(call_write, call_write, session_write), min_size=1, max_size=8),
    min_size=1,
    max_size=3,
)


def _writes(
    store: Store, batch: list[tuple], base: int, born: dict
) -> list[CallWrite | SessionWrite]:
    """The batch's writes for ``store``; ``born`` (session -> created) follows its sessions."""
    out: list[CallWrite | SessionWrite] = []
    for i, item in enumerate(batch):
        if item[0] == "session":
            w = store.session_write({"n": base + i}, item[1])
            born.setdefault(item[1], w.row[1])  # a second create of an id changes nothing
            out.append(w)
            continue
        _, sid, cid, tokens, bodies, fate = item
        n = base + i
        created = -1.0 if fate == "deleted" else born.get(sid, -1.0)
        req = {"messages": [{"role": "user", "content": str(n)}]} if bodies else None
        rec = _record(n, sid, f"call{cid}", tokens)
        out.append(CallWrite(rec, req, {"id": n} if bodies else None, created))
    return out


def _contents(store: Store) -> dict:
    return {
        "sessions": {
            s: (x or {}).get("metadata") for s in SIDS + NEW if (x := store.get_session(s))
        },
        "calls": {s: [c.to_json() for c in store.calls(s)] for s in SIDS + NEW},
        "bodies": {f"call{i}": store.body(f"call{i}") for i in range(6)},
    }


def _check(location_a: str, location_b: str, plan: list[list[tuple]]) -> None:
    grouped, single = Store(location_a, keep_bodies=True), Store(location_b, keep_bodies=True)
    try:
        born_g: dict = {}
        born_s: dict = {}
        for s in SIDS:
            grouped.create_session({}, s)
            single.create_session({}, s)
            born_g[s], born_s[s] = grouped.session_created(s), single.session_created(s)
        base = 0
        for batch in plan:
            ga = _writes(grouped, batch, base, born_g)
            got = [type(e).__name__ if e else None for e in grouped.write(ga)]
            want = []
            for w in _writes(single, batch, base, born_s):  # one at a time, as before
                try:
                    if isinstance(w, SessionWrite):  # create_session's own write, alone
                        (error,) = single.write([w])
                        if error is not None:
                            raise error
                    else:
                        single.add_call(
                            w.record, w.request_body, w.response_body, w.session_created
                        )
                    want.append(None)
                except Exception as exc:  # noqa: BLE001 - compared by type
                    want.append(type(exc).__name__)
            assert got == want, batch
            base += len(batch)
        assert _contents(grouped) == _contents(single)
        # and what the plan says, not only what the one-at-a-time path did
        first: dict = {}
        n = 0
        for batch in plan:
            for item in batch:
                if item[0] == "session":
                    first.setdefault(item[1], {"n": n})
                n += 1
        assert _contents(grouped)["sessions"] == {**dict.fromkeys(SIDS, {}), **first}
    finally:
        grouped.close()
        single.close()


SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(plan=batches)
def test_a_batch_on_sqlite_answers_as_one_call_at_a_time(plan: list[list[tuple]]) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        _check(a, b, plan)


@pytest.fixture(scope="module")
def pg_urls(postgres) -> tuple[str, str]:
    return postgres.database(), postgres.database()


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE sessions, calls, rewards, bodies RESTART IDENTITY CASCADE")


@SETTINGS
@given(plan=batches)
def test_a_batch_on_postgres_answers_as_one_call_at_a_time(
    pg_urls: tuple[str, str], plan: list[list[tuple]]
) -> None:
    for url in pg_urls:
        Store(url).close()  # the schema
        _reset(url)
    _check(*pg_urls, plan)


def test_the_writer_groups_and_acknowledges_only_committed_calls(tmp_path: Path) -> None:
    """Writes queued behind a slow commit go in one transaction; each future resolves only
    once another connection can read its row."""
    store = Store(tmp_path)
    sid = "s"
    store.create_session({}, sid)
    batches: list[int] = []
    real = store.write

    def counted(writes):  # noqa: ANN001, ANN202 - the real method, its batch sizes noted
        batches.append(len(writes))
        return real(writes)

    store.write = counted  # type: ignore[method-assign]
    reader = sqlite3.connect(tmp_path / Store.FILENAME)
    seen: list[bool] = []

    async def run() -> None:
        store._wlock.acquire()  # the first write waits here; the rest queue behind it
        futs = []
        for n in range(20):
            rec = _record(n, sid, f"call{n}", [n, n + 1])
            fut = commit(store, rec)
            fut.add_done_callback(
                lambda f, cid=rec.id: seen.append(
                    reader.execute("SELECT count(*) FROM calls WHERE id = ?", (cid,)).fetchone()
                    == (1,)
                )
            )
            futs.append(fut)
        await asyncio.sleep(0.2)
        threading.Timer(0.1, store._wlock.release).start()
        await asyncio.gather(*futs)

    asyncio.run(run())
    reader.close()
    assert seen == [True] * 20
    assert sum(batches) == 20 and len(batches) < 20 and max(batches) > 1, batches
    assert [c.id for c in store.calls(sid)] == [f"call{n}" for n in range(20)]
    store.close()


def test_a_failed_transaction_fails_every_call_in_it(tmp_path: Path) -> None:
    """The database locked by another process past the busy timeout: every call of the batch
    gets the store's 503, and none of them was written."""
    store = Store(tmp_path, busy_timeout=0.2)
    sid = "s"
    store.create_session({}, sid)
    other = sqlite3.connect(tmp_path / Store.FILENAME, isolation_level=None)

    async def run() -> list:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        store._wlock.acquire()
        futs = [commit(store, _record(n, sid, f"call{n}", [n])) for n in range(6)]
        await asyncio.sleep(0.1)
        store._wlock.release()
        return await asyncio.gather(*(committed(f, sid) for f in futs), return_exceptions=True)

    results = asyncio.run(run())
    other.execute("ROLLBACK")
    other.close()
    assert all(isinstance(r, APIError) and r.status == 503 for r in results), results
    assert store.calls(sid) == []
    store.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling classes")
def test_the_writer_thread_does_not_preempt_the_event_loop(tmp_path: Path) -> None:
    """The writer runs as SCHED_BATCH (no wake-up preemption of the loop's thread), read back
    from the kernel by the thread's id; the loop's own thread keeps its class."""
    store = Store(tmp_path)
    store.create_session({}, "s")

    async def run() -> None:
        await commit(store, _record(0, "s", "call0", [1, 2]))

    asyncio.run(run())
    thread = store._writer._thread
    assert thread is not None and thread.native_id is not None
    assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    store.close()
