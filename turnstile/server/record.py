"""The fields of a call record that every recording mode fills the same way.

Token-in and engine-rendered capture know different things about a call (a renderer's seam
and parse status; a capture's drift report and added fields) but describe the engine, the
sampling, the weight versions, usage and timings alike: :func:`call_info` builds that part of
``CallRecord.info`` once, and each mode adds its own fields.
"""

from __future__ import annotations

import time

from ..engines.base import token_versions


def weight_version(spans: list[dict] | None, n: int, whole: object,
                   policy: str | None) -> object:
    """The version a call ran under: per sampled token when the engine reported spans, else
    the engine's one version, else the policy version the trainer declared."""
    return token_versions(spans, n) or (whole if whole is not None else policy)


def call_info(*, model: str, engine: str, fingerprint: str | None,
              segment_detail: str | None, sampling: dict, logprob_kind: str | None,
              logprob_warning: str | None, engine_request_id: str | None,
              weight_versions: list[dict] | None, version: object, policy_version: str | None,
              stop_string: str | None, usage: dict, started: float,
              timings: dict | None = None) -> dict:
    """The shared part of a call record's ``info``; ``usage`` holds at least
    ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens``."""
    return {
        "model": model,
        "engine": engine,
        "fingerprint": fingerprint,
        "segment_detail": segment_detail,
        "sampling": sampling,
        "logprob_kind": logprob_kind,
        "logprob_warning": logprob_warning,
        "engine_request_id": engine_request_id,
        "weight_version": version,
        "policy_version": policy_version,
        "weight_versions": weight_versions,
        "stop_string": stop_string,
        "usage": usage,
        "timings": {"started": started, "latency_s": time.time() - started, **(timings or {})},
    }
