"""Synthetic stores for export tests and benchmarks: many sessions, many calls, written fast.

Each session is a linear chain of calls (every call extends its parent, as an agent loop does),
with a few retries as siblings, random token IDs, float32 logprobs (some NaN, as llama-server
gives for tokens ending mid-UTF-8), integer weight versions, rewards and group/sample ids. Rows
go straight to SQLite in large transactions, in the same layout :class:`Store.add_call` writes.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import orjson

from turnstile.store.store import Store


def fill(
    store: Store,
    sessions: int,
    calls: int,
    delta: int = 20,
    completion: int = 30,
    group_size: int = 8,
    vocab: int = 151_000,
    seed: int = 0,
    retry_every: int = 50,
    versions_per_session: int = 2,
) -> int:
    """Write ``sessions`` sessions of ``calls`` calls each; returns the number of tokens
    written (prompt deltas + completions)."""
    rng = np.random.default_rng(seed)
    db = store._db  # bulk path: one transaction per session batch, no per-row locking
    now = time.time()
    tokens = 0
    batch_calls: list[tuple] = []
    batch_sessions: list[tuple] = []
    batch_rewards: list[tuple] = []
    for si in range(sessions):
        sid = f"sess_syn{si:08d}"
        group = f"g{si // group_size:06d}"
        sample = si % group_size
        meta = {"task": f"task-{si // group_size}", "split": "train"}
        batch_sessions.append(
            (
                sid,
                now + si,
                orjson.dumps(meta),
                "closed",
                now + si + 1,
                None,
                group,
                sample,
                f"task-{si // group_size}",
                None,
            )
        )
        reward = float(rng.random() < 0.5)
        batch_rewards.append((sid, "", "reward", reward, now))
        batch_rewards.append((sid, "", "format", float(rng.random()), now))
        d_len = rng.integers(max(1, delta // 2), delta * 3 // 2 + 1, size=calls)
        c_len = rng.integers(max(1, completion // 2), completion * 3 // 2 + 1, size=calls)
        d_len[0] += delta * 3  # the first prompt carries the system/user preamble
        n_tok = int(d_len.sum() + c_len.sum())
        ids = rng.integers(0, vocab, size=n_tok, dtype=np.int32)
        lps = -rng.exponential(1.0, size=int(c_len.sum())).astype(np.float32)
        lps[rng.random(len(lps)) < 0.01] = np.nan
        pos = lpos = 0
        parent = None
        prefix = seq = 0
        for ci in range(calls):
            cid = f"call_{si:08d}_{ci:05d}"
            dl, cl = int(d_len[ci]), int(c_len[ci])
            pd = ids[pos : pos + dl].tobytes()
            cp = ids[pos + dl : pos + dl + cl].tobytes()
            lp = lps[lpos : lpos + cl].tobytes()
            version = si % 7 + (ci * versions_per_session) // max(calls, 1)
            info = {
                "model": "synthetic",
                "engine": "synthetic",
                "weight_version": version,
                "sampling": {"max_tokens": cl, "temperature": 1.0, "seed": ci},
                "usage": {"prompt_tokens": prefix + dl, "completion_tokens": cl},
            }
            retry = retry_every and ci and ci % retry_every == 0
            if retry:  # an engine error, then the harness's retry: siblings
                batch_calls.append(
                    _row(cid + "e", sid, seq, parent, pd, cp, lp, info, now, prefix, "error")
                )
                seq += 1
            batch_calls.append(_row(cid, sid, seq, parent, pd, cp, lp, info, now, prefix, "ok"))
            seq += 1
            tokens += (dl + cl) * (2 if retry else 1)
            prefix += dl + cl
            parent = cid
            pos += dl + cl
            lpos += cl
        if len(batch_calls) >= 20_000:
            _flush(db, batch_sessions, batch_calls, batch_rewards)
    _flush(db, batch_sessions, batch_calls, batch_rewards)
    return tokens


def _row(
    cid: str,
    sid: str,
    seq: int,
    parent: str | None,
    pd: bytes,
    cp: bytes,
    lp: bytes,
    info: dict,
    now: float,
    prefix: int,
    status: str,
) -> tuple:
    return (
        cid,
        sid,
        seq,
        parent,
        None if parent else "first_call",
        prefix if parent else 0,
        pd,
        cp,
        lp,
        "stop",
        None,
        None,
        status,
        "engine unavailable" if status != "ok" else None,
        orjson.dumps({"role": "assistant", "content": "x"}),
        None,
        b"",
        orjson.dumps(info),
        now,
        None,  # arrays: no per-token arrays beyond the columns above
        None,  # media: no images
    )


def _flush(db: sqlite3.Connection, sessions: list, calls: list, rewards: list) -> None:
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO sessions (id, created, metadata, status, closed, "
        "termination_reason, group_id, sample_index, task_id, exported) "
        "VALUES (?,?,?,?,?,?,?,?,?,?)",
        sessions,
    )
    db.executemany(f"INSERT INTO calls VALUES ({','.join('?' * 21)})", calls)
    db.executemany("INSERT INTO rewards VALUES (?,?,?,?,?)", rewards)
    db.execute("COMMIT")
    sessions.clear()
    calls.clear()
    rewards.clear()


def make_store(path: str | Path, sessions: int, calls: int, **kw: int) -> tuple[Store, int]:
    store = Store(path)
    return store, fill(store, sessions, calls, **kw)
