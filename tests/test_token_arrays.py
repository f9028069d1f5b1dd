"""Per-token arrays as data (``turnstile.token_arrays``): a declared array goes from an engine's
rows through the call record, the SQLite store (and a v2 store migrated), the stitched
trajectory and its JSON, unchanged; a reused prefix's rows come from the parent's record and a
row no call recorded is marked absent, never zero-filled silently.

The truth each check holds to is built here, independently of the code under test: a whole
routing table of the final sequence, sliced as vLLM/SGLang return rows (``[start, total - 1)``);
weight versions by the obvious per-token loop over the engine's spans."""

from __future__ import annotations

import sqlite3
from array import array

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile import token_arrays
from turnstile.gateway.record import call_arrays, weight_version
from turnstile.store.records import CallRecord
from turnstile.store.store import Store
from turnstile.store.trajectories import Trajectory, stitch, version_number
from turnstile.token_arrays import ROUTED_EXPERTS, WEIGHT_VERSION, Rows

pytestmark = pytest.mark.unit

LAYERS, K = 3, 2


def _rec(
    cid: str,
    parent: CallRecord | None,
    delta: list[int],
    completion: list[int],
    arrays: dict[str, Rows] | None = None,
    **info: object,
) -> CallRecord:
    prefix = 0 if parent is None else parent.reused_prefix_len + len(parent.prompt_delta)
    prefix += 0 if parent is None else len(parent.completion_ids)
    return CallRecord(
        id=cid,
        session_id="s",
        seq=int(cid[1:]),
        parent_id=parent.id if parent else None,
        segment_reason=None if parent else "first_call",
        reused_prefix_len=prefix,
        prompt_delta=array("i", delta),
        completion_ids=array("i", completion),
        completion_logprobs=array("f", [-0.5] * len(completion)),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        message={"role": "assistant", "content": "x"},
        info=dict(info),
        arrays=arrays or {},
    )


def _engine_rows(table: np.ndarray, start: int, total: int) -> Rows:
    """What vLLM/SGLang return for a call whose sequence is ``table[:total]`` asked from
    ``start``: rows ``[start, total - 1)`` (the last sampled token was never forwarded)."""
    return Rows(start, table[start : total - 1].copy())


# --- the blob ------------------------------------------------------------------------------

shapes = st.sampled_from([(), (1,), (LAYERS, K), (2, 8)])
dtypes = st.sampled_from(["uint8", "uint16", "int64", "int32", "float32"])


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    arrays=st.dictionaries(
        st.sampled_from(["routed_experts", "weight_version", "x"]),
        st.tuples(st.integers(0, 50), st.integers(0, 40), shapes, dtypes),
        max_size=3,
    ),
)
def test_the_blob_gives_back_every_array_bit_for_bit(data, arrays) -> None:
    given_ = {}
    for name, (start, n, tail, dt) in arrays.items():
        size = n * int(np.prod(tail)) * np.dtype(dt).itemsize
        raw = data.draw(st.binary(min_size=size, max_size=size))
        given_[name] = Rows(start, np.frombuffer(raw, dtype=dt).reshape((n, *tail)))
    blob = token_arrays.pack(given_)
    back = token_arrays.unpack(blob)
    assert back.keys() == given_.keys()
    for name, rows in given_.items():
        got = back[name]
        assert got.start == rows.start and got.values.dtype == rows.values.dtype
        assert got.values.shape == rows.values.shape
        assert got.values.tobytes() == rows.values.tobytes()
    if not given_:
        assert blob is None and back == {}
    else:  # raw bytes and a small header: never JSON per token
        payload = sum(r.values.nbytes for r in given_.values())
        assert blob is not None and len(blob) <= payload + 8 + 64 * len(given_)


def test_routing_is_stored_at_its_uint8_size() -> None:
    rows = Rows(0, np.random.default_rng(0).integers(0, 128, (4096, 48, 8), dtype=np.uint8))
    blob = token_arrays.pack({"routed_experts": rows})
    assert blob is not None and len(blob) - rows.values.nbytes < 100
    assert token_arrays.expert_dtype(128) == np.uint8
    assert token_arrays.expert_dtype(257) == np.uint16
    assert token_arrays.expert_dtype(None, np.array([3, 300])) == np.uint16


# --- stitching: prompt and completion rows, a reused prefix from the parent -----------------


