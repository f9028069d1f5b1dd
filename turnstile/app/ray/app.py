"""Turnstile as a Ray Serve application: N gateway replicas behind Serve's HTTP proxy, each
one Turnstile gateway built from the same options as ``turnstile serve`` (``wiring``), calls
of a session routed to one replica by :class:`~turnstile.app.ray.routing.SessionRouter`.

The replicas share one record store: a PostgreSQL database (``--store``: replicas on any node)
or the node's SQLite file under ``--data`` (replicas on one node). A replica whose session's
calls were also recorded elsewhere (its replica died, or the ring moved the session) sees the
store's call count differ from its cached tree and rebuilds the tree from the store, so the
next call extends the last acknowledged call exactly (``docs/scale.md``).

With ``direct`` (``turnstile serve --ray --ray-direct``) each replica also serves its app on
its own port and a session's base URL names its owning replica there, Serve's proxy being
the fallback (``turnstile.app.ray.direct``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig

from ...auth import is_loopback
from ...gateway.token_in.gateway import Gateway
from ..wiring import Server, server_from_args
from .direct import DirectServer, Owners

DEPLOYMENT = "turnstile"
ROUTER = "turnstile.app.ray.routing:SessionRouter"  # imported by Serve's proxies
PASSTHROUGH = (
    "--ray runs token-in gateways (passthrough keeps a lineage index that is not "
    "rebuilt when another replica recorded calls)"
)
# Paths the replicas open: made absolute in the driver (a replica's working directory is
# Ray's, not the caller's).
_PATHS = ("data", "model", "chat_template")


class GatewayReplica:
    """One gateway: the app ``turnstile serve`` would run, built in the replica's process;
    with ``direct`` (``{"driver_node": ...}``) also served on a port of its own."""

    async def __init__(self, options: dict, direct: dict | None = None):  # type: ignore[misc]
        context = serve.get_replica_context()
        replica = context.replica_id.unique_id
        os.environ["TURNSTILE_REPLICA"] = replica  # the metrics' replica label
        owners = Owners(DEPLOYMENT, context.app_name) if direct is not None else None
        self.server: Server = server_from_args(
            argparse.Namespace(**options),
            record_fields={"replica": replica},  # which replica recorded a call
            session_origin=owners.origin if owners else None,
            shared=True,  # other replicas write this store too
        )
        gateway = self.server.gateway
        if not isinstance(gateway, Gateway):
            raise ValueError("turnstile.app.ray runs token-in gateways")
        self.direct: DirectServer | None = None
        host = direct_host(options.get("host", "127.0.0.1"), direct) if direct else None
        if host is not None:
            self.direct = DirectServer(self.server.app, host)
            await self.direct.start()  # before Serve reads the metadata below

    def record_replica_metadata(self) -> dict:
        """Published with the replica set to every router (Serve's hook, read once)."""
        return {"direct": self.direct.origin} if self.direct else {}

    def __del__(self) -> None:
        if getattr(self, "direct", None) is not None:
            self.direct.stop()  # type: ignore[union-attr]

    def __serve_build_asgi_app__(self) -> Any:
        return self.server.app


def direct_host(host: str, direct: dict) -> str | None:
    """Where a replica's direct server listens: its node's address; with a loopback ``--host``
    (this machine only) a loopback address, and only on the driver's node (another node's
    loopback is not the harness's)."""
    if is_loopback(host):
        driver = direct.get("driver_node")
        if driver and ray.get_runtime_context().get_node_id() != driver:
            return None
        return "127.0.0.1"
    return ray.util.get_node_ip_address()


def replica_options(args: argparse.Namespace) -> dict:
    """``serve``'s options as the replicas get them (plain values, absolute paths)."""
    out = {k: v for k, v in vars(args).items() if k != "func" and not k.startswith("ray_")}
    for k in _PATHS:
        if out.get(k) and (k != "model" or Path(out[k]).exists()):
            out[k] = str(Path(out[k]).resolve())
    return out


def build_app(
    options: dict,
    *,
    replicas: int = 2,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    target_ongoing: float = 16,
    max_ongoing: int = 256,
    replica_cpus: float = 1.0,
    direct: bool = False,
) -> Any:
    """The Serve application (``serve.run`` it, or compose it into your own). With
    ``min_replicas``/``max_replicas`` Serve autoscales between them on ongoing requests per
    replica (``target_ongoing``); otherwise it keeps ``replicas``. With ``direct`` each
    replica also serves on a port of its own, named by its sessions' base URLs."""
    if options.get("mode") == "passthrough":
        raise ValueError(PASSTHROUGH)
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if min_replicas is not None or max_replicas is not None:
        lo = min_replicas if min_replicas is not None else 1
        scaling = {
            "num_replicas": "auto",
            "autoscaling_config": AutoscalingConfig(
                min_replicas=lo,
                max_replicas=max(lo, max_replicas or lo),
                target_ongoing_requests=target_ongoing,
            ),
        }
    make: Any = serve.deployment
    deployment = make(
        serve.ingress()(GatewayReplica),
        name=DEPLOYMENT,
        max_ongoing_requests=max_ongoing,
        ray_actor_options={"num_cpus": replica_cpus},
        request_router_config={
            "request_router_class": ROUTER,
            # strict affinity: a primary that is busy (or slow to answer Serve's queue-length
            # probe on a loaded node) is waited for, not skipped; the ring itself moves a
            # session when its replica leaves the set (died, scaled down)
            "request_router_kwargs": {"num_fallback_replicas": 0},
        },
        **scaling,
    )
    here = ray.get_runtime_context().get_node_id() if direct and ray.is_initialized() else None
    return deployment.bind(options, {"driver_node": here} if direct else None)


def serve_ray(args: argparse.Namespace) -> None:
    """``turnstile serve --ray``: join the cluster at ``--ray-address`` (or start one on this
    machine), run the app behind Serve's HTTP proxy on ``--host:--port``, and block."""
    import signal

    options = replica_options(args)
    if options.get("mode") == "passthrough":  # before a cluster is started or joined
        raise SystemExit(f"turnstile: refusing to start: {PASSTHROUGH}")
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)

    def stop(*_: object) -> None:  # SIGTERM (systemd, Kubernetes) stops it as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = build_app(
        options,
        replicas=args.ray_replicas,
        min_replicas=args.ray_min_replicas,
        max_replicas=args.ray_max_replicas,
        replica_cpus=args.ray_replica_cpus,
        direct=args.ray_direct,
    )
    serve.run(app, name="turnstile", route_prefix="/", blocking=True)
