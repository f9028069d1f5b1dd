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

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import httpx
import numpy as np

from .chat.loaded_tokenizer import LoadedTokenizer
from .engines.base import PROCESSED_LOGPROBS, RAW_LOGPROBS, SCALED_LOGPROBS
from .store.contracts import CallReader
from .store.records import CallRecord
from .store.trajectories import Trajectory, stitch

TOLERANCE = 1e-3  # |Δ logprob| past which a token parts, for an f32 engine (llama-server)
# The same for a bf16 engine (vLLM, SGLang): its sampling (decode) and its recompute (prefill)
# round differently; measured on the test bed's vLLM (docs/verification.md)
BF16_TOLERANCE = 0.5
# alternatives asked per position where the sampler's cut must be recomputed: vLLM refuses
# more than its --max-logprobs (20 unless raised); the scorer then asks for that many
TOP_N = 128
# A recomputed processed logprob is known to within ± its half-width (the tail past the top N
# bounds it); past this the token is left out as undecided (counted, never silently).
BOUND = 0.02
MASKED = -100.0  # the recompute's logprob for a token the recorded sampling could not sample
VOCAB_BOUND = 2**18  # at most this many tokens in a vocabulary (bounds a tail at T > 1)
_GREEDY_EPS = 1e-5  # vLLM: a temperature below this is greedy