def _session(table: np.ndarray, routed: tuple[bool, bool, bool]) -> list[CallRecord]:
    """Three calls extending each other, each asking the engine only for rows its parent did
    not have (from the reused prefix's last token, the one the parent never forwarded)."""
    spec = [([1, 2, 3, 4], [5, 6, 7]), ([8, 9], [10, 11]), ([12], [13, 14, 15])]
    calls: list[CallRecord] = []
    for i, ((delta, completion), on) in enumerate(zip(spec, routed, strict=True)):
        parent = calls[-1] if calls else None
        r = _rec(f"c{i}", parent, delta, completion)
        total = r.reused_prefix_len + len(delta) + len(completion)
        start = max(0, r.reused_prefix_len - 1) if parent else 0
        if on:
            r.arrays[ROUTED_EXPERTS.name] = _engine_rows(table, start, total)
        calls.append(r)
    return calls


@pytest.mark.parametrize(
    "routed", [(True, True, True), (True, False, True), (False, True, True), (True, True, False)]
)
def test_a_merged_sample_takes_each_row_from_the_call_that_recorded_it(routed) -> None:
    table = np.random.default_rng(1).integers(0, 64, (15, LAYERS, K), dtype=np.uint8)
    calls = _session(table, routed)
    (t,) = stitch(calls)
    got, present = t.arrays["routed_experts"], t.present["routed_experts"]
    assert got.shape == (15, LAYERS, K) and got.dtype == np.uint8 and present.dtype == np.int8
    # the truth: which positions some call's engine answer covered
    covered = np.zeros(15, dtype=bool)
    for c, on in zip(calls, routed, strict=True):
        if on:
            rows = c.arrays["routed_experts"]
            covered[rows.start : rows.end] = True
    assert present.tolist() == covered.astype(int).tolist()
    assert present[-1] == 0  # the last sampled token has no routing: absent, not zero
    assert (got[covered] == table[covered]).all()
    assert (got[~covered] == 0).all()
    if all(routed):
        assert covered[:-1].all()  # only new rows asked, yet nothing is missing


def test_a_reused_prefix_keeps_the_parents_rows_over_a_recompute() -> None:
    """A child whose engine recomputed the prefix under other weights (rows that differ from
    the parent's): the sample keeps the rows the parent's tokens were sampled with."""
    table = np.random.default_rng(2).integers(0, 64, (15, LAYERS, K), dtype=np.uint8)
    calls = _session(table, (True, True, True))
    other = table.copy()
    other[:] = 63 - other
    calls[1].arrays["routed_experts"] = _engine_rows(other, 0, 9)  # asked from 0
    (t,) = stitch(calls)
    assert (t.arrays["routed_experts"][:6] == table[:6]).all()  # the parent's rows
    assert (t.arrays["routed_experts"][6:8] == other[6:8]).all()  # new in the child
    per_call = stitch(calls, mode="per_call")
    assert (per_call[1].arrays["routed_experts"][:6] == table[:6]).all()
    assert per_call[0].arrays["routed_experts"].shape == (7, LAYERS, K)


def test_a_session_without_routing_has_no_routing_keys() -> None:
    (t,) = stitch(_session(np.zeros((15, LAYERS, K), np.uint8), (False, False, False)))
    assert t.arrays == {} and "routed_experts" not in t.to_json()


def test_the_json_shape_adds_routing_and_reads_back() -> None:
    table = np.random.default_rng(3).integers(0, 300, (15, LAYERS, K)).astype(np.uint16)
    (t,) = stitch(_session(table, (True, False, True)))
    j = orjson.loads(orjson.dumps(t.to_json(), option=orjson.OPT_SERIALIZE_NUMPY))
    assert len(j["routed_experts"]) == len(j["token_ids"]) == 15
    assert np.array(j["routed_experts"]).shape == (15, LAYERS, K)
    assert j["routed_experts_present"] == t.present["routed_experts"].tolist()
    back = Trajectory.from_json(j)
    assert back.arrays["routed_experts"].dtype == np.uint16
    assert (back.arrays["routed_experts"] == t.arrays["routed_experts"]).all()
    assert (back.present["routed_experts"] == t.present["routed_experts"]).all()
    # every key the shape had before is still there
    for key in ("token_ids", "loss_mask", "logprobs", "versions", "turns", "prompt_len"):
        assert key in j


# --- weight versions: the engine's spans as a per-token array --------------------------------

span = st.fixed_dictionaries(
    {
        "version": st.one_of(st.integers(-5, 99).map(str), st.just("abc"), st.integers(0, 9)),
        "start": st.integers(-2, 12),
        "end": st.integers(-2, 14),
    }
)


