"""Stitch recorded calls into training samples, in one of two modes, from the same records.

``merged`` (default): one sample per root-to-leaf path of a session's call tree. Each call
contributes its prompt delta (mask 0, logprob 0) then its completion (mask 1, the engine's
logprobs). Because a child's prompt *is* its parent's prompt + completion + delta, the
concatenation along a path equals exactly the last call's prompt + completion: the sequence
the engine saw and sampled. A call that started a new segment (history rewritten, template not
prefix-preserving) has no parent, so it roots a sample of its own.

``per_call``: one sample per call: its full prompt (mask 0) then its completion (mask 1).

Only calls with status ``ok`` take part (an aborted or failed call never reached the harness,
so nothing extends it). Arrays are numpy: int32 token IDs, int8 mask, float32 logprobs (NaN
where the engine sampled a token but reported no logprob), int64 versions (-1 where not
sampled or not reported). ``Trajectory.to_json`` gives the API/JSONL shape (NaN/-1 → null).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .records import CallRecord

MODES = ("merged", "per_call")
LINEAGES = ("all", "main", "side")  # which lineages' samples a caller asks for
NO_VERSION = -1
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class Trajectory:
    """One training sample in canonical form (see docs/schema.md, ``trajectory``)."""

    id: str
    session_id: str
    call_ids: list[str]
    token_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # int8 [T], 1 exactly on sampled tokens
    logprobs: np.ndarray  # float32 [T], 0 where mask is 0, NaN where unknown
    versions: np.ndarray  # int64 [T], policy version per sampled token, -1 elsewhere
    prompt_len: int  # tokens before the first sampled token of the sample
    turns: list[dict]
    segment_reason: str | None = None
    segment_detail: str | None = None
    fingerprint: str | None = None
    mode: str = "merged"
    # the conversation this sample belongs to (the id of the call that began it: a rewrite
    # of a conversation stays in its lineage) and whether that is the session's ``main``
    # lineage (the one with the most calls: the agent's own) or a ``side`` one (a title or
    # summary request, a sub-agent): ``chat.lineages``
    lineage: str | None = None
    lineage_role: str | None = None
    # session-level fields, filled in by ``with_session``
    group_id: str | None = None
    sample_index: int | None = None
    task_id: str | None = None
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    status: str | None = None
    metadata: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def weight_versions(self) -> list[str | None]:
        """The weight version each call reported, in path order (raw, as the engine said)."""
        return [t["weight_version"] for t in self.turns]

    def with_session(self, session: dict | None) -> Trajectory:
        """Copy the rollout's group/sample/task ids, rewards and status onto the sample."""
        if session:
            self.group_id = session.get("group_id")
            self.sample_index = session.get("sample_index")
            self.task_id = session.get("task_id")
            self.reward = session.get("reward")
            self.rewards = dict(session.get("rewards") or {})
            self.status = session.get("status")
            self.metadata = session.get("metadata") or {}
            call_rewards = session.get("call_rewards") or {}
            for t in self.turns:
                r = call_rewards.get(t["call_id"])
                t["reward"] = r["reward"] if r else None
                t["rewards"] = r["rewards"] if r else {}
        return self

    def to_json(self) -> dict:
        lp = self.logprobs.astype(np.float64)
        versions = self.versions.tolist()
        return {
            "id": self.id,
            "session_id": self.session_id,
            "mode": self.mode,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "task_id": self.task_id,
            "call_ids": list(self.call_ids),
            "token_ids": self.token_ids.tolist(),
            "loss_mask": self.loss_mask.tolist(),
            "logprobs": [None if x != x else x for x in lp.tolist()],
            "versions": [None if v == NO_VERSION else v for v in versions],
            "prompt_len": self.prompt_len,
            "num_turns": self.num_turns,
            "turns": self.turns,
            "segment_reason": self.segment_reason,
            "segment_detail": self.segment_detail,
            "lineage": self.lineage,
            "lineage_role": self.lineage_role,
            "fingerprint": self.fingerprint,
            "reward": self.reward,
            "rewards": self.rewards,
            "status": self.status,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, d: dict) -> Trajectory:
        """Back from the API/JSONL shape (null logprob → NaN, null version → -1)."""
        lp = np.array([np.nan if x is None else x for x in d["logprobs"]], dtype=np.float32)
        versions = np.array(
            [
                NO_VERSION if v is None else v
                for v in d.get("versions") or [None] * len(d["token_ids"])
            ],
            dtype=np.int64,
        )
        return cls(
            id=d["id"],
            session_id=d["session_id"],
            call_ids=list(d["call_ids"]),
            token_ids=np.asarray(d["token_ids"], dtype=np.int32),
            loss_mask=np.asarray(d["loss_mask"], dtype=np.int8),
            logprobs=lp,
            versions=versions,
            prompt_len=int(d["prompt_len"]),
            turns=list(d["turns"]),
            segment_reason=d.get("segment_reason"),
            segment_detail=d.get("segment_detail"),
            lineage=d.get("lineage"),
            lineage_role=d.get("lineage_role"),
            fingerprint=d.get("fingerprint"),
            mode=d.get("mode", "merged"),
            group_id=d.get("group_id"),
            sample_index=d.get("sample_index"),
            task_id=d.get("task_id"),
            reward=d.get("reward"),
            rewards=d.get("rewards") or {},
            status=d.get("status"),
            metadata=d.get("metadata") or {},
        )


