"""Turnstile as a Ray Serve application: N gateway replicas behind Serve's HTTP proxy, each
one Turnstile gateway built from the same options as ``turnstile serve`` (``wiring``), calls
of a session routed to one replica by :class:`~turnstile.ray.routing.SessionRouter`.

The replicas share one record store: a PostgreSQL database (``--store``: replicas on any node)
or the node's SQLite file under ``--data`` (replicas on one node). A replica whose session's
calls were also recorded elsewhere (its replica died, or the ring moved the session) sees the
store's call count differ from its cached tree and rebuilds the tree from the store, so the
next call extends the last acknowledged call exactly (``docs/scale.md``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig

from ..gateway.token_in import Gateway
from ..wiring import Server, server_from_args, share

DEPLOYMENT = "turnstile"
ROUTER = "turnstile.ray.routing:SessionRouter"  # imported by Serve's proxies
PASSTHROUGH = (
    "--ray runs token-in gateways (passthrough keeps a lineage index that is not "
    "rebuilt when another replica recorded calls)"
)
# Paths the replicas open: made absolute in the driver (a replica's working directory is
# Ray's, not the caller's).
_PATHS = ("data", "model", "chat_template")


class GatewayReplica:
    """One gateway: the app ``turnstile serve`` would run, built in the replica's process."""

    def __init__(self, options: dict):
        replica = serve.get_replica_context().replica_id.unique_id
        os.environ["TURNSTILE_REPLICA"] = replica  # the metrics' replica label
        self.server: Server = server_from_args(argparse.Namespace(**options))
        gateway = self.server.gateway
        if not isinstance(gateway, Gateway):
            raise ValueError("turnstile.ray runs token-in gateways")
        share(self.server.app, gateway)  # other replicas write this store too
        gateway.store.record_fields["replica"] = replica  # which replica recorded a call

    def __serve_build_asgi_app__(self) -> Any:
        return self.server.app


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
) -> Any:
    """The Serve application (``serve.run`` it, or compose it into your own). With
    ``min_replicas``/``max_replicas`` Serve autoscales between them on ongoing requests per
    replica (``target_ongoing``); otherwise it keeps ``replicas``."""
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
    return deployment.bind(options)


def serve_ray(args: argparse.Namespace) -> None:
    """``turnstile serve --ray``: join the cluster at ``--ray-address`` (or start one on this
    machine), run the app behind Serve's HTTP proxy on ``--host:--port``, and block."""
    import signal

    import ray

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
    )
    serve.run(app, name="turnstile", route_prefix="/", blocking=True)
