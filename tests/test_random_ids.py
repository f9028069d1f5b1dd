"""``turnstile.random_ids``: ids are the OS's random bytes, each used once, whatever the
threads and forks: checked against the byte stream ``os.urandom`` gave (patched to a known
stream), under threads, and across a fork."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnstile import random_ids

pytestmark = pytest.mark.unit
_URANDOM = os.urandom  # the real one (the test patches the os module's)


class _Recorded:
    """``os.urandom``, with every read kept."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []

    def __call__(self, n: int) -> bytes:
        self.reads.append(_URANDOM(n))
        return self.reads[-1]


@given(sizes=st.lists(st.integers(1, 600), max_size=300))
def test_ids_are_the_oss_bytes_each_used_once(sizes: list[int]) -> None:
    reads = _Recorded()
    pool = random_ids._Pool()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(random_ids.os, "urandom", reads)
        taken = [pool.take(n) for n in sizes]
    # Each id is the next unused bytes of the last read, or (when too few are left) the
    # start of a new read: no byte is given twice, none skipped inside a read.
    block, at = -1, 0
    for t in taken:
        if (
            block >= 0
            and reads.reads[block][at : at + len(t)] == t
            and at + len(t) <= len(reads.reads[block])
        ):
            at += len(t)
            continue
        assert block < 0 or len(reads.reads[block]) - at < len(t), "a read left unused"
        block, at = block + 1, len(t)
        assert reads.reads[block][: len(t)] == t
    assert block == len(reads.reads) - 1  # nothing read that was not used


def _yielding_len(x: object) -> int:
    time.sleep(0)  # drops the GIL: another thread runs between reading and moving the cursor
    return len(x)  # type: ignore[arg-type]


def test_threads_never_share_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random_ids, "len", _yielding_len, raising=False)
    pool = random_ids._Pool()
    got: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(k: int) -> None:
        start.wait()  # all at once
        for _ in range(2000):
            got[k].append(pool.take(12))

    threads = [threading.Thread(target=draw, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for g in got for x in g]
    assert len(set(flat)) == len(flat) == 16000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    random_ids.random_hex(12)  # the parent holds a partly used block
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(w, "".join(random_ids.random_hex(12) for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read()
    os.waitpid(pid, 0)
    parent = "".join(random_ids.random_hex(12) for _ in range(50))
    child_ids = {child[i : i + 24] for i in range(0, len(child), 24)}
    parent_ids = {parent[i : i + 24] for i in range(0, len(parent), 24)}
    assert len(child_ids) == len(parent_ids) == 50
    assert not child_ids & parent_ids
