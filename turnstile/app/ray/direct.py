"""Direct replicas (issue 28): each gateway replica also serves its app on a port of its own
node, and a session's base URL names the replica that owns the session, so a harness's calls
skip Serve's HTTP proxy and Serve's ASGI wrapper (two thirds of a call's CPU through Serve).

- :class:`DirectServer` runs uvicorn on the replica's user-code event loop: the same app
  object, the same loop Serve calls it on, so one gateway (one session cache, one set of call
  trees) answers both doors. Its lifespan is Serve's (run once, by Serve).
- The replica publishes its address as Serve replica metadata (``record_replica_metadata``),
  which reaches every router of the deployment with the replica set.
- :class:`Owners` asks the deployment's own router (a handle's ``choose_replica``, pick only,
  the capability as ``turnstile.app.ray.routing.SESSION_KWARG``) which replica owns a
  capability: the ring's choice, the replica Serve's proxy would send the session's calls to.
  So a session's direct URL and its fallback through Serve name the same replica while it
  lives; when it is gone, the fallback's ring walks on and the next replica rebuilds the
  session from the store.

Same app, same credentials: the direct port answers exactly what Serve's proxy answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from .routing import SESSION_KWARG

LOOKUP_S = 5.0  # longest wait for the router (its first replica broadcast); then Serve's URL


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the process is Ray's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DirectServer:
    """The replica's app on ``host`` (a free port), served on the running event loop."""

    def __init__(self, app: Any, host: str):
        self.host = host
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http="httptools",
            proxy_headers=False,  # as serve_options.UVICORN: nothing reads the client's address
        )
        self.server = _Uvicorn(config)
        self.task: asyncio.Task | None = None

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        """Serve until :meth:`stop`; returns once listening, with the origin to publish."""
        self.task = asyncio.get_running_loop().create_task(self.server.serve([self.sock]))
        while not self.server.started:
            if self.task.done():  # failed to start: say why
                self.task.result()
                raise RuntimeError("the direct server stopped at start")
            await asyncio.sleep(0.01)
        return self.origin

    def stop(self) -> None:
        self.server.should_exit = True


class Owners:
    """Which replica's direct address a session's base URL names (its capability's replica on
    Serve's ring), asked of the deployment's router in this process."""

    def __init__(self, deployment: str, app_name: str):
        self.deployment, self.app_name = deployment, app_name
        self._handle: Any = None

    async def origin(self, capability: str) -> str | None:
        """The owning replica's direct origin; None (the harness uses Serve's URL) when the
        router cannot say in time or that replica serves no direct port."""
        from ray import serve

        try:
            if self._handle is None:
                self._handle = serve.get_deployment_handle(self.deployment, self.app_name)
            async with asyncio.timeout(LOOKUP_S):
                # pick only (_reserve=False): nothing is sent to or held on the replica
                async with self._handle.choose_replica(
                    _reserve=False, **{SESSION_KWARG: capability}
                ) as chosen:
                    return chosen.replica_metadata.get("direct")
        except Exception:  # noqa: BLE001 - Serve's URL is always right, only slower
            return None
