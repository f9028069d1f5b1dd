"""Helpers for finding text markers in a stream where a marker may be split across chunks."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``.

    That suffix must be held back: the next chunk may complete the marker. Nothing longer is
    held, so ordinary text flows as soon as it arrives.
    """
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def split_safe(text: str, markers: Iterable[str]) -> tuple[str, str]:
    """Split ``text`` into (safe to release, held back because it may start a marker)."""
    keep = partial_marker_len(text, markers)
    if keep == 0:
        return text, ""
    return text[:-keep], text[-keep:]
