"""A prompt's token IDs as the JSON an engine's request body carries, written once per block.

Every call of a session sends the engine its whole context again, and the context only grows:
at 150k tokens writing the request body took 0.68 ms of the loop's CPU per call (orjson's C
writer, ~5.5 ns per ID). So the IDs are cut into blocks of :data:`BLOCK` tokens at fixed
positions from the start; a block's JSON is kept under the hash of its bytes and reused when
a later prompt holds the same bytes there (the session's next call, and every session's
shared system prompt and tool schemas); only new blocks and the last, partial one are
written: 0.45 ms at 150k in the server (cold memory, not the writing, is most of what is
left; 0.08 ms in isolation). A kept block is used only when its token IDs are equal byte for
byte (not on the hash alone): what the engine is sent is exactly what is recorded.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import orjson
import xxhash

BLOCK = 4096  # tokens
# kept IDs + JSON, ~10 B per token (serve --prompt-cache-mb): every session's shared system
# prompt and tools, and ~15 sessions' contexts at 100k tokens (~1 B more per token of 384
# sessions' contexts at most, benchmarks/README.md round 11)
MAX_BYTES = 16 << 20
IDLE_S = 60.0  # a full cache drops a block only after it went this long unused
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _json(raw: memoryview) -> bytes:
    """``1,2,3`` for int32 bytes (orjson writes a numpy view in C; no Python int per token)."""
    return orjson.dumps(np.frombuffer(raw, dtype=np.int32), option=_NUMPY)[1:-1]


class PromptJSON:
    """Blocks of token IDs -> their JSON, in at most ``max_bytes``.

    When full, the least recently used block makes room only once it has gone unused for
    ``idle_s``: sessions that take turns in a round bigger than the cache would otherwise
    each push out the blocks the next one needs (no block would ever be found again); this
    way the blocks kept go on being found, and those of finished sessions age out."""

    def __init__(
        self,
        max_bytes: int = MAX_BYTES,
        block: int = BLOCK,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes, self.block, self.idle_s, self.clock = max_bytes, block, idle_s, clock
        self.bytes = 0
        # hash -> [IDs, JSON, last used], least recently used first
        self._kept: OrderedDict[int, list] = OrderedDict()
        self._lock = threading.Lock()  # one cache per process; engines may run on other loops

    def dumps(self, ids: array) -> bytes:
        """``orjson.dumps(list(ids))`` for an int32 array, from kept blocks where it can."""
        if self.max_bytes <= 0:
            return orjson.dumps(np.frombuffer(ids, dtype=np.int32), option=_NUMPY)
        raw = memoryview(ids).cast("B")
        step = self.block * ids.itemsize
        whole = len(raw) - len(raw) % step
        pieces = [b"["]
        with self._lock:
            now = self.clock()
            for at in range(0, whole, step):
                pieces += (self._block(raw[at : at + step], now), b",")
        if whole < len(raw):
            pieces += (_json(raw[whole:]), b",")
        pieces[-1] = b"]" if len(pieces) > 1 else b"[]"
        return b"".join(pieces)  # (one buffer: a concatenation would write it twice)

    def _block(self, raw: memoryview, now: float) -> bytes:
        ids = raw.tobytes()  # (a memoryview compares element by element: ~40x slower)
        key = xxhash.xxh3_64_intdigest(ids)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == ids:
            kept[2] = now
            self._kept.move_to_end(key)
            return kept[1]
        text = _json(raw)
        if kept is not None:  # another block with this hash: the newer one is kept
            self._drop(key)
        self._keep(key, ids, text, now)
        return text

    def _keep(self, key: int, ids: bytes, text: bytes, now: float) -> None:
        size = len(ids) + len(text)
        while self.bytes + size > self.max_bytes and self._kept:
            oldest, (_, _, used) = next(iter(self._kept.items()))
            if now - used < self.idle_s:
                return  # every kept block is in use: this one is not kept
            self._drop(oldest)
        if self.bytes + size <= self.max_bytes:
            self._kept[key] = [ids, text, now]
            self.bytes += size

    def _drop(self, key: int) -> None:
        ids, text, _ = self._kept.pop(key)
        self.bytes -= len(ids) + len(text)


PROMPTS = PromptJSON()  # the process's (a worker, a Ray replica: each its own)


def wire_ids(ids: Sequence[int]) -> object:
    """Prompt token IDs for an orjson request body. The gateway hands adapters the prompt as
    an int32 ``array``: it goes out as already written JSON (:class:`PromptJSON`, an
    ``orjson.Fragment``), never as a Python int per token (at 100k tokens that was ~3 ms per
    call). A list stays a list."""
    if isinstance(ids, array) and ids.typecode == "i":
        return orjson.Fragment(PROMPTS.dumps(ids))
    return list(ids)
