"""Export: Parquet/JSONL round-trip losslessly, read with pyarrow, pandas, polars and
``datasets`` (no custom code), partitioning, incremental export, delete-after-export, CLI.

The full-size run (10,000 sessions x 200 calls) is ``benchmarks/export.py``; here a few
hundred sessions keep the suite fast while exercising the same code path.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from benchmarks import synthetic
from turnstile.store.export import export, read_calls
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch

pytestmark = pytest.mark.integration

SESSIONS, CALLS = 240, 30


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    store, tokens = synthetic.make_store(d, SESSIONS, CALLS, group_size=8, retry_every=7)
    assert tokens > 0
    store.close()
    return d


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()  # NaN payloads compare too


def test_parquet_round_trips_losslessly(store_dir, tmp_path):
    out = tmp_path / "out"
    r = export(store_dir, out, batch="step-1", mark_exported=False, rows_per_file=100)
    assert r.sessions == SESSIONS and r.rows["sessions"] == SESSIONS
    assert len(r.files["trajectories"]) == 3  # 240 rows, 100 per file
    st = Store(store_dir)

    # calls: every stored column, byte for byte.
    exported = {c["id"]: c for c in read_calls(out / "calls")}
    raw = [row for s in st.list_sessions(limit=1000)[0] for row in st.raw_calls(s["id"])]
    assert len(exported) == len(raw) == r.rows["calls"]
    assert sum(1 for row in raw if row[12] == "error") > 0  # retries are archived too
    for row in raw:
        c = exported[row[0]]
        assert c["prompt_delta_ids"].dtype == np.int32
        assert _bits(c["prompt_delta_ids"]) == row[6]
        assert _bits(c["completion_ids"]) == row[7]
        assert _bits(c["completion_logprobs"]) == row[8]  # NaN included
        assert (
            c["session_id"],
            c["seq"],
            c["parent_id"],
            c["segment_reason"],
            c["reused_prefix_len"],
            c["finish_reason"],
            c["stop_token_id"],
            c["seam"],
            c["status"],
            c["error"],
            c["history_hash"],
            c["created"],
        ) == (
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            row[9],
            row[10],
            row[11],
            row[12],
            row[13],
            row[15],
            row[18],
        )
        assert c["message"].encode() == row[14] and c["info"].encode() == row[17]
        assert c["prefix_hashes"] == row[16]

    # trajectories: the stitched view, with nulls exactly where nothing was sampled.
    table = pq.read_table(out / "trajectories")
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert pq.read_metadata(r.files["trajectories"][0]).row_group(0).column(0).compression == "ZSTD"
    rows = {row["id"]: row for row in table.to_pylist()}
    for s in st.list_sessions(limit=1000)[0]:
        for t in stitch(st.calls(s["id"])):
            row = rows[t.id]
            assert row["token_ids"] == t.token_ids.tolist()
            assert row["loss_mask"] == t.loss_mask.tolist()
            assert _bits(np.array(row["logprobs"], np.float32)) == _bits(t.logprobs)
            assert row["versions"] == [None if v < 0 else v for v in t.versions.tolist()]
            assert (row["group_id"], row["sample_index"]) == (s["group_id"], s["sample_index"])
            assert row["reward"] == s["reward"]
            assert {x["name"]: x["value"] for x in row["rewards"]} == s["rewards"]
            assert [u["call_id"] for u in row["turns"]] == t.call_ids
            assert row["prompt_len"] == t.prompt_len and row["export_batch"] == "step-1"
    st.close()


def test_every_reader_reads_it_without_custom_code(store_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "out"
    export(store_dir, out, batch="b", mark_exported=False, rows_per_file=64)
    traj_dir = out / "trajectories"
    ref = pq.read_table(traj_dir).sort_by("id")
    first = ref.slice(0, 1).to_pylist()[0]

    import pandas as pd

    df = pd.read_parquet(traj_dir).sort_values("id").reset_index(drop=True)
    assert len(df) == ref.num_rows
    assert df.loc[0, "token_ids"].tolist() == first["token_ids"]
    assert df.loc[0, "token_ids"].dtype == np.int32

    import polars as pl

    pdf = pl.read_parquet(str(traj_dir / "**" / "*.parquet")).sort("id")
    assert pdf.height == ref.num_rows
    assert pdf.schema["token_ids"] == pl.List(pl.Int32)
    assert pdf.schema["logprobs"] == pl.List(pl.Float32)
    assert pdf["token_ids"][0].to_list() == first["token_ids"]

    import datasets

    hf = datasets.load_dataset(
        "parquet",
        data_files=str(traj_dir / "**" / "*.parquet"),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert hf.num_rows == ref.num_rows
    row = hf[list(hf["id"]).index(first["id"])]
    assert row["token_ids"] == first["token_ids"] and row["group_id"] == first["group_id"]
    assert hf.features["token_ids"].feature.dtype == "int32"

    # A trainer streams one step's partition in row groups, with a filter.
    dataset = ds.dataset(traj_dir, format="parquet")
    got = dataset.to_table(
        filter=ds.field("group_id") == first["group_id"], columns=["id", "token_ids"]
    )
    assert 0 < got.num_rows <= 8


def test_jsonl_matches_parquet(store_dir, tmp_path):
    export(store_dir, tmp_path / "pq", batch="b", mark_exported=False)
    export(store_dir, tmp_path / "js", batch="b", fmt="jsonl", mark_exported=False)
    ref = {r["id"]: r for r in pq.read_table(tmp_path / "pq" / "trajectories").to_pylist()}
    files = sorted((tmp_path / "js" / "trajectories").rglob("*.jsonl"))
    lines = [orjson.loads(line) for f in files for line in f.read_bytes().splitlines()]
    assert len(lines) == len(ref)
    for j in lines:
        r = ref[j["id"]]
        assert j["token_ids"] == r["token_ids"] and j["loss_mask"] == r["loss_mask"]
        assert j["versions"] == r["versions"]
        assert j["logprobs"] == [None if x != x else pytest.approx(x) for x in r["logprobs"]]
        assert j["metadata"] == json.loads(r["metadata"])
    calls = [
        orjson.loads(line)
        for f in (tmp_path / "js" / "calls").rglob("*.jsonl")
        for line in f.read_bytes().splitlines()
    ]
    assert len(calls) == sum(1 for _ in read_calls(tmp_path / "pq" / "calls"))


def test_partition_by_group_incremental_and_delete(tmp_path):
    store, _ = synthetic.make_store(tmp_path / "data", 24, 5, group_size=4)
    out = tmp_path / "out"
    r = export(
        tmp_path / "data",
        out,
        partition="group",
        batch="s1",
        store=store,
        group_ids=["g000000", "g000001"],
        status="closed",
    )
    assert r.sessions == 8
    dirs = sorted(p.name for p in (out / "trajectories").iterdir())
    assert dirs == ["group-g000000", "group-g000001"]
    for d in dirs:
        t = pq.read_table(out / "trajectories" / d)
        assert set(t.column("group_id").to_pylist()) == {d.removeprefix("group-")}
        assert sorted(t.column("sample_index").to_pylist()) == [0, 1, 2, 3]

    # The next step exports only what no earlier export wrote, then deletes it.
    r2 = export(tmp_path / "data", out, batch="s2", unexported_only=True, delete=True, store=store)
    assert r2.sessions == 16 and r2.deleted == 16
    assert len(store.list_sessions()[0]) == 8  # the first 8 remain (exported, not deleted)
    assert store.calls(r2.session_ids[0]) == []
    r3 = export(tmp_path / "data", out, batch="s3", unexported_only=True, store=store)
    assert r3.sessions == 0
    manifest = json.loads((out / "_manifests" / "s2.json").read_text())
    assert manifest["rows"]["calls"] == r2.rows["calls"] and manifest["deleted"] == 16
    with pytest.raises(FileExistsError):
        export(tmp_path / "data", out, batch="s1", store=store, partition="group")
    with pytest.raises(ValueError, match="calls"):
        export(
            tmp_path / "data", out, batch="s4", tables=["trajectories"], delete=True, store=store
        )
    store.close()


def test_cli_export_works_with_the_server_down(tmp_path):
    store, _ = synthetic.make_store(tmp_path / "data", 10, 4)
    store.close()
    cmd = [
        sys.executable,
        "-m",
        "turnstile.app.cli",
        "export",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "out"),
        "--batch",
        "step-9",
        "--mode",
        "per_call",
        "--tables",
        "trajectories,sessions",
        "--delete",
    ]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 2 and "calls" in bad.stderr
    ok = subprocess.run(
        cmd[:-1] + ["--format", "jsonl"], capture_output=True, text=True, check=True
    )
    summary = json.loads(ok.stdout)
    assert summary["sessions"] == 10 and summary["rows"]["trajectories"] == 40
    assert (tmp_path / "out" / "trajectories" / "batch-step-9" / "part-00000.jsonl").exists()
