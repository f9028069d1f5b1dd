"""``turnstile serve --workers N``: N gateway processes on one machine, one record store.

One Python process answers ~100 coding-agent turns per CPU-second at 100k-token contexts
(its event loop saturates a core, ``benchmarks/README.md``); hundreds of concurrent rollouts
need more cores. The workers split the sessions, not the calls: a session's base URL names
the worker that owns it (its capability's hash), so its calls reach one process and its call
tree stays warm there.

- The **front** (worker 0) listens on ``--port``: the trainer's routes, sessions it owns,
  and the fallback for any session (every worker serves any session from the shared store,
  ``shared``: a tree another worker extended is rebuilt from the store first). Pause,
  resume, close and delete act on every worker (``server.peers``).
- The **other workers** listen on sockets this process binds and keeps (``--host``, free
  ports), handed to each worker process at start. A worker that dies is started again on
  the same socket: connections wait in its backlog meanwhile, so a harness's retry of a call
  that was never acknowledged reaches the new process, which takes the front's door (paused,
  weight version) before it serves, and continues the session from its last acknowledged
  call.

Same as Ray's direct replicas (``turnstile.app.ray.direct``), without Ray: one machine, no proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from ..gateway.control import PolicyControl
from . import served

REFUSED = (
    "--workers runs token-in gateways (passthrough keeps a lineage index that is not "
    "rebuilt when another worker recorded calls)"
)
RESTART_S = (0.5, 30.0)  # first and longest wait before a dead worker is started again


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _origin(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def internal_host(host: str) -> str:
    """Where the workers reach each other: loopback when ``--host`` is every address."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def public_origin(args: argparse.Namespace, port: int) -> str:
    """A worker's address as harnesses are given it: ``--public-url``'s host (else
    ``--host``) with the worker's port."""
    if args.public_url:
        u = urlsplit(args.public_url)
        return _origin(u.hostname or args.host, port).replace("http://", f"{u.scheme}://", 1)
    return _origin(args.host, port)


def owner(origins: list[str | None]) -> Callable[[str], Awaitable[str | None]]:
    """A session's worker by its capability: ``origins[k]`` (None: the front, whose base URL
    is the public URL already)."""

    async def origin(capability: str) -> str | None:
        return origins[zlib.crc32(capability.encode()) % len(origins)]

    return origin


class Fleet:
    """The worker processes beside the front: started, watched, started again when one
    dies, stopped with the front."""

    def __init__(self, sockets: list[socket.socket], spec: dict):
        self.sockets, self.spec = sockets, spec
        self.grace = served.bounded(spec["options"].get("shutdown_grace", 0))  # each worker's
        self.procs: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, daemon=True, name="workers")

    def _spawn(self, k: int) -> subprocess.Popen:
        sock = self.sockets[k - 1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnstile.app.workers"],
            stdin=subprocess.PIPE,
            pass_fds=(sock.fileno(),),
        )
        assert proc.stdin is not None
        # the options (the trainer's token among them) go through a pipe, not argv or env
        proc.stdin.write(json.dumps({**self.spec, "index": k, "fd": sock.fileno()}).encode())
        proc.stdin.close()
        return proc

    def start(self) -> None:
        self.procs = [self._spawn(k) for k in range(1, len(self.sockets) + 1)]
        self._watch.start()

    def _watch_loop(self) -> None:
        started = [time.monotonic()] * len(self.procs)
        wait = [RESTART_S[0]] * len(self.procs)
        while not self._stopping.wait(0.2):
            for i, proc in enumerate(self.procs):
                if proc.poll() is None or self._stopping.is_set():
                    continue
                # a worker that ran a while gets the short wait again; one that keeps dying
                # at start waits longer each time
                if time.monotonic() - started[i] > 60:
                    wait[i] = RESTART_S[0]
                print(
                    f"turnstile: worker {i + 1} exited ({proc.returncode}); starting it "
                    f"again in {wait[i]:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                if self._stopping.wait(wait[i]):
                    return
                wait[i] = min(wait[i] * 2, RESTART_S[1])
                self.procs[i] = self._spawn(i + 1)
                started[i] = time.monotonic()

    def stop(self) -> None:
        self._stopping.set()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 5
        for k, p in enumerate(self.procs, 1):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"turnstile: worker {k} did not stop; killed", file=sys.stderr, flush=True)
                p.kill()
                p.wait()


def run(app: Any, control: PolicyControl, sock: socket.socket, args: Any) -> None:
    """uvicorn on a socket this process was given."""
    grace = served.bounded(args.shutdown_grace)
    served.run(app, control, log_level=args.log_level, grace=grace, sockets=[sock])


def serve_workers(args: argparse.Namespace) -> None:
    """The front: bind every worker's socket, start the other workers, serve on ``--port``."""
    from ..server.error_log import log_to_stderr
    from ..server.peers import Peers
    from .wiring import server_from_args

    if args.mode == "passthrough":
        raise SystemExit(f"turnstile: refusing to start: {REFUSED}")
    n = args.workers
    front_sock = listen(args.host, args.port)
    sockets = [listen(args.host, 0) for _ in range(n - 1)]
    ports = [s.getsockname()[1] for s in sockets]
    inner = internal_host(args.host)
    options = {k: v for k, v in vars(args).items() if k != "func"}
    spec = {"options": options, "front": _origin(inner, args.port)}
    fleet = Fleet(sockets, spec)
    fleet.start()
    try:
        server = server_from_args(
            args,
            record_fields={"worker": 0},
            session_origin=owner([None, *(public_origin(args, p) for p in ports)]),
            shared=True,
            peers=Peers([_origin(inner, p) for p in ports], args.trainer_token),
            peer_route=True,
        )
        for line in server.banner:
            print(f"turnstile: {line}", file=sys.stderr)
        print(
            f"turnstile: {n} workers: the front on port {args.port}, the others on "
            + ", ".join(map(str, ports)),
            file=sys.stderr,
            flush=True,
        )
        log_to_stderr(args.log_level)
        run(server.app, server.gateway.control, front_sock, args)
    finally:
        fleet.stop()


def _die_with_parent(parent: int, grace: int) -> None:
    """Stop this worker when the front goes, however it goes: SIGTERM at once (Linux's
    PDEATHSIG; a graceful shutdown commits what is pending), and out after
    its grace and 5 s whatever it still waits for (a call held at a paused door keeps
    uvicorn's graceful shutdown waiting)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)  # where PDEATHSIG is not there
        time.sleep(served.bounded(grace) + 5.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="front-watch").start()


def worker_main() -> None:
    """A worker other than the front (``python -m turnstile.app.workers``, started by
    :class:`Fleet` with its spec on stdin)."""
    from ..server.error_log import log_to_stderr
    from ..server.peers import front_state
    from .wiring import server_from_args

    parent = os.getppid()
    spec = json.loads(sys.stdin.buffer.read())
    args = argparse.Namespace(**spec["options"])
    _die_with_parent(parent, args.shutdown_grace)
    sock = socket.socket(fileno=spec["fd"])
    k = spec["index"]
    server = server_from_args(args, record_fields={"worker": k}, shared=True, peer_route=True)
    state = front_state(spec["front"], args.trainer_token)
    control = server.gateway.control
    control.version = state.get("weight_version")
    if state.get("paused"):
        control.close_door("drain")
    log_to_stderr(args.log_level)
    run(server.app, control, sock, args)


if __name__ == "__main__":
    worker_main()
