"""The fields of a call record that every recording mode fills the same way.

Token-in and engine-rendered capture know different things about a call (a renderer's seam
and parse status; a capture's drift report and added fields) but describe the engine, the
sampling, the weight versions, usage and timings alike: :func:`call_info` builds that part of
``CallRecord.info`` once, and each mode adds its own fields.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence

from ..errors import APIError
from ..store import database
from ..store.contracts import SessionOpener
from ..store.records import CallRecord
from ..store.store import Store
from ..store.writes import CallWrite, SessionGone
from ..token_arrays import WEIGHT_VERSION, Rows, top_rows, version_rows

# What a failed commit raises: the harness gets a clean 503/507/404 (store_error), never a 500.
STORE_ERRORS: tuple[type[Exception], ...] = (*database.ERRORS, OSError, SessionGone)


def store_error(exc: BaseException, session_id: str) -> APIError:
    """A record that could not be committed, as the harness sees it: nothing was
    acknowledged, the call did not enter the session's tree, and retrying is safe."""
    if isinstance(exc, SessionGone):
        return APIError(
            404,
            f"Session {session_id!r} was deleted while the call ran; nothing was recorded.",
            "session_id",
            code="session_not_found",
        )
    text = str(exc)
    if "full" in text or "disk" in text or isinstance(exc, OSError):
        return APIError(
            507,
            f"The record store could not save the call ({text}); it was not "
            "recorded. Free space under --data and retry.",
            code="store_full",
            type_="server_error",
        )
    return APIError(
        503,
        f"The record store is busy ({text}); the call was not recorded. Retry it.",
        code="store_busy",
        type_="server_error",
    )


def commit(
    store: Store,
    rec: CallRecord,
    request_body: object = None,
    response_body: object = None,
    session_created: float | None = None,
    then: Callable[[], object] | None = None,
) -> asyncio.Future:
    """Write ``rec`` off the event loop (a locked store waits there, not in the loop). ``then``
    runs on the loop once the row is committed: the in-memory tree follows the store, never
    leads it. A failed write of a call nobody waits for is reported on stderr."""
    fut = store.queue(CallWrite(rec, request_body, response_body, session_created))

    def done(f: asyncio.Future) -> None:
        if f.cancelled():
            return
        exc = f.exception()
        if exc is None:
            if then is not None:
                then()
        elif rec.status != "ok":
            print(
                f"turnstile: call {rec.id} ({rec.status}) of session {rec.session_id} was "
                f"not recorded: {exc}",
                file=sys.stderr,
            )

    fut.add_done_callback(done)
    return fut


async def create_session(
    store: SessionOpener,
    metadata: dict,
    session_id: str | None = None,
    *,
    group_id: str | None = None,
    sample_index: int | None = None,
    task_id: str | None = None,
) -> str:
    """Create a session (idempotent on its id) through the store's writer; its failures as
    the harness's or trainer's error."""
    fut, sid = store.open_session(
        metadata, session_id, group_id=group_id, sample_index=sample_index, task_id=task_id
    )
    await committed(fut, sid)
    return sid


async def committed(fut: asyncio.Future, session_id: str) -> None:
    """Wait for a commit (a cancellation lets it finish); store failures as the harness's
    error."""
    try:
        await asyncio.shield(fut)
    except STORE_ERRORS as exc:
        raise store_error(exc, session_id) from exc


def weight_version(spans: list[dict] | None, n: int, whole: object, policy: str | None) -> object:
    """The version a call ran under: its last sampled token's when the engine reported spans
    (each token's is on the record's ``weight_version`` array), else the engine's one version,
    else the policy version the trainer declared."""
    at, last = -1, None
    for span in spans or ():  # a later span wins a token two cover, as the engine meant
        lo, hi = max(0, int(span["start"])), min(n, int(span["end"]))
        if lo < hi and hi - 1 >= at:
            at, last = hi - 1, span["version"]
    if at >= 0:
        return last
    return whole if whole is not None else policy


def call_arrays(
    spans: list[dict] | None,
    completion_start: int,
    n: int,
    engine: dict[str, Rows] | None,
    tops: Sequence[Sequence[tuple[int, float]]] = (),
    top_k: int = 0,
) -> dict[str, Rows]:
    """A call record's per-token arrays: what the engine returned by name (routed experts),
    the weight version of each of the ``n`` sampled tokens from the engine's spans (the
    completion starts at sequence position ``completion_start``), and, when ``top_k``
    candidates were asked for, each sampled token's as the engine gave them (``tops``, one list
    per sampled token)."""
    out = dict(engine or {})
    versions = version_rows(spans, completion_start, n)
    if versions is not None:
        out[WEIGHT_VERSION.name] = versions
    if top_k > 0 and len(tops) == n:
        out.update(top_rows(tops, completion_start, top_k))
    return out


def call_info(
    *,
    model: str,
    engine: str,
    fingerprint: str | None,
    segment_detail: str | None,
    sampling: dict,
    logprob_kind: str | None,
    logprob_warning: str | None,
    engine_request_id: str | None,
    weight_versions: list[dict] | None,
    version: object,
    policy_version: str | None,
    stop_string: str | None,
    usage: dict,
    started: float,
    timings: dict | None = None,
    dialect: str = "chat",
) -> dict:
    """The shared part of a call record's ``info``; ``usage`` holds at least
    ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens``; ``dialect`` is the wire
    dialect the harness spoke (the record is the same whichever it was)."""
    return {
        "dialect": dialect,
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
