"""The trajectories route's query for calls weight updates reached (``store.held``)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import APIError
from ..store.held import HoldOptions


def hold_options(query: Mapping[str, str]) -> HoldOptions | None:
    """The trajectories' masks for calls weight updates reached (docs/weight_sync.md):
    ``mask_stale_versions=true`` and ``max_preemptions=N``; None when neither is asked."""
    stale = query.get("mask_stale_versions", "false").lower()
    if stale not in ("true", "false", "1", "0"):
        raise APIError(
            400, "Invalid 'mask_stale_versions': expected true or false.", "mask_stale_versions"
        )
    cap = query.get("max_preemptions")
    if cap is not None and not (cap.isascii() and cap.isdigit()):
        raise APIError(
            400, "Invalid 'max_preemptions': expected an integer >= 0.", "max_preemptions"
        )
    opts = HoldOptions(stale in ("true", "1"), None if cap is None else int(cap))
    return opts if opts.active else None
