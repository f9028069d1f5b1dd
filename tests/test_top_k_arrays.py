"""Top-k candidates on the per-token arrays seam (issue 41): a call that asks for top logprobs
(Chat ``top_logprobs``, Responses ``top_logprobs``) records each sampled token's candidates as
``top_ids`` (int32) and ``top_logprobs`` (float32), ``[completion tokens, k]``, -1 / NaN where a
row is short; the stitched trajectory, its JSON and the Parquet export carry them by name.

The truths are the engines' own: the fakes' recorders (``rec.sent``: the toy model's top-k, best
first, for every token the fake returned) paired with the recording relay's exchanges (what went
over the wire, in order), and a real llama-server's answers through the relay. The packing of
ragged lists is held to the plain per-row loop (hypothesis)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import Turnstile
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI
from test_vllm_real import Relay, start_relay

from turnstile.store.export import export
from turnstile.store.records import CallRecord
from turnstile.store.trajectories import Trajectory, stitch
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.token_arrays import TOP_IDS, TOP_LOGPROBS, pack, top_lists, top_rows, unpack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
PATHS = {"vllm": "/inference/v1/generate", "sglang": "/generate"}

# --- the packing: ragged lists in, the same lists out ---------------------------------------

pair = st.tuples(st.integers(0, 2**31 - 1), st.floats(-60.0, 0.0, width=32))
ragged = st.lists(st.lists(pair, max_size=7), max_size=30)
# every row as long as the others (the usual answer: the engine's k for every token)
whole = st.integers(1, 7).flatmap(
    lambda k: st.lists(st.lists(pair, min_size=k, max_size=k), min_size=1, max_size=30)
)


@settings(max_examples=150, deadline=None)
@given(tops=st.one_of(ragged, whole), asked=st.integers(0, 7), start=st.integers(0, 100))
def test_ragged_top_k_packs_and_unpacks_to_the_same_lists(tops, asked, start):
    got = unpack(pack(top_rows(tops, start, asked)) or b"")
    if asked == 0 or not tops:
        assert got == {}
        return
    ids, lps = got[TOP_IDS.name], got[TOP_LOGPROBS.name]
    width = max(asked, *(len(r) for r in tops))
    assert ids.start == lps.start == start
    assert ids.values.shape == lps.values.shape == (len(tops), width)
    assert ids.values.dtype == np.int32 and lps.values.dtype == np.float32
    for i, row in enumerate(tops):  # the plain loop: each row, then its padding
        for j in range(width):
            if j < len(row):
                assert ids.values[i, j] == row[j][0]
                assert lps.values[i, j] == np.float32(row[j][1])
            else:
                assert ids.values[i, j] == -1 and math.isnan(lps.values[i, j])
    assert top_lists(ids.values, lps.values) == [
        [(t, float(np.float32(v))) for t, v in row] for row in tops
    ]


def _rec(cid: str, parent: CallRecord | None, delta: int, tops: list, k: int) -> CallRecord:
    prefix = 0 if parent is None else parent.reused_prefix_len + len(parent.prompt_delta)
    prefix += 0 if parent is None else len(parent.completion_ids)
    n = len(tops)
    return CallRecord(
        id=cid,
        session_id="s",
        seq=int(cid[1:]),
        parent_id=parent.id if parent else None,
        segment_reason=None if parent else "first_call",
        reused_prefix_len=prefix,
        prompt_delta=array("i", [7] * delta),
        completion_ids=array("i", [9] * n),
        completion_logprobs=array("f", [-0.5] * n),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        message={"role": "assistant", "content": "x"},
        info={},
        arrays=unpack(pack(top_rows(tops, prefix + delta, k))),
    )


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.integers(1, 4), ragged.filter(bool), st.integers(0, 6)),
        min_size=1,
        max_size=4,
    )
)
def test_calls_of_different_k_stitch_padded_to_the_widest(calls):
    """A session whose calls asked different k (or none): every sampled token's candidates on
    its own position, padded to the widest call's k; prompt positions and calls that asked for
    none absent."""
    recs: list[CallRecord] = []
    for i, (delta, tops, k) in enumerate(calls):
        recs.append(_rec(f"c{i}", recs[-1] if recs else None, delta, tops, k))
    [merged] = stitch(recs)
    want: dict[int, list] = {}  # position -> candidates, from the plain walk
    pos = 0
    for delta, tops, k in calls:
        pos += delta
        for row in tops:
            if k > 0:
                want[pos] = row
            pos += 1
    assert len(merged) == pos
    if not want:
        assert TOP_IDS.name not in merged.arrays
        return
    ids, lps = merged.arrays[TOP_IDS.name], merged.arrays[TOP_LOGPROBS.name]
    width = max(max(k, *(len(r) for r in t)) for _, t, k in calls if k > 0)
    assert ids.shape == lps.shape == (pos, width)
    present = merged.present[TOP_IDS.name]
    assert present.tolist() == [int(p in want) for p in range(pos)]
    for p in range(pos):
        row = want.get(p, [])
        assert ids[p].tolist() == [t for t, _ in row] + [-1] * (width - len(row))
        got = lps[p].tolist()
        assert got[: len(row)] == [float(np.float32(v)) for _, v in row]
        assert all(math.isnan(v) for v in got[len(row) :])
    # through the trajectory's JSON (NaN is null there) and back
    back = Trajectory.from_json(orjson.loads(orjson.dumps(merged.to_json())))
    assert (back.arrays[TOP_IDS.name] == ids).all()
    assert np.array_equal(back.arrays[TOP_LOGPROBS.name], lps, equal_nan=True)
    assert back.arrays[TOP_LOGPROBS.name].dtype == np.float32


# --- end to end: a harness, Turnstile as a process, an engine fake behind the relay ----------


@pytest.fixture(params=["vllm", "sglang"])
def engine(request) -> Iterator[tuple[str, object, Relay]]:
    kind = request.param
    fake = VLLMFake() if kind == "vllm" else SGLangFake()
    with fake:
        relay, server = start_relay(fake.url, paths=(PATHS[kind],))
        yield kind, fake, relay
        server.shutdown()
        server.server_close()


def _wire_ids(kind: str, ex) -> tuple[list[int], list[int]]:
    """The prompt and completion of one generation, as the relay saw them."""
    out: list[int] = []
    if kind == "vllm":
        for p in ex.parts():
            for c in p.get("choices") or []:
                out += c.get("token_ids") or []
        return list(ex.request["token_ids"]), out
    for p in ex.parts():
        ids, n = p["output_ids"], p["meta_info"]["completion_tokens"]
        out = list(ids) if len(ids) == n else out + list(ids)
    return list(ex.request["input_ids"]), out


def _truth(kind: str, fake, relay: Relay) -> list[tuple[list[int], list[int], list[list]]]:
    """Each generation in order: prompt, completion and, per sampled token, the top-k the
    engine returned (its recorder's toy model top, best first), paired by order and held to
    the relay's completion IDs."""
    key = "token_ids" if kind == "vllm" else "input_ids"
    exchanges = [ex for ex in relay.exchanges if ex.path == PATHS[kind] and key in ex.request]
    sent = [g for g in fake.rec.sent.values() if g.steps]
    assert len(exchanges) == len(sent)
    out = []
    for ex, gen in zip(exchanges, sent, strict=True):
        prompt, completion = _wire_ids(kind, ex)
        assert completion == [s.token_id for s in gen.steps]
        out.append((prompt, completion, [list(s.top) for s in gen.steps]))
    return out


def _chat(client: OpenAI, messages: list[dict], stream: bool, k: int | None) -> tuple[str, list]:
    """One turn; its text and the candidates' logprobs the harness got per token."""
    kw: dict = dict(model="m", messages=messages, max_tokens=8, temperature=1.0, seed=5)
    if k is not None:
        kw.update(logprobs=True, top_logprobs=k)
    if not stream:
        ch = client.chat.completions.create(**kw).choices[0]
        content = ch.logprobs.content if ch.logprobs and ch.logprobs.content else []
        return ch.message.content or "", [[c.logprob for c in e.top_logprobs] for e in content]
    text, seen = "", []
    for part in client.chat.completions.create(**kw, stream=True):
        if not part.choices:
            continue
        c = part.choices[0]
        text += c.delta.content or ""
        if c.logprobs and c.logprobs.content:
            seen += [[t.logprob for t in e.top_logprobs] for e in c.logprobs.content]
    return text, seen


def test_a_session_records_the_top_k_the_engine_returned(engine, tiny_qwen2, tmp_path):
    """Four Chat turns (k 3 whole, k 5 streamed, none, k 1 streamed), each extending the
    last, and a Responses call (k 2) in a session of its own: every sampled token's recorded
    candidates are the engine's, in the merged samples and, for a child call, in its per-call
    sample only on its own completion; the Parquet export gives them back."""
    kind, fake, relay = engine
    ts = Turnstile(
        relay.url, tiny_qwen2, tmp_path / "data", tmp_path / "ts.log", ("--engine", kind)
    )
    ts.start()
    try:
        sid = ts.session()["id"]
        client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)
        asked = [3, 5, None, 1]
        streamed = [False, True, False, True]
        msgs = [{"role": "user", "content": "Name three candidates."}]
        harness_saw = []
        for i, (k, stream) in enumerate(zip(asked, streamed, strict=True)):
            text, seen = _chat(client, msgs, stream, k)
            harness_saw.append(seen)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"{i}"}]
        sid2 = ts.session()["id"]
        r_client = OpenAI(base_url=f"{ts.url}/s/{sid2}/v1", api_key=ts.token, max_retries=0)
        r_client.responses.create(
            model="m",
            input="Say something.",
            max_output_tokens=6,
            top_logprobs=2,
            include=["message.output_text.logprobs"],
        )
        asked.append(2)

        wire = _truth(kind, fake, relay)
        assert len(wire) == 5
        gens = [ex for ex in relay.exchanges if ex.path == PATHS[kind] and ex.request.get("stream")]
        assert len(gens) >= 2 and all(len(ex.chunks) > 1 for ex in gens)  # turns 2 and 4 streamed
        trajs = ts.get(f"/v1/sessions/{sid}/trajectories")["data"]
        trajs += ts.get(f"/v1/sessions/{sid2}/trajectories")["data"]
        per_call = ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
        widths = {
            id(t): max(
                (k for k, w in zip(asked, wire, strict=True) if k and _holds(t, w)), default=0
            )
            for t in trajs
        }
        checked = 0
        for i, ((prompt, out, tops), k) in enumerate(zip(wire, asked, strict=True)):
            full = prompt + out
            t = next(t for t in trajs if t["token_ids"][: len(full)] == full)
            span = range(len(prompt), len(full))
            if not k:  # asked for none: its rows absent
                assert not any(t["top_ids_present"][p] for p in span)
                continue
            width = len(t["top_ids"][0])
            assert width == widths[id(t)]  # padded to the widest call of the sample
            for j, p in enumerate(span):
                want = tops[j][:k]  # the engine's best k
                assert t["top_ids_present"][p] == 1
                assert t["top_ids"][p] == [tid for tid, _ in want] + [-1] * (width - len(want))
                got = t["top_logprobs"][p]
                assert got[: len(want)] == pytest.approx([v for _, v in want], abs=1e-6)
                assert got[len(want) :] == [None] * (width - len(want))  # NaN: null in JSON
                checked += 1
            if i < len(harness_saw) and harness_saw[i]:  # what the harness was relayed
                for j, seen in enumerate(harness_saw[i]):
                    assert seen == pytest.approx(t["top_logprobs"][len(prompt) + j][:k], abs=1e-6)
        assert checked >= 20
        for t in trajs:  # present exactly on the sampled tokens of calls that asked
            sampled = {
                p
                for (prompt, out, _), k in zip(wire, asked, strict=True)
                if k and _holds(t, (prompt, out))
                for p in range(len(prompt), len(prompt) + len(out))
            }
            assert t["top_ids_present"] == [int(p in sampled) for p in range(len(t["token_ids"]))]

        # a child call's own sample: its completion's rows only, the prefix's absent
        for i in (1, 3):
            prompt, out, tops = wire[i]
            s = next(s for s in per_call if s["token_ids"] == prompt + out)
            present = s["top_ids_present"]
            assert present == [0] * len(prompt) + [1] * len(out)
            assert s["top_ids"][len(prompt)][: asked[i]] == [tid for tid, _ in tops[0][: asked[i]]]

        # the trainer's SDK: numpy arrays, NaN where the JSON said null
        by_json = {tuple(t["token_ids"]): t for t in trajs}
        for tr in ts.client().trajectories(sid) + ts.client().trajectories(sid2):
            t = by_json[tuple(tr.token_ids.tolist())]
            assert tr.arrays["top_ids"].dtype == np.int32
            assert tr.arrays["top_ids"].tolist() == t["top_ids"]
            lp = tr.arrays["top_logprobs"]
            assert lp.dtype == np.float32
            want = np.array([[np.nan if v is None else v for v in r] for r in t["top_logprobs"]])
            assert np.array_equal(lp, want.astype(np.float32), equal_nan=True)

        out_dir = tmp_path / "export"
        res = export(ts.data, out_dir, fmt="parquet", session_ids=[sid, sid2])
        table = pa.concat_tables([pq.read_table(f) for f in res.files["trajectories"]])
        for name, leaf in (("top_ids", pa.int32()), ("top_logprobs", pa.float32())):
            typ = table.schema.field(name).type  # list<list<leaf>>: [tokens][k]
            assert pa.types.is_list(typ) and pa.types.is_list(typ.value_type)
            assert typ.value_type.value_type == leaf
        by_ids = {tuple(t["token_ids"]): t for t in trajs}
        rows = [r for r in table.to_pylist() if tuple(r["token_ids"]) in by_ids]
        assert len(rows) == len(trajs)
        for row in rows:
            t = by_ids[tuple(row["token_ids"])]
            assert row["top_ids"] == t["top_ids"]
            assert row["top_ids_present"] == t["top_ids_present"]
            lp = np.array(row["top_logprobs"], dtype=np.float32)  # a trainer's read
            want = np.array(t["top_logprobs"], dtype=np.float32)
            assert np.array_equal(lp, want, equal_nan=True)
        res = export(ts.data, tmp_path / "jsonl", fmt="jsonl", session_ids=[sid, sid2])
        lines = [orjson.loads(x) for f in res.files["trajectories"] for x in open(f, "rb")]
        assert len(lines) == len(trajs)
        for line in lines:  # NaN written as null, as the trajectories route gives it
            t = by_ids[tuple(line["token_ids"])]
            assert line["top_ids"] == t["top_ids"]
            got, want = (
                np.array([[np.nan if v is None else v for v in r] for r in x], dtype=np.float32)
                for x in (line["top_logprobs"], t["top_logprobs"])
            )
            assert np.array_equal(got, want, equal_nan=True)
    finally:
        ts.stop()


