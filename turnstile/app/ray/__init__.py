"""Turnstile on Ray: gateway replicas as a Ray Serve application (:func:`build_app`,
``turnstile serve --ray``), session-affine through Serve's request router, and trajectories
handed to trainers through Ray's object store (:func:`trajectories`). Needs the ``ray`` extra
(``ray[serve]==2.60.0``)."""

from .app import DEPLOYMENT, GatewayReplica, build_app, replica_options, serve_ray
from .handoff import trajectories
from .routing import SessionRouter, session_key

__all__ = [
    "DEPLOYMENT",
    "GatewayReplica",
    "SessionRouter",
    "build_app",
    "replica_options",
    "serve_ray",
    "session_key",
    "trajectories",
]