@dataclass(frozen=True)
class Sampling:
    """What one recorded call was sampled under (its record's ``info.sampling`` and
    ``info.logprob_kind``), which decides what its recorded logprobs should equal."""

    kind: str = RAW_LOGPROBS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    constrained: bool = False  # a grammar or JSON schema masked the distribution
    start: int = 0  # where the call's completion starts in the scored sequence (penalties)

    @classmethod
    def of(cls, info: dict, start: int = 0) -> Sampling:
        sp = info.get("sampling") or {}
        return cls(
            kind=info.get("logprob_kind") or RAW_LOGPROBS,
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k") or 0),
            min_p=float(sp.get("min_p") or 0.0),
            logit_bias=tuple(
                sorted((int(k), float(v)) for k, v in (sp.get("logit_bias") or {}).items())
            ),
            presence_penalty=float(sp.get("presence_penalty") or 0.0),
            frequency_penalty=float(sp.get("frequency_penalty") or 0.0),
            repetition_penalty=float(sp.get("repetition_penalty") or 1.0),
            constrained=bool(sp.get("grammar") or sp.get("json_schema")),
            start=start,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def needs_distribution(self) -> bool:
        """Does the recorded logprob depend on more than the token's own raw logprob?"""
        if self.kind == RAW_LOGPROBS:
            return False
        cut = not self.greedy and (self.top_p < 1 or self.top_k > 0 or self.min_p > 0)
        scaled = not self.greedy and not math.isclose(self.temperature, 1.0)
        pen = self.kind == PROCESSED_LOGPROBS and (self.presence_penalty or self.frequency_penalty)
        return bool(self.logit_bias or pen or scaled or (self.kind == PROCESSED_LOGPROBS and cut))

    def refusal(self) -> str | None:
        """Why this call's logprobs cannot be recomputed from the model's raw distribution."""
        if self.kind not in (RAW_LOGPROBS, SCALED_LOGPROBS, PROCESSED_LOGPROBS):
            return f"its logprobs are {self.kind}, not logprobs of a distribution"
        if self.constrained:
            return (
                "a grammar-forced call: the engine masked its distribution (raw and processed "
                "logprobs alike) with a grammar state that is not recomputed here"
            )
        if self.kind == PROCESSED_LOGPROBS and self.repetition_penalty != 1.0:
            return (
                "repetition_penalty in processed_logprobs mode: it scales logits by their sign, "
                "which logprobs do not keep"
            )
        if self.kind == PROCESSED_LOGPROBS and (
            self.presence_penalty < 0 or self.frequency_penalty < 0
        ):
            return "a negative presence/frequency penalty raises tokens past the known top N"
        return None


def recompute(
    known: dict[int, float],
    floor: float,
    target: int,
    s: Sampling,
    counts: dict[int, int] | None = None,
    vocab: int = VOCAB_BOUND,
) -> tuple[float, float]:
    """The logprob of ``target`` that the recorded call's mode should have given, from the raw
    logprobs ``known`` of the top N tokens (and the target); ``floor`` is the N-th best raw
    logprob, above which no unknown token lies. Follows vLLM's sampler (0.32, ``v1/sample``):
    logit bias, then presence/frequency penalties (``counts``: the call's output so far), then
    temperature, then min-p, top-k, top-p (kept: the tokens with less than p of the mass
    above them). The unknown tail is carried as bounds on its mass; returns the midpoint and
    the half-width of the interval the true value lies in (0 when decided exactly)."""
    if not s.needs_distribution:
        return known[target], 0.0
    if not math.isfinite(floor):
        return math.nan, math.inf  # no top N to bound the rest by
    toks = np.fromiter(known, dtype=np.int64, count=len(known))
    raw = np.fromiter(known.values(), dtype=np.float64, count=len(known))
    tail_raw = max(0.0, 1.0 - float(np.exp(raw).sum()))
    u = raw.copy()
    lowered = 0  # tail tokens pushed down (their mass may leave the tail)
    index = {int(t): i for i, t in enumerate(toks)}
    for tok, b in s.logit_bias:
        if tok in index:
            u[index[tok]] += b
        elif b > 0:
            return math.nan, math.inf  # an unknown token raised: it may lead
        else:
            lowered += 1
    if s.kind == PROCESSED_LOGPROBS:
        for tok, c in (counts or {}).items():
            pen = s.presence_penalty + s.frequency_penalty * c
            if pen and tok in index:
                u[index[tok]] -= pen
            elif pen:
                lowered += 1
    t = 1.0 if s.greedy else s.temperature
    w = u / t
    top = floor / t  # no unknown token scores above this
    # bounds on the tail's scaled mass, sum over unknown j of exp(a_j / t)
    low_raw = max(0.0, tail_raw - lowered * math.exp(floor))
    unknown = max(1, vocab - len(known))
    if t <= 1.0:
        hi = tail_raw * math.exp(floor * (1 / t - 1))
        lo = 0.0 if t < 1.0 else low_raw
    else:
        hi = min(tail_raw ** (1 / t) * unknown ** (1 - 1 / t), unknown * math.exp(top))
        lo = low_raw ** (1 / t)
    sure = np.ones(len(w), bool)  # known tokens certainly kept
    maybe = np.zeros(len(w), bool)  # known tokens perhaps kept
    tail = "all"  # the tail: all of it kept, "some", or "none"
    processed = s.kind == PROCESSED_LOGPROBS and not s.greedy
    if processed and s.min_p > 0:
        cut = float(w.max()) + math.log(s.min_p)
        sure &= w >= cut
        if top < cut:
            tail, hi, lo = "none", 0.0, 0.0
        else:
            tail, lo = "some", 0.0
    if processed and 0 < s.top_k < vocab:
        above = np.sort(w[sure & (w > top)])[::-1]
        if (tail == "none" or len(above) >= s.top_k) and sure.any():
            kth = np.sort(w[sure])[::-1][min(s.top_k, int(sure.sum())) - 1]
            sure &= w >= kth
            tail, hi, lo = "none", 0.0, 0.0
        else:
            low = sure & (w <= top)
            maybe |= low
            sure &= ~low
            tail, lo = "some", 0.0
    before_top_p = 0.0  # a lower bound on the mass top-p cuts from: it keeps at least p of it
    if processed and s.top_p < 1.0:
        e = np.exp(w)
        z_lo = before_top_p = float(e[sure].sum()) + lo
        z_hi = float(e[sure].sum() + e[maybe].sum()) + hi
        order = np.argsort(-w)
        mass = 0.0
        gone = False
        for i in order:
            if not (sure[i] or maybe[i]):
                continue
            if gone:
                sure[i] = maybe[i] = False
                continue
            if tail != "none" and w[i] <= top:
                sure[i], maybe[i] = False, True  # tail tokens may rank above it: open
                continue
            if mass >= s.top_p * z_hi:
                sure[i] = maybe[i] = False
                gone = True
            elif mass >= s.top_p * z_lo:
                sure[i], maybe[i] = False, True
            mass += float(e[i])
        if gone:
            tail, hi, lo = "none", 0.0, 0.0
        elif tail != "none":
            tail, lo = "some", 0.0
    ti = index[target]
    if not (sure[ti] or maybe[ti]):
        return MASKED, 0.0
    sure[ti], maybe[ti] = True, False  # it was sampled: it was kept
    e = np.exp(w)
    z_lo = float(e[sure].sum()) + lo
    z_hi = float(e[sure].sum() + e[maybe].sum()) + hi
    z_lo = max(z_lo, s.top_p * before_top_p)
    a, b = float(w[ti]) - math.log(z_hi), float(w[ti]) - math.log(z_lo)
    return (a + b) / 2, (b - a) / 2


def _counts(ids: Sequence[int], s: Sampling, p: int) -> dict[int, int]:
    out: dict[int, int] = {}
    if s.kind == PROCESSED_LOGPROBS and (s.presence_penalty or s.frequency_penalty):
        for t in ids[s.start : p]:
            out[t] = out.get(t, 0) + 1
    return out


class Scorer(Protocol):
    """An engine that gives, for each ``p``, the logprob of ``ids[p]`` after ``ids[:p]`` as the
    recorded call's ``sampling[i]`` should have given it (NaN: undecided)."""

    name: str
    tolerance: float  # |Δ| past which a token parts: this engine's numerical noise

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]: ...

    def refusal(self, s: Sampling) -> str | None:
        """Why a call sampled so cannot be scored by this engine (None: it can)."""
        ...


