"""The benchmarks' check of what a proxy recorded against what the fake engine received and
sampled (``turnstile.testing.fake_vllm_replay``'s recorder), never against the proxy's own
account: a call's recorded prompt must be a prompt the engine was sent, its completion and
logprobs what the engine answered with, its loss mask 1 exactly on the sampled tokens, and the
engine must have been sent exactly one request per answered call."""

from __future__ import annotations

import sqlite3
import urllib.request
from array import array
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson

KEEP_ALL = 1 << 20  # requests the fake keeps whole while a check runs (a check is small)


def start(fake_url: str, keep: int = KEEP_ALL) -> None:
    """The fake counts its token-in requests from now and keeps the first ``keep`` whole."""
    req = urllib.request.Request(fake_url + "/record", orjson.dumps({"keep": keep}), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def recorded(fake_url: str) -> dict:
    """What the fake received since :func:`start` and what it sampled."""
    with urllib.request.urlopen(fake_url + "/recorded", timeout=60) as r:
        return orjson.loads(r.read())


class Engine:
    """The fake's account: the prompts it was sent, its sampled IDs and logprobs."""

    def __init__(self, rec: dict):
        self.received = int(rec["received"])
        self.requests = rec["requests"]
        self.prompts = {tuple(r["token_ids"]) for r in self.requests}
        self.sampled = list(rec["sampled"]["token_ids"])
        self.logprobs = np.asarray(rec["sampled"]["logprobs"], dtype=np.float32)

    def sampling_problems(self, max_tokens: int, temperature: float | None) -> list[str]:
        """Every request's sampling as the harness asked."""
        out = []
        for r in self.requests:
            sp = r.get("sampling_params") or {}
            if sp.get("max_tokens") != max_tokens:
                out.append(f"the engine was sent max_tokens={sp.get('max_tokens')}")
            if temperature is not None and sp.get("temperature") != temperature:
                out.append(f"the engine was sent temperature={sp.get('temperature')}")
        return sorted(set(out))

    def call_problems(
        self, where: str, prompt: Iterable[int], completion: Iterable[int], logprobs: np.ndarray
    ) -> list[str]:
        out = []
        if tuple(prompt) not in self.prompts:
            out.append(f"{where}: its prompt ({len(tuple(prompt))} IDs) was never sent")
        if list(completion) != self.sampled:
            out.append(f"{where}: its completion is not what the engine sampled")
        lp = np.asarray(logprobs, dtype=np.float32)
        if lp.shape != self.logprobs.shape or not np.array_equal(lp, self.logprobs):
            if lp.shape != self.logprobs.shape:
                out.append(f"{where}: {len(lp)} logprobs, the engine returned {len(self.logprobs)}")
            else:
                i = int(np.flatnonzero(lp != self.logprobs)[0])
                out.append(
                    f"{where}: logprob {i} is {lp[i]}, the engine returned {self.logprobs[i]}"
                )
        return out


def turnstile_problems(
    engine: Engine, url: str, token: str, answered: list[tuple[str, int]]
) -> list[str]:
    """Each answered call's per-call training sample, as a trainer reads it (``Client``), against
    the engine's account."""
    from turnstile.client import Client

    out: list[str] = []
    by_session: dict[str, list[int]] = {}
    for sid, index in answered:
        by_session.setdefault(sid, []).append(index)
    with Client(url, timeout=120, token=token) as client:
        for sid, indexes in sorted(by_session.items()):
            samples = client.trajectories(sid, "per_call")
            for index in indexes:
                where = f"{url} session {sid} call {index}"
                if index >= len(samples):
                    out.append(f"{where}: not recorded ({len(samples)} calls)")
                    continue
                t = samples[index]
                n = t.prompt_len
                mask = np.asarray(t.loss_mask)
                if mask[:n].any() or not mask[n:].all():
                    out.append(f"{where}: the loss mask is not 1 exactly on the sampled tokens")
                out += engine.call_problems(where, t.token_ids[:n], t.token_ids[n:], t.logprobs[n:])
    return out


def floor_problems(engine: Engine, db: Path, answered: list[tuple[str, int]]) -> list[str]:
    """The floor's rows (a delta and a completion per call, in order per session): each
    answered call's prompt (the session's deltas and completions before it, and its own
    delta) against the engine's account."""
    out: list[str] = []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for sid in sorted({s for s, _ in answered}):
            rows = con.execute(
                "SELECT prompt, completion, logprobs FROM calls WHERE session = ? ORDER BY rowid",
                (sid,),
            ).fetchall()
            context, prompts = array("i"), []
            for delta, completion, logprobs in rows:
                context += array("i", delta)
                prompts.append((context.tolist(), array("i", completion), logprobs))
                context += array("i", completion)
            for s, index in answered:
                if s != sid:
                    continue
                where = f"floor {db.parent.name} session {sid} call {index}"
                if index >= len(prompts):
                    out.append(f"{where}: not recorded ({len(prompts)} rows)")
                    continue
                prompt, completion, logprobs = prompts[index]
                lp = np.frombuffer(logprobs, dtype=np.float32)
                out += engine.call_problems(where, prompt, completion, lp)
    finally:
        con.close()
    return out


def check(
    fake_url: str,
    answered: list[tuple[str, str, list[tuple[str, int]]]],
    token: str,
    max_tokens: int,
    temperature: float | None = 1.0,
) -> list[str]:
    """Each target's answered calls (``(kind, where, calls)``: ``turnstile`` and its URL, or
    ``floor`` and its SQLite file) against the fake's account since :func:`start`; also one
    engine request per answered call, and each sent with the harness's sampling."""
    engine = Engine(recorded(fake_url))
    n = sum(len(calls) for _, _, calls in answered)
    out = []
    if n == 0 or engine.received != n:
        out.append(f"the engine received {engine.received} requests for {n} answered calls")
    out += engine.sampling_problems(max_tokens, temperature)
    for kind, where, calls in answered:
        if kind == "turnstile":
            out += turnstile_problems(engine, where, token, calls)
        else:
            out += floor_problems(engine, Path(where), calls)
    return out


def corrupt(data: Path) -> None:
    """A negative control (``--corrupt-record``): every call's recorded logprobs zeroed in
    Turnstile's SQLite file (its schema: docs/schema.md), as wrong records would be; the check
    must then fail."""
    (db,) = [p for p in data.iterdir() if p.suffix in (".sqlite3", ".db", ".sqlite")]
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE calls SET completion_logprobs = zeroblob(length(completion_logprobs))")
    con.close()
