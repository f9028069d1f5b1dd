"""Re-feed verification: the engine scores recorded trajectories again, and each sampled token's
recorded logprob is compared with the engine's recompute of it.

A record is exact when the two agree to the engine's own numerical noise (the same weights, the
same token IDs); a stale weight sync, a logprob mode that is not the sampling distribution, or a
batch-variant kernel shows as a gap, and a broken record (tokens the policy never produced) as a
token where they part. The same is done for the *naive* version of each trajectory, what a text
pipeline would train on: its decoded text encoded again, the engine's logprobs laid on it by
position, so the report shows what exact token IDs bought.

Each engine scores a sequence its own way (:class:`Scorer`): vLLM returns ``prompt_logprobs``,
SGLang input-token logprobs, and llama-server, which has neither, samples each sampled token
again by force after its prefix (its ``completion_probabilities`` are the raw distribution, bias
not applied), one short call per token on its prompt cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import httpx
import numpy as np

from .chat.loaded_tokenizer import LoadedTokenizer
from .store.contracts import CallReader
from .store.trajectories import Trajectory, stitch

TOLERANCE = 1e-3  # |Δ logprob| above which a token counts as parted (report field)


class Scorer(Protocol):
    """An engine that gives the logprob of ``ids[p]`` after ``ids[:p]`` for each ``p``."""

    name: str

    async def score(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]: ...


class NotSupported(Exception):
    """This engine cannot score a given sequence."""


class VLLMScorer:
    """vLLM's ``/v1/completions`` with ``prompt_logprobs``: one call per trajectory."""

    name = "vllm"

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client, self.url = client, url.rstrip("/")
        self.model: str | None = None

    async def score(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
        if self.model is None:
            models = (await self.client.get(self.url + "/v1/models")).json()
            self.model = models["data"][0]["id"]
        body = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        r = await self.client.post(self.url + "/v1/completions", json=body)
        if r.status_code != 200:
            raise NotSupported(f"vLLM answered {r.status_code}: {r.text[:300]}")
        per_position = r.json()["choices"][0]["prompt_logprobs"]
        return [float(per_position[p][str(ids[p])]["logprob"]) for p in positions]


class SGLangScorer:
    """SGLang's ``/generate`` with ``return_logprob`` from the first token."""

    name = "sglang"

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client, self.url = client, url.rstrip("/")

    async def score(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
        body = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        r = await self.client.post(self.url + "/generate", json=body)
        if r.status_code != 200:
            raise NotSupported(f"SGLang answered {r.status_code}: {r.text[:300]}")
        rows = r.json()["meta_info"]["input_token_logprobs"]
        return [float(rows[p][0]) for p in positions]


class LlamaCppScorer:
    """llama-server: each token sampled again by force after its prefix (a +100 bias), its
    raw logprob read from ``completion_probabilities``; the prefix stays in the slot's cache,
    so each call evaluates one token."""

    name = "llama-cpp"

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client, self.url = client, url.rstrip("/")

    async def score(self, ids: Sequence[int], positions: Sequence[int]) -> list[float]:
        out = []
        for p in positions:
            body = {
                "prompt": list(ids[:p]),
                "n_predict": 1,
                "n_probs": 1,
                "logit_bias": [[int(ids[p]), 100.0]],
                "temperature": 1.0,
                "top_k": 0,
                "top_p": 1.0,
                "min_p": 0.0,
                "return_tokens": True,
                "cache_prompt": True,
                "id_slot": 0,
            }
            r = await self.client.post(self.url + "/completion", json=body)
            if r.status_code != 200:
                raise NotSupported(f"llama-server answered {r.status_code}: {r.text[:300]}")
            data = r.json()
            [step] = data["completion_probabilities"][:1]
            if step["id"] != ids[p]:
                raise NotSupported(f"llama-server would not sample token {ids[p]} at {p}")
            out.append(float(step["logprob"]))
        return out


SCORERS: dict[str, Callable[[httpx.AsyncClient, str], Scorer]] = {
    "vllm": VLLMScorer,
    "sglang": SGLangScorer,
    "llama-cpp": LlamaCppScorer,
}


def scorer(kind: str, client: httpx.AsyncClient, url: str) -> Scorer:
    try:
        return SCORERS[kind](client, url)
    except KeyError:
        raise NotSupported(f"no scorer for engine {kind!r}; one of {sorted(SCORERS)}") from None


@dataclass
class Agreement:
    """Recorded against recomputed logprobs over the sampled tokens of one sequence."""

    tokens: int  # sampled tokens compared (those with a recorded logprob)
    max_abs: float
    mean_abs: float
    kl: float  # k3 estimate of KL(behaviour ‖ recompute), from the behaviour's own samples
    parted_at: int | None  # index in the sequence of the first token past TOLERANCE

    @classmethod
    def of(
        cls, positions: Sequence[int], recorded: Sequence[float], recomputed: Sequence[float]
    ) -> Agreement:
        rec, new = np.asarray(recorded, float), np.asarray(recomputed, float)
        known = ~np.isnan(rec)
        d = rec[known] - new[known]
        if not len(d):
            return cls(0, math.nan, math.nan, math.nan, None)
        parted = np.flatnonzero(np.abs(d) > TOLERANCE)
        where = np.asarray(positions)[known]
        log_ratio = -d  # log(recompute / behaviour) at the behaviour's samples
        kl = float(np.mean(np.expm1(log_ratio) - log_ratio))
        return cls(
            int(len(d)),
            float(np.max(np.abs(d))),
            float(np.mean(np.abs(d))),
            kl,
            int(where[parted[0]]) if len(parted) else None,
        )


@dataclass
class Verified:
    """One trajectory's report: the exact record, and the naive (re-tokenized) one."""

    trajectory_id: str
    session_id: str
    engine: str
    versions: list[str]
    exact: Agreement
    naive: Agreement | None  # None: its text re-encodes to the same IDs (nothing to compare)
    naive_tokens_differ: bool
    naive_first_difference: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def naive_ids(tok: LoadedTokenizer, traj: Trajectory) -> tuple[list[int], list[int], list[float]]:
    """What a text pipeline trains on: each run of prompt and each completion decoded and encoded
    again, the engine's logprobs laid on the re-encoded completion by position (as such
    pipelines align them). Returns (ids, sampled positions, logprobs at them)."""
    ids: list[int] = []
    positions: list[int] = []
    logprobs: list[float] = []
    mask, lps = traj.loss_mask, traj.logprobs
    start = 0
    n = len(mask)
    while start < n:
        end = start
        while end < n and mask[end] == mask[start]:
            end += 1
        piece = tok.encode(tok.decode(traj.token_ids[start:end].tolist()))
        if mask[start]:
            positions += range(len(ids), len(ids) + len(piece))
            engine = lps[start:end].tolist()
            logprobs += [engine[i] if i < len(engine) else math.nan for i in range(len(piece))]
        ids += piece
        start = end
    return ids, positions, logprobs


async def verify(traj: Trajectory, engine: Scorer, tok: LoadedTokenizer | None) -> Verified:
    """Score ``traj`` (and its naive version, when ``tok`` is given) with ``engine``."""
    ids = traj.token_ids.tolist()
    positions = np.flatnonzero(traj.loss_mask).tolist()
    recorded = traj.logprobs[positions].tolist()
    exact = Agreement.of(positions, recorded, await engine.score(ids, positions))
    versions = sorted({str(v) if v >= 0 else "none" for v in traj.versions[positions].tolist()})
    out = Verified(traj.id, traj.session_id, engine.name, versions, exact, None, False)
    if tok is None:
        return out
    nids, npos, nlps = naive_ids(tok, traj)
    if nids == ids:
        return out
    out.naive_tokens_differ = True
    out.naive_first_difference = next(
        (i for i, (a, b) in enumerate(zip(ids, nids, strict=False)) if a != b),
        min(len(ids), len(nids)),
    )
    out.naive = Agreement.of(npos, nlps, await engine.score(nids, npos))
    return out


async def verify_sessions(
    store: CallReader,
    kind: str,
    url: str,
    session_ids: Sequence[str],
    tok: LoadedTokenizer | None = None,
    timeout: float = 600.0,
) -> list[Verified]:
    """Every root-to-leaf trajectory of these sessions, scored by the engine at ``url``."""
    out = []
    async with httpx.AsyncClient(timeout=timeout) as client:
        engine = scorer(kind, client, url)
        for sid in session_ids:
            for traj in stitch(store.calls(sid)):
                out.append(await verify(traj, engine, tok))
    return out


def summary(results: Sequence[Verified]) -> list[dict]:
    """Per engine and weight version: trajectories, tokens, the worst and mean |Δ|, the mean KL,
    how many parted; the same for their naive versions."""
    groups: dict[tuple[str, str], list[Verified]] = {}
    for v in results:
        groups.setdefault((v.engine, ",".join(v.versions) or "-"), []).append(v)
    rows = []
    for (engine, version), vs in sorted(groups.items()):
        row = {"engine": engine, "weight_version": version, "trajectories": len(vs)}
        for arm in ("exact", "naive"):
            ags = [a for v in vs if (a := getattr(v, arm)) is not None and a.tokens]
            n = sum(a.tokens for a in ags)
            row[arm] = {
                "trajectories": len(ags),
                "tokens": n,
                "max_abs": max((a.max_abs for a in ags), default=math.nan),
                "mean_abs": sum(a.mean_abs * a.tokens for a in ags) / n if n else math.nan,
                "kl": sum(a.kl * a.tokens for a in ags) / n if n else math.nan,
                "parted": sum(a.parted_at is not None for a in ags),
            }
        row["naive_tokens_differ"] = sum(v.naive_tokens_differ for v in vs)
        rows.append(row)
    return rows


def rerendered(
    render: Callable[..., str],
    encode: Callable[[str], list[int]],
    messages: Sequence[dict],
    tools: list[dict] | None,
    turn_logprobs: Sequence[Sequence[float]],
) -> tuple[list[int], list[int], list[float]]:
    """What a chat-level pipeline trains on: the conversation the harness holds (parsed tool
    calls, text) rendered again through the template and encoded, each assistant turn's span
    found from the render of the messages before it, and the engine's logprobs of that turn
    laid on the span by position (NaN past the end). ``render(messages, tools, **kw)`` is the
    template (``Renderer.render``); ``encode`` the tokenizer. Returns (ids, the assistant
    positions, their logprobs)."""
    ids = encode(render(list(messages), tools, add_generation_prompt=False))
    positions: list[int] = []
    logprobs: list[float] = []
    turn = 0
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        start = len(encode(render(list(messages[:k]), tools, add_generation_prompt=True)))
        end = len(encode(render(list(messages[: k + 1]), tools, add_generation_prompt=False)))
        engine = list(turn_logprobs[turn]) if turn < len(turn_logprobs) else []
        turn += 1
        n = min(end, len(ids)) - start
        positions += range(start, start + n)
        logprobs += [engine[i] if i < len(engine) else math.nan for i in range(n)]
    return ids, positions, logprobs