def version_number(v: Any) -> int:
    """A weight version as an integer for the per-token ``versions`` array: ints and integer
    strings ("12") map to themselves; anything else (None, hashes, names) to -1. The raw value
    stays in ``turns[i].weight_version``."""
    if isinstance(v, bool) or v is None:
        return NO_VERSION
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        s = v.strip()
        # ASCII digits only: "²".isdigit() is True and "--5" has digits after lstrip("-")
        v = int(s) if _INTEGER.fullmatch(s) else None
    if isinstance(v, int) and _INT64_MIN <= v <= _INT64_MAX:
        return v
    return NO_VERSION  # a name, a hash, or a number no int64 holds (the raw value is kept)


def _completion_versions(c: CallRecord, n: int) -> np.ndarray | int:
    """Per-token versions of one completion (``n`` tokens): a per-token list if the engine
    gave one, otherwise the call's single version (broadcast by the caller)."""
    wv = c.info.get("weight_version")
    if isinstance(wv, list) and len(wv) == n:
        return np.array([version_number(v) for v in wv], dtype=np.int64)
    return version_number(wv)


def _raw_version(c: CallRecord) -> str | None:
    wv = c.info.get("weight_version")
    if wv is None:
        return None
    if isinstance(wv, list):
        known = [v for v in wv if v is not None]
        return str(known[-1]) if known else None
    return str(wv)


def lineages(calls: list[CallRecord]) -> tuple[dict[str, str], str | None]:
    """Each ``ok`` call's lineage (the id of the call that began its conversation) and the
    session's main lineage: the one with the most calls (the earliest begun on a tie). A
    segment root names the call whose conversation it rewrites (``info.lineage``); a root
    that names none begins a lineage of its own."""
    ok = {c.id: c for c in calls if c.status == "ok"}
    memo: dict[str, str] = {}

    def of(cid: str) -> str:
        path = []
        while cid not in memo:
            path.append(cid)
            c = ok[cid]
            nxt = c.parent_id or c.info.get("lineage")
            if nxt is None or nxt not in ok or nxt in path:
                memo[cid] = cid  # begins a lineage
                break
            cid = nxt
        for p in path:
            memo[p] = memo[cid]
        return memo[cid]

    out = {cid: of(cid) for cid in ok}
    sizes: dict[str, int] = {}
    for lin in out.values():
        sizes[lin] = sizes.get(lin, 0) + 1
    main = min(sizes, key=lambda lin: (-sizes[lin], ok[lin].seq)) if sizes else None
    return out, main


def stitch(calls: list[CallRecord], mode: str = "merged", which: str = "all") -> list[Trajectory]:
    """Training samples of one session's calls (ordered by ``seq``); ``which``: all of them,
    or only the ``main`` lineage's, or only the ``side`` ones' (:func:`lineages`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if which not in LINEAGES:
        raise ValueError(f"lineages must be one of {LINEAGES}, not {which!r}")
    ok = [c for c in calls if c.status == "ok"]
    by_id = {c.id: c for c in ok}
    lineage, main = lineages(ok)
    out = []
    if mode == "merged":
        has_child = {c.parent_id for c in ok if c.parent_id}
        targets = [c for c in ok if c.id not in has_child]
    else:
        targets = ok
    for last in targets:
        path = [last]
        while path[-1].parent_id is not None and path[-1].parent_id in by_id:
            path.append(by_id[path[-1].parent_id])
        path.reverse()
        t = _flatten(path, mode)
        t.lineage = lineage[last.id]
        t.lineage_role = "main" if t.lineage == main else "side"
        if which == "all" or which == t.lineage_role:
            out.append(t)
    return out


def trajectories(calls: list[CallRecord], mode: str = "merged") -> list[dict]:
    """JSON-ready samples (the ``/trajectories`` route's shape, without session fields)."""
    return [t.to_json() for t in stitch(calls, mode)]


def _flatten(path: list[CallRecord], mode: str) -> Trajectory:
    per_call = mode == "per_call"
    pieces: list[np.ndarray] = []
    for c in path:
        pieces.append(np.frombuffer(c.prompt_delta, dtype=np.int32))
        pieces.append(np.frombuffer(c.completion_ids, dtype=np.int32))
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(lengths)
    ids = np.concatenate(pieces)
    total = len(ids)
    first = len(path) - 1 if per_call else 0  # calls whose completion is sampled here
    mask = np.zeros(total, dtype=np.int8)
    logprobs = np.zeros(total, dtype=np.float32)
    versions = np.full(total, NO_VERSION, dtype=np.int64)
    turns: list[dict] = []
    for i in range(first, len(path)):
        c = path[i]
        start, end = int(ends[2 * i]), int(ends[2 * i + 1])  # the completion
        prompt_start = 0 if per_call else int(ends[2 * i] - lengths[2 * i])
        mask[start:end] = 1
        logprobs[start:end] = np.frombuffer(c.completion_logprobs, dtype=np.float32)
        versions[start:end] = _completion_versions(c, end - start)
        sampling = c.info.get("sampling") or {}
        turns.append(
            {
                "call_id": c.id,
                "seq": c.seq,
                "prompt_start": prompt_start,
                "completion_start": start,
                "completion_end": end,
                "finish_reason": c.finish_reason,
                "seam": c.seam,
                "weight_version": _raw_version(c),
                "temperature": sampling.get("temperature"),
                "reward": None,
                "rewards": {},
            }
        )
    root, target = path[0], path[-1]
    return Trajectory(
        id=target.id,
        session_id=root.session_id,
        call_ids=[target.id] if per_call else [c.id for c in path],
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        versions=versions,
        prompt_len=turns[0]["completion_start"],
        turns=turns,
        segment_reason=root.segment_reason,
        segment_detail=root.info.get("segment_detail"),
        fingerprint=root.info.get("fingerprint"),
        mode=mode,
    )
