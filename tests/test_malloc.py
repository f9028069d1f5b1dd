"""``server/malloc.py``: with the thresholds set, a call's large buffers (two of ~700 KB alive
at once, then freed, as a 100k-token request's are) come back from the heap instead of
fresh pages; the page faults counted by the kernel, in a fresh interpreter each."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import os, resource, sys
from turnstile.server.malloc import keep_freed_memory
print(keep_freed_memory() if sys.argv[1] == "set" else None)
pieces = [os.urandom(25_000) for _ in range(28)]
for _ in range(5):
    b"[" + b",".join(pieces) + b"]"
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    b"[" + b",".join(pieces) + b"]"
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def probe(mode: str, **env: str) -> tuple[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_buffers_are_reused_instead_of_faulted_in_again():
    _, default = probe("leave")
    done, tuned = probe("set")
    assert done == "True"
    assert default >= 100, default  # glibc's own thresholds: fresh pages for each buffer
    assert tuned < 20, tuned


def test_the_operators_own_malloc_settings_are_left_alone():
    done, _ = probe("set", MALLOC_TRIM_THRESHOLD_="131072")
    assert done == "False"