def _holds(t: dict, w: tuple) -> bool:
    full = w[0] + w[1]
    return t["token_ids"][: len(full)] == full


# --- a real llama-server, through the relay --------------------------------------------------


def test_llama_server_top_k_recorded_as_returned(relay: Relay, tiny_qwen2: Path, tmp_path):
    """llama-server's ``completion_probabilities`` (its ``top_logprobs`` per token, by id): the
    recorded candidates are those of the wire, token for token, for a whole turn and a
    streamed one (the adapter asks llama-server for a whole answer either way), the second a
    child whose per-call sample holds its own completion's rows only."""
    ts = Turnstile(relay.url, tiny_qwen2, tmp_path / "data", tmp_path / "ts.log")
    ts.start()
    try:
        sid = ts.session()["id"]
        client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)
        msgs = [{"role": "user", "content": "Hello there."}]
        text, _ = _chat(client, msgs, False, 4)
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
        _chat(client, msgs, True, 3)
        gens = [ex for ex in relay.exchanges if ex.request.get("prompt") is not None]
        assert len(gens) == 2
        per_call = ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
        checked = 0
        for ex, k in zip(gens, (4, 3), strict=True):
            probs = [p for part in ex.parts() for p in part.get("completion_probabilities") or []]
            tokens = [t for part in ex.parts() for t in part.get("tokens") or []]
            prompt = list(ex.request["prompt"])
            s = next(s for s in per_call if s["token_ids"] == prompt + tokens)
            j = 0
            for i, tid in enumerate(tokens):  # entries carry their id; a token may have none
                p = len(prompt) + i
                if j < len(probs) and probs[j]["id"] == tid:
                    want = [(c["id"], c["logprob"]) for c in probs[j]["top_logprobs"]][:k]
                    j += 1
                else:
                    want = []
                width = len(s["top_ids"][p])
                assert s["top_ids"][p] == [c for c, _ in want] + [-1] * (width - len(want))
                assert s["top_logprobs"][p][: len(want)] == pytest.approx(
                    [v for _, v in want], abs=1e-5
                )
                checked += bool(want)
            assert s["top_ids_present"] == [0] * len(prompt) + [1] * len(tokens)
        assert checked >= 4
    finally:
        ts.stop()