class NotSupported(Exception):
    """This engine cannot score a given sequence."""


def _from_top(
    ids: Sequence[int],
    positions: Sequence[int],
    sampling: Sequence[Sampling],
    rows: Sequence[dict[int, float]],
    floors: Sequence[float],
) -> list[float]:
    out = []
    for p, s, known, floor in zip(positions, sampling, rows, floors, strict=True):
        value, half = recompute(known, floor, ids[p], s, _counts(ids, s, p))
        out.append(value if half <= BOUND else math.nan)
    return out


def _max_logprobs(said: str) -> int | None:
    """vLLM's ``--max-logprobs`` from its refusal of more ("... greater than max allowed:
    20"), or None when the refusal is about something else."""
    m = re.search(r"max allowed: ?(-?[0-9]+)", said)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


class VLLMScorer:
    """vLLM's ``/v1/completions`` with ``prompt_logprobs``: one call per trajectory. Prompt
    logprobs are the model's raw ones (vLLM computes them before any sampler step, whatever
    ``--logprobs-mode``); where the recorded mode includes the sampler's work, the top N of
    each position are asked for too (vLLM refuses N above its ``--max-logprobs``, 20 by
    default: the scorer falls back to it, leaving more tokens undecided) and the processed
    value is computed from them (:func:`recompute`)."""

    name = "vllm"
    tolerance = BF16_TOLERANCE

    def __init__(self, client: httpx.AsyncClient, url: str, top_n: int = TOP_N):
        self.client, self.url, self.top_n = client, url.rstrip("/"), top_n
        self.model: str | None = None

    def refusal(self, s: Sampling) -> str | None:
        return s.refusal()

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
        if self.model is None:
            models = (await self.client.get(self.url + "/v1/models")).json()
            self.model = models["data"][0]["id"]
        n = self.top_n if any(s.needs_distribution for s in sampling) else 0
        body = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": n,
        }
        r = await self.client.post(self.url + "/v1/completions", json=body)
        if r.status_code == 400 and n and (most := _max_logprobs(r.text)) is not None:
            self.top_n = n = body["prompt_logprobs"] = most  # its --max-logprobs, from now on
            r = await self.client.post(self.url + "/v1/completions", json=body)
        if r.status_code != 200:
            raise NotSupported(f"vLLM answered {r.status_code}: {r.text[:300]}")
        per_position = r.json()["choices"][0]["prompt_logprobs"]
        rows, floors = [], []
        for p in positions:
            entries = per_position[p]
            rows.append({int(k): float(v["logprob"]) for k, v in entries.items()})
            ranked = [float(v["logprob"]) for v in entries.values() if (v.get("rank") or 0) <= n]
            floors.append(min(ranked) if n and ranked else -math.inf)
        return _from_top(ids, positions, sampling, rows, floors)


class SGLangScorer:
    """SGLang's ``/generate`` with ``return_logprob`` from the first token; the top N input
    logprobs too where the recorded kind needs them (the same :func:`recompute`)."""

    name = "sglang"
    tolerance = BF16_TOLERANCE

    def __init__(self, client: httpx.AsyncClient, url: str, top_n: int = TOP_N):
        self.client, self.url, self.top_n = client, url.rstrip("/"), top_n

    def refusal(self, s: Sampling) -> str | None:
        return s.refusal()

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
        n = self.top_n if any(s.needs_distribution for s in sampling) else 0
        body: dict = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        if n:
            body["top_logprobs_num"] = n
        r = await self.client.post(self.url + "/generate", json=body)
        if r.status_code != 200:
            raise NotSupported(f"SGLang answered {r.status_code}: {r.text[:300]}")
        meta = r.json()["meta_info"]
        own = meta["input_token_logprobs"]
        tops = meta.get("input_top_logprobs") or [] if n else []
        rows, floors = [], []
        for p in positions:
            known = {int(ids[p]): float(own[p][0])}
            top = (tops[p] or []) if p < len(tops) else []
            known.update({int(t): float(v) for v, t, *_ in top})
            rows.append(known)
            floors.append(min((float(v) for v, *_ in top), default=-math.inf) if n else -math.inf)
        return _from_top(ids, positions, sampling, rows, floors)


