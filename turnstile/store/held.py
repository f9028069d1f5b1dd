"""What a trainer asks of the tokens of calls that weight updates reached (issue 44,
docs/weight_sync.md): the loss mask of a call's completion under :class:`HoldOptions`.

- ``mask_stale``: mask the tokens a version other than the call's last sampled (a call held
  across a sync, or one whose engine changed version mid-request): the off-policy part, as
  slime's ``--mask-offpolicy-in-partial-rollout`` and Dressage's
  ``--mask-nonlast-version-tokens`` do. Read from the call's version spans.
- ``max_preemptions``: a call preempted more than N times (``info.hold.preemptions``) trains
  on none of its tokens; they stay in the sequence (later calls extend it), masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..token_arrays import span_versions
from .records import CallRecord


@dataclass(frozen=True)
class HoldOptions:
    mask_stale: bool = False
    max_preemptions: int | None = None

    @property
    def active(self) -> bool:
        return self.mask_stale or self.max_preemptions is not None


def preemptions(c: CallRecord) -> int:
    hold = c.info.get("hold")
    return int(hold.get("preemptions") or 0) if isinstance(hold, dict) else 0


def kept(c: CallRecord, n: int, opts: HoldOptions) -> np.ndarray | None:
    """int8 [n]: 1 on the completion tokens of ``c`` that keep their loss, or None for all."""
    if opts.max_preemptions is not None and preemptions(c) > opts.max_preemptions:
        return np.zeros(n, dtype=np.int8)
    if opts.mask_stale and n:
        per = span_versions(c.info.get("weight_versions"), n)
        if per and any(v != per[-1] for v in per):
            return np.fromiter((v == per[-1] for v in per), dtype=np.int8, count=n)
    return None
