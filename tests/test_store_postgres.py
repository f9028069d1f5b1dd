"""The PostgreSQL record store against a real PostgreSQL server (Debian's package, started by
the suite): generated sequences of store operations give the same answers as the SQLite store
(the reference every other test checks), token IDs and logprobs come back bit for bit, an
export of each is the same table, and a restarted database is a retryable error, not a lost
record."""

from __future__ import annotations

import math
import tempfile
from array import array
from pathlib import Path

import orjson
import psycopg
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from turnstile.store.export import export
from turnstile.store.records import CallRecord
from turnstile.store.store import Store, UnstorableText
from turnstile.store.writes import SessionGone
from turnstile.viewer.summaries import summaries

pytestmark = pytest.mark.heavy

SIDS = [f"s{i}" for i in range(4)]
text = st.text(max_size=12)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
ids = st.lists(st.integers(0, 2**31 - 1), max_size=20)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)

create = st.tuples(
    st.just("create"),
    st.sampled_from(SIDS),
    st.dictionaries(text, json_value, max_size=3),
    st.none() | st.sampled_from(["g1", "g2"]),
    st.none() | st.integers(0, 7),
)
call = st.tuples(
    st.just("call"),
    st.sampled_from(SIDS),
    ids,
    ids,
    st.sampled_from(["ok", "error", "aborted"]),
    st.none() | st.dictionaries(text, json_value, max_size=2),
    st.builds(  # a call's info: sometimes the model the viewer lists sessions by
        lambda model, rest: rest | ({"model": model} if model else {}),
        st.none() | st.sampled_from(["m1", "m2", "m\x00"]),
        st.dictionaries(text, json_value, max_size=3),
    ),
    st.none() | text,
    st.booleans(),  # with bodies
)
reward = st.tuples(
    st.just("reward"),
    st.sampled_from(SIDS),
    st.dictionaries(st.sampled_from(["r", "pass", "len"]), f32, min_size=1, max_size=2),
    st.booleans(),  # on the session's last call
)
close = st.tuples(st.just("close"), st.sampled_from(SIDS), st.none() | text)
delete = st.tuples(st.just("delete"), st.sampled_from(SIDS))
ops = st.lists(st.one_of(create, call, call, call, reward, close, delete), max_size=25)


def _apply(store: Store, op: tuple, n: int) -> object:
    """One operation; what it returned (or the exception's type)."""
    kind, sid = op[0], op[1]
    try:
        if kind == "create":
            return store.create_session(op[2], sid, group_id=op[3], sample_index=op[4])
        if kind == "call":
            if store.session_status(sid) is None:
                return "no session"  # the server never records a call without its session
            prior = store.calls(sid)
            delta, completion, status, message, info, error, bodies = op[2:]
            rec = CallRecord(
                id=f"call{n}",
                session_id=sid,
                seq=len(prior),
                parent_id=prior[-1].id if prior else None,
                segment_reason=None if prior else "first_call",
                reused_prefix_len=sum(len(c.prompt_delta) + len(c.completion_ids) for c in prior),
                prompt_delta=array("i", delta),
                completion_ids=array("i", completion),
                completion_logprobs=array("f", [-0.5 * (i % 7) for i in range(len(completion))]),
                finish_reason="stop",
                stop_token_id=completion[-1] if completion else None,
                seam=None,
                status=status,
                error=error,
                message=message,
                history_hash=bytes(8),
                prefix_hashes=[bytes([i]) * 8 for i in range(len(prior) + 1)],
                info=info,
                created=1000.0 + n,
            )
            body = {"messages": [{"role": "user", "content": str(n)}]} if bodies else None
            store.add_call(rec, body, {"id": n} if bodies else None, store.session_created(sid))
            return rec.id
        if kind == "reward":
            calls = store.calls(sid)
            on = calls[-1].id if op[3] and calls else None
            store.set_rewards(sid, op[2], on)
            return None
        if kind == "close":
            return store.close_session(sid, op[2])
        return store.delete_session(sid)
    except (SessionGone, UnstorableText) as exc:
        return type(exc).__name__


WALL_CLOCK = ("created", "closed", "last_call")  # stamped by each store itself


def _session(s: dict | None) -> dict | None:
    return None if s is None else {k: v for k, v in s.items() if k not in WALL_CLOCK}


def _observe(store: Store) -> dict:
    """Everything a reader can see, without the wall-clock times the stores stamp themselves."""
    listed, more = store.list_sessions(limit=3)
    page2, _ = store.list_sessions(limit=3, after=listed[-1]["id"]) if listed else ([], False)
    return {
        "sessions": {sid: _session(store.get_session(sid)) for sid in SIDS},
        "calls": {sid: [c.to_json() for c in store.calls(sid)] for sid in SIDS},
        "bodies": {f"call{n}": store.body(f"call{n}") for n in range(26)},
        "pages": [[s["id"] for s in listed], more, [s["id"] for s in page2]],
        "group": [s["id"] for s in store.list_sessions(group_id="g1")[0]],
        "closed": [s["id"] for s in store.list_sessions(status="closed")[0]],
        "counts": {sid: store.call_count(sid) for sid in SIDS},
        "status": {sid: store.session_status(sid) for sid in SIDS},
        "capabilities": sorted(store.capabilities(SIDS)),
        "summaries": [
            {k: v for k, v in s.items() if k not in WALL_CLOCK} for s in summaries(store)
        ],
    }