class LlamaCppScorer:
    """llama-server: each token sampled again by force after its prefix (a +100 bias), its
    raw logprob read from ``completion_probabilities``; the prefix stays in the slot's cache,
    so each call evaluates one token. Raw logprobs only (what the llama-cpp adapter records)."""

    name = "llama-cpp"
    tolerance = TOLERANCE

    def __init__(self, client: httpx.AsyncClient, url: str):
        self.client, self.url = client, url.rstrip("/")

    def refusal(self, s: Sampling) -> str | None:
        if s.kind != RAW_LOGPROBS:
            return f"llama-server gives raw logprobs only; this call recorded {s.kind}"
        return None

    async def score(
        self, ids: Sequence[int], positions: Sequence[int], sampling: Sequence[Sampling]
    ) -> list[float]:
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


def scorer(kind: str, client: httpx.AsyncClient, url: str, top_n: int | None = None) -> Scorer:
    """The scorer of engine ``kind``; ``top_n``: the alternatives a vLLM/SGLang scorer asks
    for per position (default :data:`TOP_N`)."""
    try:
        made = SCORERS[kind](client, url)
    except KeyError:
        raise NotSupported(f"no scorer for engine {kind!r}; one of {sorted(SCORERS)}") from None
    if top_n is not None and isinstance(made, VLLMScorer | SGLangScorer):
        made.top_n = top_n
    return made


