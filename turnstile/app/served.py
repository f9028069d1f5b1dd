"""uvicorn as Turnstile runs it (plain serve, the front and each worker of ``--workers``):
Turnstile's uvicorn settings, a bounded graceful shutdown (``--shutdown-grace``), the gateway
told when the shutdown begins (a call it then cancels is recorded as stopped by the server, not
as left by its harness), and every record written before the process ends."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import uvicorn

from ..gateway.control import PolicyControl
from ..store.writer import drain_all
from .serve_options import SHUTDOWN_GRACE_S, UVICORN

SETTLE_S = 5.0  # how long the calls cancelled at the grace's end may take to record it


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, control: PolicyControl):
        super().__init__(config)
        self._control = control

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._control.stop()
        await super().shutdown(sockets)
        # uvicorn cancels what outlived the grace and goes on at once; it then re-raises the
        # signal, which ends the process without ``atexit``: the cancelled calls record their
        # end first, and the store's writer commits every record handed to it.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while self._control.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(drain_all)


def run(
    app: Any,
    control: PolicyControl,
    *,
    log_level: str,
    grace: int | None,
    sockets: list[socket.socket] | None = None,
    **where: Any,
) -> None:
    """Serve ``app`` (on ``host``/``port`` in ``where``, or ``sockets`` given) until a signal;
    ``grace``: seconds running calls may go on after it (None: no limit); ``control``: its
    gateway's, told when the shutdown begins."""
    config = uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=grace, **UVICORN, **where
    )
    server = _Server(config, control)
    server.run(sockets=sockets)
    if not server.started and sockets is None:
        sys.exit(3)  # as uvicorn.run: it never started (the port taken, a failed startup)


def bounded(seconds: int) -> int:
    """A grace that always ends (the workers': a call held at a paused door would keep a
    shutdown waiting for ever, and the front would never stop its workers)."""
    return seconds if seconds > 0 else SHUTDOWN_GRACE_S
