"""Shared pieces: prompt/response split, logprob filling, padding, rewards, GRPO groups."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from ..store.trajectories import NO_VERSION, Trajectory

#: What converters put where the engine sampled a token but reported no logprob (NaN in the
#: canonical record). NaN would reach the loss (NaN * 0 is still NaN in a masked mean), so
#: the default is a finite value; the positions filled are reported by each converter (see
#: :func:`filled_positions`). Pass ``fill_logprob=None`` to keep NaN.
DEFAULT_FILL = 0.0


def split(
    t: Trajectory, fill_logprob: float | None = DEFAULT_FILL
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(prompt_ids, response_ids, response_mask, response_logprobs, response_versions)``.

    The prompt is everything before the first sampled token (``prompt_len``); the response is
    the rest: sampled turns (mask 1) interleaved with observations (mask 0)."""
    p = t.prompt_len
    return (
        t.token_ids[:p],
        t.token_ids[p:],
        t.loss_mask[p:],
        logprobs(t, fill_logprob)[p:],
        t.versions[p:],
    )


def logprobs(t: Trajectory, fill: float | None = DEFAULT_FILL) -> np.ndarray:
    """The float32 logprobs, NaN (sampled, not reported) replaced by ``fill`` unless None."""
    if fill is None:
        return t.logprobs
    if not np.isfinite(fill):
        raise ValueError(f"fill_logprob must be finite (or None to keep NaN), not {fill}")
    return np.where(np.isnan(t.logprobs), np.float32(fill), t.logprobs).astype(np.float32)


def filled_positions(t: Trajectory, offset: int = 0) -> list[int]:
    """Token positions whose logprob the engine did not report (NaN in the record), shifted
    by ``-offset`` into a stack's layout (``prompt_len`` for response-aligned arrays, 1 for
    the next-token shift); positions that fall before the layout's start are dropped."""
    pos = np.flatnonzero(np.isnan(t.logprobs)) - offset
    return pos[pos >= 0].tolist()


def pad(
    rows: Sequence[np.ndarray], length: int, value: float, left: bool, dtype: type | np.dtype
) -> np.ndarray:
    """Stack 1-D arrays into ``[B, length]``, padding on the left or the right."""
    out = np.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r) > length:
            raise ValueError(
                f"row {i} has {len(r)} tokens, more than the length {length}; "
                "raise the limit (Turnstile never truncates silently)"
            )
        if len(r):
            if left:
                out[i, length - len(r) :] = r
            else:
                out[i, : len(r)] = r
    return out


def version_span(versions: np.ndarray) -> tuple[int | None, int | None]:
    """(min, max) policy version over the sampled tokens, or (None, None) if unknown."""
    known = versions[versions != NO_VERSION]
    if not len(known):
        return None, None
    return int(known.min()), int(known.max())


def missing_rewards(trajs: Sequence[Trajectory]) -> list[str]:
    """Sessions (ids) of the samples that have no reward posted."""
    return list(dict.fromkeys(t.session_id for t in trajs if t.reward is None))


def require_rewards(trajs: Sequence[Trajectory], stack: str) -> list[float]:
    """Every sample's scalar reward; a clear ValueError if any was never posted (a missing
    reward must not train as 0.0)."""
    missing = missing_rewards(trajs)
    if missing:
        raise ValueError(
            f"{stack} needs a reward for every sample; no reward was posted for "
            f"{len(missing)} session(s), e.g. {missing[:3]} (set_reward first, "
            "or leave them out)"
        )
    return [float(t.reward) for t in trajs]  # type: ignore[arg-type]


def group_key(t: Trajectory) -> str:
    """The GRPO group: the group id, else the session (a group of one)."""
    return t.group_id if t.group_id is not None else f"session:{t.session_id}"


def group_indices(trajs: Sequence[Trajectory]) -> tuple[list[int], list[str]]:
    """Each sample's group number (in order of first appearance) and the group keys."""
    keys: dict[str, int] = {}
    idx = [keys.setdefault(group_key(t), len(keys)) for t in trajs]
    return idx, list(keys)


