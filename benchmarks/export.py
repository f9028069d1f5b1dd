"""Export benchmark: a synthetic store of many sessions x many calls → Parquet (and JSONL).

    ~/.cache/turnstile/venv/bin/python benchmarks/export.py               # 10,000 x 200
    ~/.cache/turnstile/venv/bin/python benchmarks/export.py --sessions 500 --calls 50

Prints, per format and table, rows, tokens, seconds, tokens/s and bytes per token on disk,
then checks the round trip: every exported call of a sample of sessions equals the store's
bytes (token IDs, logprob bits incl. NaN) and every trajectory equals a fresh stitch.
Token IDs are uniform random over a 151k vocabulary and logprobs random floats, so the bytes
per token are close to the worst case (real text compresses better).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import synthetic  # beside this script (development tooling, not in the package)

from turnstile.store.export import export, read_calls
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=200, help="calls per session")
    ap.add_argument("--delta", type=int, default=20, help="mean new prompt tokens per call")
    ap.add_argument("--completion", type=int, default=30, help="mean sampled tokens per call")
    ap.add_argument(
        "--jsonl-sessions",
        type=int,
        default=500,
        help="JSONL is measured on this many sessions (it is ~10x slower)",
    )
    ap.add_argument("--verify", type=int, default=200, help="sessions checked after export")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    args = ap.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="turnstile-bench-"))
    try:
        t0 = time.perf_counter()
        store, tokens = synthetic.make_store(
            work / "data", args.sessions, args.calls, delta=args.delta, completion=args.completion
        )
        fill_s = time.perf_counter() - t0
        db_bytes = sum(p.stat().st_size for p in (work / "data").glob("turnstile.sqlite3*"))
        print(
            f"store: {args.sessions:,} sessions x {args.calls} calls, {tokens:,} tokens, "
            f"written in {fill_s:.1f} s; SQLite files {db_bytes / 2**20:,.0f} MiB "
            f"({db_bytes / tokens:.2f} B/token)\n"
        )

        runs = []
        r = export(work / "data", work / "parquet", batch="bench", store=store, mark_exported=False)
        runs.append(("parquet", r))
        sample = [s["id"] for s in store.list_sessions(limit=args.jsonl_sessions)[0]]
        rj = export(
            work / "data",
            work / "jsonl",
            batch="bench",
            fmt="jsonl",
            store=store,
            session_ids=sample,
            mark_exported=False,
        )
        runs.append(("jsonl", rj))

        header = (
            f"{'format':<8} {'table':<13} {'sessions':>9} {'rows':>11} {'tokens':>14} "
            f"{'MiB':>9} {'B/token':>8}"
        )
        print(header)
        print("-" * len(header))
        for fmt, res in runs:
            for table in ("trajectories", "calls", "sessions"):
                tok = res.tokens[table]
                size = res.bytes.get(table, 0)
                per = f"{size / tok:8.2f}" if tok else f"{'-':>8}"
                print(
                    f"{fmt:<8} {table:<13} {res.sessions:>9,} {res.rows[table]:>11,} "
                    f"{tok:>14,} {size / 2**20:>9,.1f} {per}"
                )
        print()
        header = (
            f"{'format':<8} {'sessions':>9} {'seconds':>8} {'trajectory tokens/s':>20} "
            f"{'all tokens/s':>14} {'sessions/s':>11}"
        )
        print(header)
        print("-" * len(header))
        for fmt, res in runs:
            total = res.tokens["trajectories"] + res.tokens["calls"]
            print(
                f"{fmt:<8} {res.sessions:>9,} {res.seconds:>8.1f} "
                f"{res.tokens['trajectories'] / res.seconds:>20,.0f} "
                f"{total / res.seconds:>14,.0f} {res.sessions / res.seconds:>11,.0f}"
            )
        print(
            "(one export run writes all three tables; 'all tokens' counts the trajectories'"
            " and the calls' tokens)"
        )

        t0 = time.perf_counter()
        checked = verify(store, work / "parquet", args.verify)
        print(
            f"\nround trip: {checked:,} calls and their trajectories of {args.verify} random "
            f"sessions equal the store bit for bit ({time.perf_counter() - t0:.1f} s)"
        )
        store.close()
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def verify(store: Store, out: Path, n: int) -> int:
    sessions = [s["id"] for s in store.list_sessions(limit=10**9)[0]]
    chosen = set(random.Random(0).sample(sessions, min(n, len(sessions))))
    filt = ds.field("session_id").isin(list(chosen))
    calls = {c["id"]: c for c in read_calls(out / "calls") if c["session_id"] in chosen}
    trajs = ds.dataset(out / "trajectories").to_table(filter=filt).to_pylist()
    by_id = {t["id"]: t for t in trajs}
    checked = 0
    for sid in chosen:
        for row in store.raw_calls(sid):
            c = calls[row[0]]
            assert c["prompt_delta_ids"].tobytes() == row[6], row[0]
            assert c["completion_ids"].tobytes() == row[7], row[0]
            assert c["completion_logprobs"].tobytes() == row[8], row[0]
            assert c["info"].encode() == row[17], row[0]
            checked += 1
        for t in stitch(store.calls(sid)):
            e = by_id[t.id]
            assert e["token_ids"] == t.token_ids.tolist()
            assert e["loss_mask"] == t.loss_mask.tolist()
            assert np.array(e["logprobs"], np.float32).tobytes() == t.logprobs.tobytes()
    return checked


if __name__ == "__main__":
    main()
