"""A captured call as its record: what the engine rendered (linked to the session's earlier
calls by token prefix), what it sampled, and what its answer said about it."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Protocol

from ...chat.history_hash import prefix_hashes
from ...engines.capture import Capture, CaptureEngine, Choice, request_logprob_warning
from ...engines.capture_dialects import SAMPLING_KEYS, Asked
from ...engines.pool import Bound, ReplicaPool
from ...request import ChatRequest
from ...store.records import CallRecord, new_id
from ..control import PolicyControl
from ..record import call_arrays, call_info, weight_version
from .lineage import LineageIndex, Link


class Recording(Protocol):
    """What a captured call's record says of its gateway (``capture.PassthroughGateway``)."""

    @property
    def model_name(self) -> str: ...

    @property
    def engine(self) -> CaptureEngine | ReplicaPool[CaptureEngine]: ...

    @property
    def primary(self) -> CaptureEngine:
        """The first replica: what the engine's logprobs are, its model's name."""
        ...

    @property
    def control(self) -> PolicyControl: ...


@dataclass
class Call:
    """One engine call in the making: where it goes, what was sent, what came back."""

    session_id: str
    req: ChatRequest
    engine: CaptureEngine
    bound: Bound[CaptureEngine] | None
    body: dict
    asked: Asked
    added: list[str]
    cap: Capture
    started: float
    # the session's creation time when the call began: a DELETE (and a re-created id) while
    # it ran makes its write fail (404), never land in the new session
    session_created: float | None = None


def build_record(
    gw: Recording,
    call: Call,
    idx: LineageIndex,
    link: Link | None,
    choice: Choice | None,
    status: str,
    error: str | None,
    notes: list[str] | None = None,
) -> CallRecord:
    """The record of one captured call (one choice): the prompt as linked to the session's
    earlier calls, what the engine sampled, and what it said about it."""
    cap, body = call.cap, call.body
    call_id = new_id("call_")
    ids = array("i", (choice.ids or []) if choice else [])
    values, note = cap.logprob_values(choice) if choice else ([], None)
    notes = [*(notes or []), *([note] if note else [])]
    message = choice.assembled() if choice and status == "ok" else None
    prompt = link.prompt if link else array("i")
    parent = link.parent if link else None
    reply_hash = None
    if link is not None and message is not None:
        reply_hash = prefix_hashes(link.hashes[-1], [message])[1]
    spans = (choice.weight_versions if choice else None) or cap.weight_versions
    stop_token = stop_string = None
    if choice is not None:
        if isinstance(choice.stop, int) and not isinstance(choice.stop, bool):
            stop_token = choice.stop
        elif isinstance(choice.stop, str):
            stop_string = choice.stop
        elif choice.finish_reason in ("stop", "tool_calls") and ids:
            stop_token = ids[-1]  # stopped on EOS (vLLM reports no stop_reason for it)
    usage = cap.usage or {}
    seq = idx.n_calls
    idx.n_calls += 1
    info = {
        **call_info(
            model=gw.model_name,
            engine=gw.engine.name,
            fingerprint=None,  # the engine rendered the prompt
            segment_detail=link.detail if link else None,
            sampling={k: body[k] for k in SAMPLING_KEYS if k in body and k not in call.added},
            logprob_kind=gw.primary.logprob_kind,
            logprob_warning=request_logprob_warning(gw.primary, body),
            engine_request_id=cap.engine_id,
            weight_versions=spans,
            version=weight_version(spans, len(ids), cap.weight_version, gw.control.version),
            policy_version=gw.control.version,
            stop_string=stop_string,
            usage={
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "cached_tokens": int(
                    ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
                ),
                "engine": usage or None,
            },
            started=call.started,
        ),
        "mode": "passthrough",
        "engine_model": gw.primary.model,
        "drift": link.drift if link else None,
        **({"lineage": link.lineage} if link and link.lineage else {}),
        "added_fields": call.added,
        "choice_index": choice.index if choice else None,
        "capture_notes": notes or None,
        "stream": bool(body.get("stream")),
    }
    rec = CallRecord(
        id=call_id,
        session_id=call.session_id,
        seq=seq,
        parent_id=parent.id if parent else None,
        segment_reason=link.reason if link else None,
        reused_prefix_len=parent.full_len if parent else 0,
        prompt_delta=link.delta if link else array("i"),
        completion_ids=ids,
        completion_logprobs=array("f", values),
        finish_reason=choice.finish_reason if choice else None,
        stop_token_id=stop_token,
        seam=None,
        status=status,
        error=error,
        message=message,
        history_hash=reply_hash,
        # the request's conversation prefixes not yet known (lineage labels after a restart)
        prefix_hashes=[h for h in link.hashes if h not in idx.known]
        if link is not None and status == "ok"
        else [],
        info=info,
        arrays=call_arrays(spans, len(prompt), len(ids), None),
    )
    return rec
