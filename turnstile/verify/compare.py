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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from ..chat.loaded_tokenizer import LoadedTokenizer
from ..store.contracts import CallReader
from ..store.records import CallRecord
from ..store.trajectories import Trajectory, stitch
from ..token_arrays import span_versions
from .routing import NAME as ROUTED
from .routing import TIE_NOTE, UNKNOWN, RoutingAgreement, diagnosis
from .routing import agreement as routing_agreement
from .routing import decode as decode_routing
from .sampling import Sampling
from .scorers import TOLERANCE, Scorer, scorer


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
    # the recorded routed experts against the re-feed's (None: none recorded, or an engine
    # that re-feeds no routing); ``diagnosis``: what logprobs and routing together say
    # (``routing.diagnosis``; "unknown" where a figure is missing)
    routing: RoutingAgreement | None = None
    diagnosis: str = UNKNOWN
    # the exact arm per weight version of the sampled tokens (raw, from each call's spans: a
    # call held across a weight sync has one entry per version its chunks were sampled by)
    by_version: dict[str, Agreement] = field(default_factory=dict)

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
    routed = ROUTED in traj.arrays and bool(getattr(engine, "routes", False))
    if routed:
        engine.want_routing = True  # type: ignore[attr-defined]
    try:
        scores, refused = await _score(engine, ids, positions, turn_of, per_turn, notes, call_ids)
    finally:
        if routed:
            engine.want_routing = False  # type: ignore[attr-defined]
    exact = Agreement.of(positions, recorded, scores, refused, engine.tolerance)
    versions = sorted({str(v) if v >= 0 else "none" for v in traj.versions[positions].tolist()})
    out = Verified(traj.id, traj.session_id, engine.name, versions, exact, None, False)
    out.notes = notes
    out.by_version = _by_version(
        traj, calls, positions, turn_of, recorded, scores, refused, engine.tolerance
    )
    if routed:
        out.routing = _routing(traj, engine, ends, notes)
    parted = None if not exact.tokens else exact.parted_at is not None
    out.diagnosis = diagnosis(parted, out.routing.share if out.routing else None)
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


def token_versions(
    traj: Trajectory,
    calls: Mapping[str, CallRecord] | None,
    positions: Sequence[int],
    turn_of: Sequence[int],
) -> list[str]:
    """The weight version that sampled each of ``positions``, raw as the record has it: from
    its call's spans (``info.weight_versions``: per chunk of a held call, or the engine's own
    spans), else the trajectory's integer version ("none" where neither knows)."""
    per_turn: list[list | None] = []
    for t in traj.turns:
        rec = calls.get(t["call_id"]) if calls else None
        n = int(t["completion_end"]) - int(t["completion_start"])
        per_turn.append(span_versions(rec.info.get("weight_versions"), n) if rec else None)
    out = []
    for p, k in zip(positions, turn_of, strict=True):
        raw = per_turn[k]
        i = p - int(traj.turns[k]["completion_start"])
        v = raw[i] if raw is not None and 0 <= i < len(raw) else None
        if v is None:
            n = int(traj.versions[p])
            v = n if n >= 0 else "none"
        out.append(str(v))
    return out


def _by_version(
    traj: Trajectory,
    calls: Mapping[str, CallRecord] | None,
    positions: Sequence[int],
    turn_of: Sequence[int],
    recorded: Sequence[float],
    scores: Sequence[float],
    refused: Sequence[bool],
    tolerance: float,
) -> dict[str, Agreement]:
    """The exact arm split by the version that sampled each token (:func:`token_versions`)."""
    of = token_versions(traj, calls, positions, turn_of)
    out = {}
    for ver in sorted(set(of)):
        idx = [i for i, v in enumerate(of) if v == ver]
        out[ver] = Agreement.of(
            [positions[i] for i in idx],
            [recorded[i] for i in idx],
            [scores[i] for i in idx],
            [refused[i] for i in idx],
            tolerance,
        )
    return out


