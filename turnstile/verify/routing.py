"""Recorded routed experts against the engine's routing of the same re-feed, and what the two
comparisons together say (:func:`diagnosis`).

A (token, layer) row agrees when the re-feed picked the same *set* of experts (engines may
order the top-k differently). Rows absent on either side are counted apart, never as
disagreement. The engines return only the chosen ids, not the router's scores, so a row that
differs because two experts tied at the k-th place cannot be told from a real difference: a
healthy engine's agreement is "all rows but its ties".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..engines.routing import RoutingShape, decode_int32, decode_npy
from ..token_arrays import ROUTED_EXPERTS

NAME = ROUTED_EXPERTS.name
# Below this share of agreeing rows the routing "disagrees broadly". A same-weights re-feed of
# the fakes agrees 100%; other weights (a different router) ~4% at top-2 of 8 (chance: 1/28).
# Real engines lose only tied rows; docs/verification.md has the figures.
ROUTING_AGREE = 0.95

TIE_NOTE = (
    "routing rows are compared as expert sets; the engine returns no router scores, so a row "
    "that differs through a tie at the k-th expert cannot be told from a real difference"
)

CONSISTENT = "consistent"  # logprobs and routing agree: the same weights, recorded exactly
OTHER_WEIGHTS = "other_weights"  # both part: the engine holds other weights (a stale sync)
ROUTING_CHANGED = "routing_changed"  # logprobs agree, routing does not: router/capture
LOGPROBS_ONLY = "logprobs_parted_routing_agrees"  # same router: a logprob mode/record/kernel
UNKNOWN = "unknown"  # a figure is missing: nothing is guessed
DIAGNOSES = (CONSISTENT, OTHER_WEIGHTS, ROUTING_CHANGED, LOGPROBS_ONLY, UNKNOWN)


@dataclass
class RoutingAgreement:
    """Recorded against re-fed routing rows of one sequence, over (token, layer) rows."""

    rows: int  # (token, layer) rows present on both sides, compared
    agree: int  # of them, with the same expert set
    share: float  # agree / rows (NaN: none compared)
    absent_recorded: int  # rows the re-feed has and the record lacks
    absent_refeed: int  # rows the record has and the re-feed lacks
    first_disagreement: int | None  # token position of the first differing row
    first_layer: int | None  # its first differing layer
    by_version: dict[str, dict[str, int]] = field(default_factory=dict)  # {rows, agree}


def decode(raw: object, npy: bool, layers: int, top_k: int) -> np.ndarray | None:
    """The re-feed's ``routed_experts`` field as ``[rows, layers, top_k]`` (None: absent)."""
    if not isinstance(raw, str):
        return None
    return decode_npy(raw) if npy else decode_int32(raw, RoutingShape(layers, top_k))


def agreement(
    recorded: np.ndarray,
    present: np.ndarray,
    refed: np.ndarray | None,
    version_of: Sequence[str],
) -> RoutingAgreement:
    """``recorded`` ``[T, layers, k]`` with ``present`` (1 where recorded); ``refed``: the
    re-feed's rows for positions ``0 ..`` (fewer or none where it returned fewer);
    ``version_of[p]``: the weight version position ``p`` is attributed to."""
    t = len(recorded)
    layers = recorded.shape[1] if recorded.ndim == 3 else 0
    got = 0 if refed is None else min(len(refed), t)
    have_rec = np.asarray(present[:t], bool)
    have_new = np.zeros(t, bool)
    have_new[:got] = True
    if refed is not None and refed.shape[1:] != recorded.shape[1:]:
        have_new[:] = False  # another model's shape: nothing comparable
    both = have_rec & have_new
    same = np.zeros((t, layers), bool)
    if both.any():
        assert refed is not None
        a = np.sort(recorded[both].astype(np.int64), axis=-1)
        b = np.sort(refed[:got][both[:got]].astype(np.int64), axis=-1)
        same[both] = np.all(a == b, axis=-1)
    rows = int(both.sum()) * layers
    agree = int(same[both].sum())
    bad = np.argwhere(both[:, None] & ~same)
    by_version: dict[str, dict[str, int]] = {}
    for p in np.flatnonzero(both).tolist():
        v = by_version.setdefault(version_of[p], {"rows": 0, "agree": 0})
        v["rows"] += layers
        v["agree"] += int(same[p].sum())
    return RoutingAgreement(
        rows,
        agree,
        agree / rows if rows else float("nan"),
        int((have_new & ~have_rec).sum()) * layers,
        int((have_rec & ~have_new).sum()) * layers,
        int(bad[0][0]) if len(bad) else None,
        int(bad[0][1]) if len(bad) else None,
        by_version,
    )


def diagnosis(logprobs_parted: bool | None, share: float | None) -> str:
    """What the two checks together say (``None``/NaN: that figure is missing).

    Both part: the engine holds other weights than the sampler did (a stale weight sync).
    Logprobs agree, routing does not: the same weights routing differently: router
    nondeterminism, or a capture bug. Logprobs part with the routing agreeing: the same
    router, so not the weights: the record's logprob mode, the sampler, or a kernel."""
    if logprobs_parted is None or share is None or share != share:
        return UNKNOWN
    broad = share < ROUTING_AGREE
    if logprobs_parted:
        return OTHER_WEIGHTS if broad else LOGPROBS_ONLY
    return ROUTING_CHANGED if broad else CONSISTENT