@pytest.fixture(scope="module")
def pg_url(postgres) -> str:
    return postgres.database()


def _reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE sessions, calls, rewards, bodies RESTART IDENTITY CASCADE")


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=ops)
@example(  # SQLite's json_extract ended the model name at an escaped NUL (the viewer's list)
    sequence=[
        ("create", "s0", {}, None, None),
        ("call", "s0", [], [], "ok", None, {"model": "m\x00"}, None, False),
    ]
)
def test_postgres_answers_as_sqlite_does(pg_url: str, sequence: list[tuple]) -> None:
    pg = Store(pg_url, keep_bodies=True)
    _reset(pg_url)
    with tempfile.TemporaryDirectory() as tmp:
        lite = Store(tmp, keep_bodies=True)
        try:
            for n, op in enumerate(sequence):
                assert _apply(pg, op, n) == _apply(lite, op, n), op
            assert _observe(pg) == _observe(lite)
        finally:
            lite.close()
            pg.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=ids, logprobs=st.lists(f32, max_size=20), info=st.dictionaries(text, json_value))
def test_tokens_and_logprobs_come_back_bit_for_bit(
    pg_url: str, completion: list[int], logprobs: list[float], info: dict
) -> None:
    """Read back through an independent client (psycopg, not the store): the bytes are the
    int32/float32 values written, and info is the JSON given."""
    store = Store(pg_url)
    try:
        sid = store.create_session({}, "bits_" + str(abs(hash((tuple(completion), len(info))))))
        n = store.call_count(sid)
        rec = CallRecord(
            id=f"{sid}-{n}", session_id=sid, seq=n, parent_id=None, segment_reason=None,
            reused_prefix_len=0, prompt_delta=array("i", completion[::-1]),
            completion_ids=array("i", completion), completion_logprobs=array("f", logprobs),
            finish_reason=None, stop_token_id=None, seam=None, status="ok", error=None,
            message=None, history_hash=None, prefix_hashes=[], info=info, created=1.5,
        )  # fmt: skip
        store.add_call(rec)
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT completion_ids, completion_logprobs, prompt_delta, info FROM calls "
            "WHERE id = %s",
            (rec.id,),
        ).fetchone()
    assert array("i", row[0]).tolist() == completion
    assert array("i", row[2]).tolist() == completion[::-1]
    got = array("f", row[1]).tolist()
    assert len(got) == len(logprobs)
    assert all(math.isclose(a, b, rel_tol=0, abs_tol=0) for a, b in zip(got, logprobs, strict=True))
    assert orjson.loads(row[3]) == info


def _timeless(rows: list[dict]) -> list[dict]:
    """Rows without the times each store stamped itself (session creation, close, export)."""
    return [
        {k: v for k, v in r.items() if not any(w in k for w in (*WALL_CLOCK, "exported"))}
        for r in rows
    ]


def test_an_export_of_either_store_is_the_same_table(pg_url: str, tmp_path: Path) -> None:
    """``turnstile export`` reads a PostgreSQL store into the tables it writes from SQLite."""
    _reset(pg_url)
    tables = {}
    for name, location in (("pg", pg_url), ("lite", str(tmp_path / "lite"))):
        store = Store(location, keep_bodies=True)
        for n, op in enumerate(
            [
                ("create", "s0", {"task": "t"}, "g1", 0),
                ("create", "s1", {}, "g1", 1),
                ("call", "s0", [1, 2, 3], [4, 5], "ok", {"role": "assistant"}, {"m": 1}, None, 1),
                ("call", "s0", [6], [7, 8, 9], "ok", None, {}, None, 0),
                ("call", "s1", [1], [2], "error", None, {}, "boom", 0),
                ("reward", "s0", {"r": 1.0}, False),
                ("close", "s0", "done"),
            ]
        ):
            _apply(store, op, n)
        export(location, tmp_path / name, store=store, batch="b", include_bodies=True)
        store.close()
        tables[name] = {
            p.relative_to(tmp_path / name).as_posix(): _timeless(pq.read_table(p).to_pylist())
            for p in sorted((tmp_path / name).rglob("*.parquet"))
        }
    assert tables["pg"] and tables["pg"] == tables["lite"]


def test_a_restarted_database_is_a_retryable_error(postgres) -> None:
    """The database's machine dies (SIGKILL) while a gateway holds connections: the write
    fails with the store's error (the server answers 503 store_busy), then succeeds on a fresh
    connection once it is back; every committed call survives the crash."""
    import signal

    url = postgres.database()
    store = Store(url)
    sid = store.create_session({})
    _apply(store, ("call", sid, [1], [2], "ok", None, {}, None, 0), 0)
    postgres.stop(signal.SIGKILL)
    try:
        with pytest.raises(psycopg.Error):
            _apply(store, ("call", sid, [3], [4], "ok", None, {}, None, 0), 1)
    finally:
        postgres.start()
    _apply(store, ("call", sid, [3], [4], "ok", None, {}, None, 0), 1)
    assert [c.id for c in store.calls(sid)] == ["call0", "call1"]
    store.close()
