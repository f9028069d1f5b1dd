"""A free loopback port for a server a test or a fake engine starts (the fakes' and the test
bed's)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A free port for a server a test starts, below the kernel's ephemeral range: a port
    taken from that range (``bind(("", 0))``) is free only until the next process asks the
    kernel for one, and a Ray cluster starting beside the server asks for a dozen (its gRPC
    servers took the test's port in the full suite). Above 20000: Ray's workers use up to
    19999."""
    low = _ephemeral_low()
    if low > 21000:
        for port in random.sample(range(20000, low), 64):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
