"""Stitch recorded calls into training samples, in one of two modes, from the same records.

``merged`` (default): one sample per root-to-leaf path of a session's call tree. Each call
contributes its prompt delta (mask 0, logprob 0) then its completion (mask 1, the engine's
logprobs). Because a child's prompt *is* its parent's prompt + completion + delta, the
concatenation along a path equals exactly the last call's prompt + completion: the sequence
the engine saw and sampled. A call that started a new segment (history rewritten, template not
prefix-preserving) has no parent, so it roots a sample of its own.

``per_call``: one sample per call: its full prompt (mask 0) then its completion (mask 1).

Per-token arrays (``turnstile.token_arrays``: routed experts, weight versions) are laid on the
sample's positions from each call's rows: a reused prefix's rows from the first call on the path
that recorded them, with an int8 ``<name>_present`` mask (0 where no call recorded a row).

Only calls with status ``ok`` take part (an aborted or failed call never reached the harness,
so nothing extends it). Arrays are numpy: int32 token IDs, int8 mask, float32 logprobs (NaN
where the engine sampled a token but reported no logprob), int64 versions (-1 where not
sampled or not reported). ``Trajectory.to_json`` gives the API/JSONL shape (NaN/-1 → null).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..token_arrays import DECLARED, WEIGHT_VERSION, Piece
from ..token_arrays import stitch as stitch_rows
from ..token_arrays import version_number as _version_number
from .held import HoldOptions, kept
from .records import CallRecord

MODES = ("merged", "per_call")
LINEAGES = ("all", "main", "side")  # which lineages' samples a caller asks for
NO_VERSION = -1


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
    # per-token arrays by declared name ([T, *trailing], aligned with token_ids) and their
    # presence masks (int8 [T], 1 where a call recorded the row); only arrays some call has
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    present: dict[str, np.ndarray] = field(default_factory=dict)
    # the images the sample's tokens hold: per image its sha256, MIME type and the span of
    # its block in ``token_ids`` (``offset``, ``length``); the bytes by hash from the store
    images: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def behaviour_mask(self) -> np.ndarray:
        """int8 [T]: 1 on each sampled token whose recorded logprob is the log-probability
        under the distribution it was sampled from (its call's ``behaviour_exact``), so a
        TIS/MIS correction may divide by it; 0 elsewhere (prompt tokens, a call whose logprobs
        are raw or scaled under truncation, or a record too old to say)."""
        out = np.zeros(len(self.token_ids), dtype=np.int8)
        for t in self.turns:
            if t.get("behaviour_exact"):
                out[t["completion_start"] : t["completion_end"]] = 1
        return out & self.loss_mask.astype(np.int8)

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
            **self.arrays_json(),
            **({"images": self.images} if self.images else {}),
        }

    def arrays_json(self) -> dict:
        """The per-token arrays as JSON keys: ``<name>`` (nested lists) and
        ``<name>_present`` (0/1), only for arrays some call of the sample recorded."""
        out: dict = {}
        for name, values in self.arrays.items():
            out[name] = values.tolist()
            out[f"{name}_present"] = self.present[name].tolist()
        return out

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
            images=list(d.get("images") or []),
            group_id=d.get("group_id"),
            sample_index=d.get("sample_index"),
            task_id=d.get("task_id"),
            reward=d.get("reward"),
            rewards=d.get("rewards") or {},
            status=d.get("status"),
            metadata=d.get("metadata") or {},
            **_arrays_from_json(d),
        )


def _arrays_from_json(d: dict) -> dict:
    arrays, present = {}, {}
    for name, decl in DECLARED.items():
        if decl.own_key and d.get(name) is not None:
            wide = np.dtype(decl.dtypes[-1])
            if wide.kind == "f":  # JSON writes NaN (an absent value) as null
                arrays[name] = np.asarray(d[name], dtype=np.float64).astype(wide)
            else:
                values = np.asarray(d[name])
                arrays[name] = values.astype(
                    decl.dtypes[0] if values.size == 0 or values.max() < 256 else wide
                )
            present[name] = np.asarray(d.get(f"{name}_present") or [], dtype=np.int8)
    return {"arrays": arrays, "present": present}


def version_number(v: Any) -> int:
    """A weight version as an integer for the per-token ``versions`` array: ints and integer
    strings ("12") map to themselves; anything else (None, hashes, names) to -1. The raw value
    stays in ``turns[i].weight_version``."""
    return _version_number(v)


def _completion_versions(c: CallRecord, n: int) -> np.ndarray | int:
    """Per-token versions of one completion (``n`` tokens) where the record predates the
    ``weight_version`` array (a per-token list in ``info``), otherwise the call's single
    version (broadcast by the caller; the array, where recorded, is laid over it)."""
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


def stitch(
    calls: list[CallRecord],
    mode: str = "merged",
    which: str = "all",
    hold: HoldOptions | None = None,
) -> list[Trajectory]:
    """Training samples of one session's calls (ordered by ``seq``); ``which``: all of them,
    or only the ``main`` lineage's, or only the ``side`` ones' (:func:`lineages`); ``hold``:
    the loss masks asked of calls weight updates reached (``held``)."""
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
        t = _flatten(path, mode, hold)
        t.lineage = lineage[last.id]
        t.lineage_role = "main" if t.lineage == main else "side"
        if which == "all" or which == t.lineage_role:
            out.append(t)
    return out


def trajectories(calls: list[CallRecord], mode: str = "merged") -> list[dict]:
    """JSON-ready samples (the ``/trajectories`` route's shape, without session fields)."""
    return [t.to_json() for t in stitch(calls, mode)]


def _flatten(path: list[CallRecord], mode: str, hold: HoldOptions | None = None) -> Trajectory:
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
    held: list[tuple[int, int, np.ndarray]] = []  # completions ``hold`` masks (``held.kept``)
    for i in range(first, len(path)):
        c = path[i]
        start, end = int(ends[2 * i]), int(ends[2 * i + 1])  # the completion
        prompt_start = 0 if per_call else int(ends[2 * i] - lengths[2 * i])
        mask[start:end] = 1
        masked = kept(c, end - start, hold) if hold is not None and hold.active else None
        if masked is not None:
            held.append((start, end, masked))
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
                # for importance weights (TIS, MIS/IcePop): what the logprobs are, and whether
                # they are the distribution the call sampled from (None: an older record)
                "logprob_kind": c.info.get("logprob_kind"),
                "behaviour_exact": (c.info.get("behaviour_logprobs") or {}).get("exact"),
                "reward": None,
                "rewards": {},
            }
        )
    arrays, present = _stitched(path, first, total)
    if WEIGHT_VERSION.name in arrays:
        laid = present.pop(WEIGHT_VERSION.name).astype(bool) & (mask == 1)
        versions[laid] = arrays.pop(WEIGHT_VERSION.name)[laid]
    for start, end, masked in held:  # after the versions are laid: masked tokens keep theirs
        mask[start:end] = masked
        logprobs[start:end][masked == 0] = 0.0
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
        arrays=arrays,
        present=present,
        images=[  # the last call's prompt holds every image of the path, at its place
            {"sha256": m.sha256, "mime": m.mime, "offset": m.offset, "length": m.length}
            for m in target.media
        ],
    )


def _stitched(
    path: list[CallRecord], first: int, total: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each declared array some call on ``path`` recorded, on the sample's ``total``
    positions (calls from ``first`` on are sampled here), with its presence mask."""
    names = {n for c in path for n in c.arrays}
    arrays, present = {}, {}
    for name in sorted(names):
        decl = DECLARED.get(name)
        if decl is None:
            continue  # recorded by a newer Turnstile: not this one's to lay out
        got = stitch_rows(
            decl,
            total,
            (Piece(c.arrays[name], 0, i >= first) for i, c in enumerate(path) if name in c.arrays),
        )
        if got is not None:
            arrays[name], present[name] = got
    return arrays, present