def _routing(
    traj: Trajectory, engine: Scorer, ends: Sequence[int], notes: list[str]
) -> RoutingAgreement:
    """The recorded rows against the re-feed's; each position's rows are attributed to the
    weight version of the call whose span holds it (the call that forwarded it)."""
    rec, present = traj.arrays[ROUTED], traj.present[ROUTED]
    refed = None
    try:
        refed = decode_routing(
            getattr(engine, "last_routing", None),
            bool(getattr(engine, "routing_npy", False)),
            rec.shape[1],
            rec.shape[2],
        )
    except ValueError as exc:
        notes.append(f"the re-feed's routing could not be read: {exc}")
    if refed is None:
        notes.append("the engine re-fed no routing (is it started with routing on?)")
    turn_version = []
    for t in traj.turns:
        vs = traj.versions[int(t["completion_start"]) : int(t["completion_end"])]
        vs = vs[vs >= 0]
        turn_version.append(str(int(vs[0])) if len(vs) else "none")
    k = 0
    version_of = []
    for p in range(len(traj.token_ids)):
        while k < len(ends) - 1 and p >= ends[k]:
            k += 1
        version_of.append(turn_version[k] if turn_version else "none")
    got = routing_agreement(rec, present, refed, version_of)
    if got.agree < got.rows:
        notes.append(TIE_NOTE)
    return got


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
    how many parted; the same for their naive versions; ``by_version``: the exact arm per
    version that sampled the tokens (each chunk of a held call under its own)."""
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
        row["by_version"] = _version_summary(vs)
        row["naive_tokens_differ"] = sum(v.naive_tokens_differ for v in vs)
        row["routing"] = _routing_summary(vs)
        row["diagnosis"] = {d: sum(v.diagnosis == d for v in vs) for d in _diagnoses(vs)}
        rows.append(row)
    return rows


def _version_summary(vs: Sequence[Verified]) -> dict[str, dict]:
    """Per version that sampled the tokens (a held call's chunks apart): tokens compared, the
    worst and mean |Δ|, the KL, how many trajectories parted within that version's tokens."""
    per: dict[str, list[Agreement]] = {}
    for v in vs:
        for ver, a in v.by_version.items():
            per.setdefault(ver, []).append(a)
    out = {}
    for ver, all_ags in sorted(per.items()):
        ags = [a for a in all_ags if a.tokens]
        n = sum(a.tokens for a in ags)
        out[ver] = {
            "tokens": n,
            "max_abs": max((a.max_abs for a in ags), default=math.nan),
            "mean_abs": sum(a.mean_abs * a.tokens for a in ags) / n if n else math.nan,
            "kl": sum(a.kl * a.tokens for a in ags) / n if n else math.nan,
            "parted": sum(a.parted_at is not None for a in ags),
            "refused": sum(a.refused for a in all_ags),
        }
    return out


def _diagnoses(vs: Sequence[Verified]) -> list[str]:
    return sorted({v.diagnosis for v in vs})


def _routing_summary(vs: Sequence[Verified]) -> dict | None:
    """The group's routing rows: compared, agreeing (as expert sets), the share, the rows
    absent on either side, and per weight version (None: no trajectory had routing)."""
    ras = [v.routing for v in vs if v.routing is not None]
    if not ras:
        return None
    rows, agree = sum(r.rows for r in ras), sum(r.agree for r in ras)
    per: dict[str, dict[str, float]] = {}
    for r in ras:
        for ver, c in r.by_version.items():
            d = per.setdefault(ver, {"rows": 0, "agree": 0})
            d["rows"] += c["rows"]
            d["agree"] += c["agree"]
    for d in per.values():
        d["share"] = d["agree"] / d["rows"] if d["rows"] else math.nan
    return {
        "trajectories": len(ras),
        "rows": rows,
        "agree": agree,
        "share": agree / rows if rows else math.nan,
        "absent_recorded": sum(r.absent_recorded for r in ras),
        "absent_refeed": sum(r.absent_refeed for r in ras),
        "disagreeing_trajectories": sum(r.agree < r.rows for r in ras),
        "by_version": per,
    }


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
