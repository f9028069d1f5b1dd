"""The trainer hand-off of calls a weight update reached (issue 44, docs/weight_sync.md):
``turnstile export`` (function and CLI) and ``turnstile.Client`` take the trajectories route's
``mask_stale_versions`` / ``max_preemptions``; ``turnstile verify`` reports per version. One
held call through the vLLM fake (the machinery of ``test_hold``); the truth for "the old
version's tokens" is what the fake sent for the cut request (its recorder), and the exported
files are read back with pyarrow."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_hold import K, N, _chat, _generates, _held_run, _sent_ids, fake, gate, ts  # noqa: F401

from turnstile.store.export import export
from turnstile.store.held import HoldOptions
from turnstile.store.store import Store
from turnstile.verify import summary, verify_sessions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def held(ts, fake, gate) -> dict:  # noqa: F811 - the fixtures imported from test_hold
    """One session whose single call was held across a version change: its id and the
    token IDs the fake sent for the cut (old-version) request."""
    for r in (("pause", {"mode": "drain"}), ("resume", {"weight_version": "3"})):
        assert ts.http.post(ts.url + "/admin/" + r[0], json=r[1]).status_code == 200
    fake.weight_version = "3"  # integer versions: the export's int64 ``versions`` column
    session = ts.session()
    since = len(fake.rec.requests)
    _held_run(ts, fake, gate, _chat(session), "4")  # the engine says "engine-4": not an int
    first = _generates(fake, since)[0]
    old = _sent_ids(fake, f"generate-tokens-{first['request_id']}")
    assert len(old) == K
    return {"id": session["id"], "old": old}


def _exported(ts, sid: str, out: Path, hold: HoldOptions | None) -> dict:  # noqa: F811
    export(ts.data, out, mode="per_call", tables=["trajectories"], session_ids=[sid], hold=hold)
    [row] = pq.read_table(out / "trajectories").to_pylist()
    return row


def _completion(row: dict) -> tuple[list[int], list[int], list[int]]:
    start = row["turns"][0]["completion_start"]
    return row["token_ids"][start:], row["loss_mask"][start:], row["versions"][start:]


def test_export_masks_the_old_versions_tokens_and_the_over_preempted_calls(
    ts,  # noqa: F811
    held,
    tmp_path,
):
    ids, mask, versions = _completion(_exported(ts, held["id"], tmp_path / "plain", None))
    assert len(ids) == N and mask == [1] * N
    assert versions[:K] == [3] * K and versions[K:] != [3] * (N - K)  # two versions
    ids, mask, versions2 = _completion(
        _exported(ts, held["id"], tmp_path / "stale", HoldOptions(mask_stale=True))
    )
    assert versions2 == versions  # masked tokens keep their versions
    assert [t for t, m in zip(ids, mask, strict=True) if not m] == held[
        "old"
    ]  # what the old weights sent
    assert [v for v, m in zip(versions, mask, strict=True) if not m] == [versions[0]] * K
    for cap, want in ((0, [0] * N), (1, [1] * N)):
        row = _exported(ts, held["id"], tmp_path / f"cap{cap}", HoldOptions(max_preemptions=cap))
        assert _completion(row)[1] == want


def test_the_cli_takes_the_same_options(ts, held, tmp_path):  # noqa: F811
    base = [sys.executable, "-m", "turnstile", "export", "--data", str(ts.data)]
    base += ["--mode", "per_call", "--tables", "trajectories", "--session", held["id"]]
    run = subprocess.run(
        [*base, "--out", str(tmp_path / "a"), "--mask-stale-versions", "--max-preemptions", "1"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    [row] = pq.read_table(tmp_path / "a" / "trajectories").to_pylist()
    assert _completion(row)[1] == [0] * K + [1] * (N - K)
    bad = subprocess.run(
        [*base, "--out", str(tmp_path / "b"), "--max-preemptions", "-1"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--max-preemptions" in bad.stderr


def test_the_clients_options_equal_the_routes(ts, held):  # noqa: F811
    path = f"/v1/sessions/{held['id']}/trajectories?mode=per_call"
    client = ts.client()
    for kw, query in (
        ({}, ""),
        ({"mask_stale_versions": True}, "&mask_stale_versions=true"),
        ({"max_preemptions": 0}, "&max_preemptions=0"),
        (
            {"max_preemptions": 1, "mask_stale_versions": True},
            "&max_preemptions=1&mask_stale_versions=true",
        ),
    ):
        [want] = ts.get(path + query)["data"]
        [got] = client.trajectories(held["id"], "per_call", **kw)  # type: ignore[arg-type]
        assert got.loss_mask.tolist() == want["loss_mask"], kw
        [via_session] = client.get_session(held["id"]).trajectories("per_call", **kw)  # type: ignore[arg-type]
        assert via_session.loss_mask.tolist() == want["loss_mask"], kw
    assert (
        client.trajectories(held["id"], "per_call", mask_stale_versions=True)[0].loss_mask.tolist()
        != client.trajectories(held["id"], "per_call")[0].loss_mask.tolist()
    )


def test_verify_reports_each_version_that_sampled_the_held_calls_tokens(ts, fake, held):  # noqa: F811
    """``turnstile verify``'s summary splits the exact arm by the version that sampled each
    token: the cut chunk (the policy declared when it was sent, "3") and the resumed one (the
    engine's own span, "engine-4"), K and N - K tokens as the fake sent them per request."""
    store = Store(ts.data)
    try:
        [report] = asyncio.run(verify_sessions(store, "vllm", fake.url, [held["id"]]))
    finally:
        store.close()
    assert {v: a.tokens for v, a in report.by_version.items()} == {"3": K, "engine-4": N - K}
    assert report.exact.tokens == N
    assert max(a.max_abs for a in report.by_version.values()) == report.exact.max_abs
    [row] = summary([report])
    assert {v: c["tokens"] for v, c in row["by_version"].items()} == {"3": K, "engine-4": N - K}
    for v, c in row["by_version"].items():
        a = report.by_version[v]
        assert (c["max_abs"], c["mean_abs"]) == (a.max_abs, a.mean_abs)
    assert json.loads(json.dumps(report.to_json()))["by_version"]["3"]["tokens"] == K
