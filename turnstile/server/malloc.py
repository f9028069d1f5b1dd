"""glibc's allocator set for a server whose requests are hundreds of KB.

At 100k-token contexts each call builds several buffers of 0.5-1 MB (the request body, its
parse, the engine's request). glibc serves those with ``mmap`` or returns them to the OS when
freed (its trim threshold follows the largest recent buffer), so the next call's buffers are
fresh pages again: a page fault per 4 KB, ~2 us each on a VM, ~0.5 ms for a 700 KB buffer
written twice (``benchmarks/README.md``, round 11). Raising both thresholds keeps freed
memory in the heap for the next call: no faults, and up to ``TRIM`` of idle heap kept.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its moving threshold (64-bit)
TRIM_THRESHOLD = 64 << 20  # free heap kept at its top before any is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
_OWN = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Set the thresholds (glibc only, and not where the operator set malloc's own
    variables); whether they were set. A process-wide setting, made once at start."""
    if platform.libc_ver()[0] != "glibc" or any(k in os.environ for k in _OWN):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    return bool(
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