def _old_per_token(spans: list[dict] | None, n: int) -> list | None:
    """The per-token list the record's info held before the arrays (the truth for both)."""
    if not spans:
        return None
    out: list = [None] * n
    for s in spans:
        for i in range(max(0, s["start"]), min(n, s["end"])):
            out[i] = s["version"]
    return out


@settings(max_examples=120, deadline=None)
@given(
    spans=st.none() | st.lists(span, max_size=4),
    n=st.integers(0, 12),
    whole=st.none() | st.just("w"),
)
def test_weight_versions_on_the_array_equal_the_per_token_list(spans, n, whole) -> None:
    old_list = _old_per_token(spans, n)
    old_info = old_list or (whole if whole is not None else "p")
    old = _rec("c0", None, [1, 2], list(range(100, 100 + n)), weight_version=old_info)
    new = _rec(
        "c0",
        None,
        [1, 2],
        list(range(100, 100 + n)),
        arrays=call_arrays(spans, 2, n, None),
        weight_version=weight_version(spans, n, whole, "p"),
        weight_versions=spans,
    )
    (a,), (b,) = stitch([old]), stitch([new])
    assert a.versions.tolist() == b.versions.tolist()
    known = [v for v in (old_list or []) if v is not None]
    if known:  # the call's version: its last sampled token's
        assert a.turns[0]["weight_version"] == b.turns[0]["weight_version"] == str(known[-1])
    elif old_list is None:  # no spans: the engine's one version, else the policy's
        assert a.turns[0]["weight_version"] == b.turns[0]["weight_version"] == str(old_info)
    # the record's JSON still shows the per-token list where the engine gave spans
    if old_list:
        assert new.to_json()["weight_version"] == old_list
    assert WEIGHT_VERSION.name not in b.arrays  # it is the sample's ``versions``
    assert all(version_number(v) == -1 or isinstance(v, int) for v in b.versions.tolist())


# --- the store: both arrays through SQLite, and a v2 store migrated --------------------------


def test_arrays_survive_the_store(tmp_path) -> None:
    table = np.random.default_rng(4).integers(0, 64, (15, LAYERS, K), dtype=np.uint8)
    calls = _session(table, (True, True, True))
    spans = [{"version": "7", "start": 0, "end": 2}, {"version": "8", "start": 2, "end": 3}]
    calls[2].arrays.update(call_arrays(spans, 12, 3, None))
    calls[2].info.update(weight_version="8", weight_versions=spans)
    store = Store(tmp_path)
    store.create_session({}, "s")
    for c in calls:
        store.add_call(c)
    back = store.calls("s")
    (t,) = stitch(back)
    (want,) = stitch(calls)
    assert (t.arrays["routed_experts"] == want.arrays["routed_experts"]).all()
    assert t.versions.tolist()[12:] == [7, 7, 8]
    store.close()
    # an independent reader: the column holds raw bytes, the routing at its uint8 size
    db = sqlite3.connect(tmp_path / "turnstile.sqlite3")
    blobs = [r[0] for r in db.execute("SELECT arrays FROM calls ORDER BY seq")]
    db.close()
    for blob, c in zip(blobs, calls, strict=True):
        routing = c.arrays["routed_experts"].values
        assert routing.tobytes() in blob and len(blob) < routing.nbytes + 200


def test_a_v2_store_is_migrated_and_its_versions_read_from_info(tmp_path) -> None:
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / "turnstile.sqlite3")
    db.execute("ALTER TABLE calls DROP COLUMN arrays")
    db.execute("ALTER TABLE calls DROP COLUMN media")  # v4's
    db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    db.execute("INSERT INTO sessions (id, created, metadata) VALUES ('s', 1.0, '{}')")
    info = {"weight_version": ["3", "3", "x", "4"], "weight_versions": [{"version": "3"}]}
    db.execute(
        "INSERT INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        ("c0", "s", 0, None, "first_call", 0, array("i", [1, 2]).tobytes(),
         array("i", [5, 6, 7, 8]).tobytes(), array("f", [0.0] * 4).tobytes(), "stop", None,
         None, "ok", None, None, None, b"", orjson.dumps(info), 2.0),
    )  # fmt: skip
    db.commit()
    db.close()
    store = Store(tmp_path)
    assert store.schema_version() == 4
    (c,) = store.calls("s")
    assert c.arrays == {}
    (t,) = stitch([c])
    assert t.versions.tolist() == [-1, -1, 3, 3, -1, 4]
    assert t.turns[0]["weight_version"] == "4" and t.arrays == {}
    store.close()
