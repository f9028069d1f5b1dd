"""A recorded engine call and how its token and body blobs are packed in the store.

Token IDs are packed int32 and logprobs float32 blobs: 4 bytes each, no JSON parsing to read
them back. Bodies are zlib-compressed JSON.
"""

from __future__ import annotations

import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..media import Image, MediaItem
from ..random_ids import new_id as new_id  # (re-exported: the store's callers find it here)
from ..token_arrays import Rows, pack, span_versions, unpack
from .blobs import pack_media, unpack_media
from .database import Row

INT32_MAX = 2**31 - 1  # sample_index is an int32 column in exports


def pack_ids(ids: Any) -> bytes:
    return ids.tobytes() if isinstance(ids, array) else array("i", ids).tobytes()


def unpack_ids(blob: bytes) -> array:
    out = array("i")
    out.frombytes(blob)
    return out


def pack_floats(values: Any) -> bytes:
    return array("f", values).tobytes()


def unpack_floats(blob: bytes) -> array:
    out = array("f")
    out.frombytes(blob)
    return out


@dataclass
class CallRecord:
    """One engine call, as recorded: the record contract both gateways produce (token-in
    ``Gateway.record``, capture ``PassthroughGateway._record``) and ``Store.add_call`` takes.
    ``info`` holds the rest: sampling params as sent, timings, engine request id, usage,
    template/tokenizer fingerprint, segment detail."""

    id: str
    session_id: str
    seq: int
    parent_id: str | None
    segment_reason: str | None
    reused_prefix_len: int
    prompt_delta: array
    completion_ids: array
    completion_logprobs: array
    finish_reason: str | None
    stop_token_id: int | None
    seam: str | None
    status: str
    error: str | None = None
    message: dict | None = None
    history_hash: bytes | None = None
    prefix_hashes: list[bytes] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    # per-token arrays by declared name (``token_arrays.DECLARED``), on the call's sequence
    arrays: dict[str, Rows] = field(default_factory=dict)
    # the images of the call's prompt: spans in the EXPANDED prompt (the parent's prefix and
    # the delta alike), stored in ``calls.media``; ``images``: the bytes of those this call
    # brings (written once to the blob table with the call, never in its row)
    media: tuple[MediaItem, ...] = ()
    images: dict[str, Image] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "seq": self.seq,
            "parent_id": self.parent_id,
            "segment_reason": self.segment_reason,
            "reused_prefix_len": self.reused_prefix_len,
            "prompt_delta_ids": self.prompt_delta.tolist(),
            "completion_ids": self.completion_ids.tolist(),
            "completion_logprobs": self.completion_logprobs.tolist(),
            "finish_reason": self.finish_reason,
            "stop_token_id": self.stop_token_id,
            "seam": self.seam,
            "status": self.status,
            "error": self.error,
            "message": self.message,
            "created": self.created,
            **self.info,
            **_token_versions(self),
            **({"media": [m.to_json() for m in self.media]} if self.media else {}),
        }


def _token_versions(c: CallRecord) -> dict:
    """The per-token ``weight_version`` list the record's JSON has always shown where the
    engine reported spans (the stored info keeps the spans and the last version only)."""
    spans = c.info.get("weight_versions")
    if not spans or isinstance(c.info.get("weight_version"), list):
        return {}
    per_token = span_versions(spans, len(c.completion_ids))
    return {"weight_version": per_token} if per_token else {}


def pack_body(body: object) -> bytes | None:
    if body is None:
        return None
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return zlib.compress(raw, 1)


def unpack_body(blob: bytes | None) -> object:
    return None if blob is None else orjson.loads(zlib.decompress(blob))


def call_row(c: CallRecord) -> tuple:
    """A record as its ``calls`` row, in ``CALL_COLUMNS`` order (the inverse of
    :func:`call_from_row`); NUL in the engine's error text becomes U+FFFD."""
    return (
        c.id,
        c.session_id,
        c.seq,
        c.parent_id,
        c.segment_reason,
        c.reused_prefix_len,
        pack_ids(c.prompt_delta),
        pack_ids(c.completion_ids),
        pack_floats(c.completion_logprobs),
        c.finish_reason,
        c.stop_token_id,
        c.seam,
        c.status,
        None if c.error is None else c.error.replace("\x00", "\ufffd"),
        orjson.dumps(c.message) if c.message is not None else None,
        c.history_hash,
        b"".join(c.prefix_hashes),
        orjson.dumps(c.info),
        c.created,
        pack(c.arrays),
        pack_media(c.media),
    )


def call_from_row(r: Row) -> CallRecord:
    """A stored ``calls`` row (read with the store's ``CALL_COLUMNS``) as a record."""
    hashes = r["prefix_hashes"] or b""
    message = r["message"]
    return CallRecord(
        id=r["id"],
        session_id=r["session_id"],
        seq=r["seq"],
        parent_id=r["parent_id"],
        segment_reason=r["segment_reason"],
        reused_prefix_len=r["reused_prefix_len"],
        prompt_delta=unpack_ids(r["prompt_delta"]),
        completion_ids=unpack_ids(r["completion_ids"]),
        completion_logprobs=unpack_floats(r["completion_logprobs"]),
        finish_reason=r["finish_reason"],
        stop_token_id=r["stop_token_id"],
        seam=r["seam"],
        status=r["status"],
        error=r["error"],
        message=orjson.loads(message) if message is not None else None,
        history_hash=r["history_hash"],
        prefix_hashes=[hashes[i : i + 8] for i in range(0, len(hashes), 8)],
        info=orjson.loads(r["info"]),
        created=r["created"],
        arrays=unpack(r["arrays"]),
        media=unpack_media(r["media"]),
    )
