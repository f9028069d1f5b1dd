"""What the viewer shows of a trajectory beyond the trainer's JSON: the text piece of every token
(decoded here, so the page shows exactly the tokens), where a passthrough segment drifted, and
for a ``history_diverged`` segment the recorded and the sent message side by side.

The pieces are each token decoded alone: a token that ends inside a UTF-8 character shows
U+FFFD, as it is."""

from __future__ import annotations

import io

import numpy as np

from ..chat.loaded_tokenizer import LoadedTokenizer
from ..store.export_columns import Columns
from ..store.export_rows import trajectory_row
from ..store.export_schema import arrow_schemas
from ..store.records import CallRecord
from ..store.trajectories import Trajectory

WINDOW = (8, 40)  # tokens shown before and after where a segment left the record


def pieces(tok: LoadedTokenizer | None, ids: np.ndarray) -> list[str] | None:
    """The text of each token ID (None without a tokenizer: the page shows the IDs)."""
    if tok is None:
        return None
    uniq = np.unique(ids).tolist()
    texts = tok.tokenizer.decode_batch([[i] for i in uniq], skip_special_tokens=False)
    table = dict(zip(uniq, texts, strict=True))
    return [table[i] for i in ids.tolist()]


def divergence(
    root: CallRecord, calls: list[CallRecord], tok: LoadedTokenizer | None
) -> dict | None:
    """Both sides of where a new segment left the recorded conversation, or None.

    Passthrough records carry it (``info.drift``: the first differing prompt token, the IDs
    and the engine's text on both sides). For a token-in segment root the record holds the
    prompt as sent; the recorded side is the earlier call whose prompt + completion shares
    the longest prefix with it, and both sides are decoded around the first differing token:
    the message that differs, in its context, as the model saw it."""
    drift = root.info.get("drift")
    if isinstance(drift, dict) and "index" in drift:
        rec, got = drift.get("recorded") or {}, drift.get("received") or {}
        return {
            "index": drift["index"],
            "call_id": drift.get("call_id"),
            "same_text": drift.get("same_text"),
            "window_start": drift.get("window_start"),
            "recorded": {"ids": rec.get("ids"), "text": rec.get("text")},
            "sent": {"ids": got.get("ids"), "text": got.get("text")},
        }
    if root.segment_reason in (None, "first_call") or root.parent_id is not None:
        return None
    prompt = np.frombuffer(root.prompt_delta, dtype=np.int32)
    # per call: (length of its prompt + completion, tokens it shares with ``prompt``)
    seen: dict[str, tuple[int, int]] = {}
    best: tuple[CallRecord, int] | None = None
    for c in calls:
        if c.seq >= root.seq or c.status != "ok":
            continue
        base, common = seen.get(c.parent_id or "", (0, 0))
        own = np.concatenate(
            [
                np.frombuffer(c.prompt_delta, dtype=np.int32),
                np.frombuffer(c.completion_ids, dtype=np.int32),
            ]
        )
        if common == base:
            rest = prompt[base : base + len(own)]
            differ = np.flatnonzero(rest != own[: len(rest)])
            common = base + (int(differ[0]) if len(differ) else len(rest))
        seen[c.id] = (base + len(own), common)
        if best is None or common > best[1]:
            best = (c, common)
    if best is None:
        return None
    call, i = best
    by_id = {c.id: c for c in calls}
    path = [call]
    while path[-1].parent_id in by_id:
        path.append(by_id[path[-1].parent_id or ""])
    full = np.concatenate(
        [
            np.frombuffer(b, dtype=np.int32)
            for c in reversed(path)
            for b in (c.prompt_delta, c.completion_ids)
        ]
    )
    lo, hi = max(0, i - WINDOW[0]), i + WINDOW[1]

    def side(ids: np.ndarray) -> dict:
        return {"ids": ids.tolist(), "text": tok.decode(ids.tolist()) if tok else None}

    return {
        "index": i,
        "call_id": call.id,
        "same_text": None,
        "window_start": lo,
        "recorded": side(full[lo:hi]),
        "sent": side(prompt[lo:hi]),
    }


def parquet_bytes(trajs: list[Trajectory]) -> bytes:
    """The trajectories as one Parquet file, in the export's ``trajectories`` table schema."""
    import pyarrow.parquet as pq

    cols = Columns(arrow_schemas()["trajectories"])
    for t in trajs:
        cols.add(trajectory_row(t, "viewer"))
    buf = io.BytesIO()
    pq.write_table(cols.table(), buf, compression="zstd")
    return buf.getvalue()