def order_by_group(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """Groups contiguous, in order of first appearance; members by sample index (samples
    without one last, in input order)."""
    idx, _ = group_indices(trajs)
    order = sorted(
        range(len(trajs)),
        key=lambda i: (idx[i], trajs[i].sample_index is None, trajs[i].sample_index or 0, i),
    )
    return [trajs[i] for i in order]


def grpo_advantages(
    trajs: Sequence[Trajectory], eps: float = 1e-6, scale: bool = True, ddof: int = 0
) -> np.ndarray:
    """Group-relative advantages, one per sample: ``(r - mean_group) / (std_group + eps)``
    (``ddof=0``: population std; ``scale=False`` only centres, as the Tinker cookbook does).
    A sample without a reward raises ValueError: it is not a 0."""
    r = np.array(require_rewards(trajs, "grpo_advantages"), dtype=np.float64)
    idx, keys = group_indices(trajs)
    g = np.array(idx, dtype=np.int64)
    adv = np.zeros(len(trajs), dtype=np.float64)
    for k in range(len(keys)):
        sel = g == k
        centred = r[sel] - r[sel].mean()
        if scale:
            std = r[sel].std(ddof=ddof) if sel.sum() > ddof else 0.0
            adv[sel] = centred / (std + eps)
        else:
            adv[sel] = centred
    return adv.astype(np.float32)


def action_ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` runs where ``mask == 1``."""
    m = np.concatenate([[0], mask.astype(np.int8), [0]])
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def finish_reason(t: Trajectory) -> str | None:
    return t.turns[-1]["finish_reason"] if t.turns else None


def ids_meta(t: Trajectory) -> dict:
    """The rollout's identity, for a stack's free-form metadata channel, and whether its
    rollout logprobs are the sampler's (:func:`behaviour_exact`)."""
    return {
        "behaviour_exact": behaviour_exact(t),
        "trajectory_id": t.id,
        "session_id": t.session_id,
        "group_id": t.group_id,
        "sample_index": t.sample_index,
        "task_id": t.task_id,
        "call_ids": t.call_ids,
        "segment_reason": t.segment_reason,
    }


ROUTED = "routed_experts"  # token_arrays.ROUTED_EXPERTS


def routed_experts(t: Trajectory, who: str) -> np.ndarray | None:
    """The sample's routed experts ``[T, layers, k]`` for router replay (aligned with its
    ``token_ids``), or None when no call of it recorded routing. Every row a trainer replays
    (all but the last token's, which no engine forwards and no loss reads) must have been
    recorded: a missing row replayed as expert 0 would be silently wrong, so ValueError."""
    values = t.arrays.get(ROUTED)
    if values is None:
        return None
    missing = np.flatnonzero(t.present[ROUTED][:-1] == 0)
    if len(missing):
        raise ValueError(
            f"{who}: sample {t.id} has no recorded routing for {len(missing)} token(s) "
            f"(positions {missing[:5].tolist()}...): a call of it ran with routing off, on an "
            "engine that returns none, or its rows could not be read (the call's "
            "info.arrays_asked says which); leave the sample out of router replay"
        )
    return values


def batch_routing(trajs: Sequence[Trajectory], who: str) -> list[np.ndarray] | None:
    """Each sample's routed experts, or None when none has any (a batch that mixes samples
    with and without routing raises: router replay needs it for all or none)."""
    got = [routed_experts(t, who) for t in trajs]
    if all(g is None for g in got):
        return None
    if any(g is None for g in got):
        raise ValueError(f"{who}: some samples have routed experts and others none")
    return [g for g in got if g is not None]


#: ``image_bytes(session_id, sha256)``: an image's stored bytes (``Client.image``).
ImageBytes = Callable[[str, str], bytes]


def pil_images(t: Trajectory, image_bytes: ImageBytes | None, who: str) -> list:
    """The sample's images as RGB PIL images, in the order of their blocks in the tokens (the
    order a processor pairs images with placeholders); [] for a text sample. The bytes are
    checked against the sha256 the record names (a wrong reader would train on other
    pixels)."""
    if not t.images:
        return []
    if image_bytes is None:
        raise ValueError(f"{who}: sample {t.id} holds images: pass image_bytes (Client.image)")
    import hashlib
    import io

    from PIL import Image

    out = []
    for im in sorted(t.images, key=lambda i: i["offset"]):
        data = image_bytes(t.session_id, im["sha256"])
        if hashlib.sha256(data).hexdigest() != im["sha256"]:
            raise ValueError(f"{who}: image_bytes gave other bytes for image {im['sha256']}")
        out.append(Image.open(io.BytesIO(data)).convert("RGB"))
    return out


# --- the behaviour logprob: whether the recorded logprobs are the sampler's -----------------

#: What a converter does with a sample whose trained tokens' logprobs are not those of the
#: distribution they were sampled from (a call's ``behaviour_exact`` False): ``"warn"`` (the
#: default: converted, one :class:`InexactLogprobsWarning` per conversion naming the samples)
#: or ``"refuse"`` (ValueError). Every converter that hands logprobs to a trainer's rollout
#: field takes ``inexact=`` and does the same.
INEXACT = ("warn", "refuse")


class InexactLogprobsWarning(UserWarning):
    """Rollout logprobs handed to a trainer are not the sampler's: an importance weight
    (TIS/MIS) divided by them is wrong (see the calls' ``info.behaviour_logprobs.why``)."""


def _trained_turns(t: Trajectory) -> list[dict]:
    """The turns whose sampled tokens the loss reads."""
    mask = t.loss_mask
    return [x for x in t.turns if mask[x["completion_start"] : x["completion_end"]].any()]


def behaviour_exact(t: Trajectory) -> bool | None:
    """True when the logprob of every trained token is the log-probability under the
    distribution it was sampled from, False when a call's is not, None when a record is too
    old to say."""
    flags = [x.get("behaviour_exact") for x in _trained_turns(t)]
    if any(f is False for f in flags):
        return False
    return None if any(f is None for f in flags) else True


def check_behaviour(trajs: Sequence[Trajectory], who: str, inexact: str) -> None:
    """Warn or refuse (``inexact``, :data:`INEXACT`) when some samples' rollout logprobs are
    not the sampler's."""
    if inexact not in INEXACT:
        raise ValueError(f"inexact must be one of {INEXACT}, not {inexact!r}")
    bad = [(t, x) for t in trajs for x in _trained_turns(t) if x.get("behaviour_exact") is False]
    if not bad:
        return
    samples = list(dict.fromkeys(t.id for t, _ in bad))
    kinds = sorted({x.get("logprob_kind") or "unknown" for _, x in bad})
    t, x = bad[0]
    msg = (
        f"{who}: {len(samples)} of {len(trajs)} sample(s) hold rollout logprobs that are not "
        f"the sampler's ({', '.join(kinds)}; first: sample {t.id}, call {x['call_id']}): "
        "importance weights (TIS/MIS) divided by them are wrong. The calls' "
        "info.behaviour_logprobs.why says what moved the distribution; record with the "
        "sampler's logprobs (vLLM --logprobs-mode processed_logprobs; SGLang under a top-k) "
        "or have the trainer recompute the old logprobs"
    )
    if inexact == "refuse":
        raise ValueError(msg + " (inexact='warn' converts them anyway)")
    warnings.warn(msg, InexactLogprobsWarning, stacklevel=3)
