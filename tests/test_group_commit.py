"""Group commit: the calls that queue up while one is committing are written in one
transaction (``Store.write``), on SQLite and on PostgreSQL.

The truth each batch is checked against is the one-call-per-transaction path
(``Store.add_call``, what every other test of the store exercises): the same writes applied
one by one to a second store must give the same answers (which call failed, and how) and the
same contents. The writer thread is checked for the promise it keeps: a call's future
resolves only once its row can be read from another connection, and a transaction that fails
fails every call in it (none was written)."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
from array import array
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.server.errors import APIError
from turnstile.server.record import commit, committed
from turnstile.store.records import CallRecord
from turnstile.store.store import Store
from turnstile.store.writes import CallWrite

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


# A batch: each write names a session (maybe deleted, or deleted and re-created, since the
# call began), an id (maybe one already written, in this batch or before), tokens, bodies.
write = st.tuples(
    st.sampled_from(SIDS),
    st.integers(0, 5),  # call id: collisions on purpose
    st.lists(st.integers(0, 2**31 - 1), max_size=12),
    st.booleans(),  # bodies
    st.sampled_from(["live", "deleted", "recreated"]),
)
batches = st.lists(st.lists(write, min_size=1, max_size=8), min_size=1, max_size=3)


def _writes(store: Store, batch: list[tuple], base: int, born: dict) -> list[CallWrite]:
    out = []
    for i, (sid, cid, tokens, bodies, fate) in enumerate(batch):
        n = base + i
        created = born[sid]
        if fate == "deleted":
            created = -1.0  # an incarnation that no longer exists
        req = {"messages": [{"role": "user", "content": str(n)}]} if bodies else None
        rec = _record(n, sid, f"call{cid}", tokens)
        out.append(CallWrite(rec, req, {"id": n} if bodies else None, created))
    return out


def _contents(store: Store) -> dict:
    return {
        "calls": {s: [c.to_json() for c in store.calls(s)] for s in SIDS},
        "bodies": {f"call{i}": store.body(f"call{i}") for i in range(6)},
    }


def _check(location_a: str, location_b: str, plan: list[list[tuple]]) -> None:
    grouped, single = Store(location_a, keep_bodies=True), Store(location_b, keep_bodies=True)
    try:
        born = {}
        for s in SIDS:
            grouped.create_session({}, s)
            single.create_session({}, s)
            born[s] = (grouped.session_created(s), single.session_created(s))
        base = 0
        for batch in plan:
            ga = _writes(grouped, batch, base, {s: t[0] for s, t in born.items()})
            sa = _writes(single, batch, base, {s: t[1] for s, t in born.items()})
            got = [type(e).__name__ if e else None for e in grouped.write(ga)]
            want = []
            for w in sa:
                try:
                    single.add_call(w.record, w.request_body, w.response_body, w.session_created)
                    want.append(None)
                except Exception as exc:  # noqa: BLE001 - compared by type
                    want.append(type(exc).__name__)
            assert got == want, batch
            base += len(batch)
        assert _contents(grouped) == _contents(single)
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
