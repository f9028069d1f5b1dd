"""Random ids for calls, sessions and engine requests, from the OS's randomness read in
blocks: ``os.urandom`` drops the GIL for its system call on every use, and while the store's
writer thread waits for the GIL each drop can hand it over and back (~1.2 us of CPU more per
id than a block's slice, measured with a thread waiting; three ids a call). The bytes are
the same ``os.urandom`` bytes, each used once; a forked child starts with an empty block,
so it never repeats its parent's ids."""

from __future__ import annotations

import os
import secrets
import threading

BLOCK = 4096  # bytes read at once: ~150 ids of 96 bits


class _Pool:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()  # a new lock: a fork may copy one held by another thread
        self._block = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._block):
                self._block, at = os.urandom(max(BLOCK, n)), 0
            self._at = at + n
            return self._block[at : at + n]


_POOL = _Pool()
os.register_at_fork(after_in_child=_POOL.reset)


def random_hex(n_bytes: int) -> str:
    """``n_bytes`` of the OS's randomness, in hex."""
    return _POOL.take(n_bytes).hex()


def new_id(prefix: str) -> str:
    """``prefix`` and 96 random bits in hex (a call's ``call_…``, a chunk's ``chatcmpl-…``)."""
    return prefix + random_hex(12)


# A session's capability: the bearer secret its URLs carry (the store mints it with the session,
# the server's auth reads it back). Here, at the bottom, so the store needs nothing of auth.
CAPABILITY_PREFIX = "cap_"


def new_capability() -> str:
    """A fresh capability: ``cap_`` and 32 random bytes, URL-safe base64."""
    return CAPABILITY_PREFIX + secrets.token_urlsafe(32)