@dataclass
class Agreement:
    """Recorded against recomputed logprobs over the sampled tokens of one sequence."""

    tokens: int  # sampled tokens compared (a recorded logprob and a decided recompute)
    max_abs: float
    mean_abs: float
    kl: float  # k3 estimate of KL(behaviour ‖ recompute), from the behaviour's own samples
    parted_at: int | None  # index in the sequence of the first token past the tolerance
    undecided: int = 0  # tokens whose recompute the top N could not bound within BOUND
    refused: int = 0  # tokens of calls the engine cannot score (Verified.notes says why)

    @classmethod
    def of(
        cls,
        positions: Sequence[int],
        recorded: Sequence[float],
        recomputed: Sequence[float],
        refused: Sequence[bool] = (),
        tolerance: float = TOLERANCE,
    ) -> Agreement:
        """``refused``: per position, whether its call was refused (its recompute is NaN)."""
        rec, new = np.asarray(recorded, float), np.asarray(recomputed, float)
        gone = np.asarray(refused, bool) if len(refused) else np.zeros(len(rec), bool)
        undecided = int(np.sum(np.isnan(new) & ~np.isnan(rec) & ~gone))
        refused_n = int(gone.sum())
        known = ~np.isnan(rec) & ~np.isnan(new)
        d = rec[known] - new[known]
        if not len(d):
            return cls(0, math.nan, math.nan, math.nan, None, undecided, refused_n)
        parted = np.flatnonzero(np.abs(d) > tolerance)
        where = np.asarray(positions)[known]
        log_ratio = -d  # log(recompute / behaviour) at the behaviour's samples
        kl = float(np.mean(np.expm1(log_ratio) - log_ratio))
        return cls(
            int(len(d)),
            float(np.max(np.abs(d))),
            float(np.mean(np.abs(d))),
            kl,
            int(where[parted[0]]) if len(parted) else None,
            undecided,
            refused_n,
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
    ids, positions, logprobs, _ = _naive(tok, traj)
    return ids, positions, logprobs


def _naive(
    tok: LoadedTokenizer, traj: Trajectory
) -> tuple[list[int], list[int], list[float], list[int]]:
    """:func:`naive_ids`, and for each sampled position the index of its completion run."""
    ids: list[int] = []
    positions: list[int] = []
    logprobs: list[float] = []
    runs: list[int] = []
    mask, lps = traj.loss_mask, traj.logprobs
    start = 0
    run = 0
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
            runs += [run] * len(piece)
            run += 1
        ids += piece
        start = end
    return ids, positions, logprobs, runs


def samplings(traj: Trajectory, calls: Mapping[str, CallRecord] | None) -> list[Sampling]:
    """Each turn's :class:`Sampling`, from its call's record (raw logprobs when not given)."""
    out = []
    for t in traj.turns:
        rec = calls.get(t["call_id"]) if calls else None
        out.append(Sampling.of(rec.info if rec else {}, int(t["completion_start"])))
    return out


async def _score(
    engine: Scorer,
    ids: Sequence[int],
    positions: Sequence[int],
    turn_of: Sequence[int],
    per_turn: Sequence[Sampling],
    notes: list[str],
    call_ids: Sequence[str],
) -> tuple[list[float], list[bool]]:
    """The engine's recompute at ``positions`` (NaN where a call is refused), and which
    positions were refused; each refusal's reason goes into ``notes`` once per call."""
    reasons = [engine.refusal(s) for s in per_turn]
    for k, why in enumerate(reasons):
        if why and any(turn_of[i] == k for i in range(len(positions))):
            notes.append(f"call {call_ids[min(k, len(call_ids) - 1)]} not scored: {why}")
    refused = [bool(reasons[turn_of[i]]) for i in range(len(positions))]
    keep = [i for i in range(len(positions)) if not refused[i]]
    out = [math.nan] * len(positions)
    if keep:
        got = await engine.score(
            ids, [positions[i] for i in keep], [per_turn[turn_of[i]] for i in keep]
        )
        for i, v in zip(keep, got, strict=True):
            out[i] = v
    return out, refused


async def verify(
    traj: Trajectory,
    engine: Scorer,
    tok: LoadedTokenizer | None,
    calls: Mapping[str, CallRecord] | None = None,
) -> Verified:
    """Score ``traj`` (and its naive version, when ``tok`` is given) with ``engine``, each
    call's tokens under that call's recorded sampling and logprob kind (``calls``: the
    records by id; without them every logprob is taken as raw)."""
    ids = traj.token_ids.tolist()
    positions = np.flatnonzero(traj.loss_mask).tolist()
    recorded = traj.logprobs[positions].tolist()
    per_turn = samplings(traj, calls)
    call_ids = [str(t["call_id"]) for t in traj.turns]
    ends = [int(t["completion_end"]) for t in traj.turns]
    turn_of = [next(k for k, e in enumerate(ends) if p < e) for p in positions]
    notes: list[str] = []
    scores, refused = await _score(engine, ids, positions, turn_of, per_turn, notes, call_ids)
    exact = Agreement.of(positions, recorded, scores, refused, engine.tolerance)
    versions = sorted({str(v) if v >= 0 else "none" for v in traj.versions[positions].tolist()})
    out = Verified(traj.id, traj.session_id, engine.name, versions, exact, None, False)
    out.notes = notes
    if tok is None:
        return out
    nids, npos, nlps, runs = _naive(tok, traj)
    if nids == ids:
        return out
    out.naive_tokens_differ = True
    out.naive_first_difference = next(
        (i for i, (a, b) in enumerate(zip(ids, nids, strict=False)) if a != b),
        min(len(ids), len(nids)),
    )
    # each completion run is one turn; its start moves with the re-encoding
    starts = {runs[i]: npos[i] for i in range(len(npos)) if i == 0 or runs[i] != runs[i - 1]}
    naive_turns = [
        dataclasses.replace(per_turn[min(r, len(per_turn) - 1)], start=starts[r])
        for r in sorted(starts)
    ]
    nscores, nrefused = await _score(engine, nids, npos, runs, naive_turns, [], call_ids)
    out.naive = Agreement.of(npos, nlps, nscores, nrefused, engine.tolerance)
    return out


async def verify_sessions(
    store: CallReader,
    kind: str,
    url: str,
    session_ids: Sequence[str],
    tok: LoadedTokenizer | None = None,
    timeout: float = 600.0,
    top_n: int | None = None,
) -> list[Verified]:
    """Every root-to-leaf trajectory of these sessions, scored by the engine at ``url``."""
    out = []
    async with httpx.AsyncClient(timeout=timeout) as client:
        engine = scorer(kind, client, url, top_n)
        for sid in session_ids:
            calls = store.calls(sid)
            by_id = {c.id: c for c in calls}
            for traj in stitch(calls):
                out.append(await verify(traj, engine, tok, by_id))
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
                "undecided": sum(a.undecided for v in vs if (a := getattr(v, arm)) is not None),
                "refused": sum(a.refused for v in vs if (a := getattr(v, arm)) is not None),
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
