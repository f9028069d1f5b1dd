"""Why a call that continues no recorded call starts a segment: one rule for both recording
modes, decided by the request's messages and the order calls *arrived*, never by which
calls happened to have finished (a harness's title request still running, or done, must not
change the label of the agent's first call).

- ``first_call``: the session's first request to arrive (or the same messages again: a retry
  of it);
- ``new_conversation``: a new lineage. Not even the first message (under the same tools) is
  that of any recorded conversation, and no assistant turn claims a history: another system
  prompt, a title or summary request, a sub-agent. A harness's auxiliary calls land here; a
  trainer may keep or drop them;
- ``history_diverged``: a rewrite of a recorded conversation. Its leading messages are those
  of one, or it carries assistant turns this session did not sample in this order, but it
  continues no recorded call (compaction, an edited or dropped message).
"""

from __future__ import annotations

from typing import Literal

RootReason = Literal["first_call", "new_conversation", "history_diverged"]

# The reasons that start a lineage of their own rather than break one (for trajectories'
# ``lineage`` filter).
NEW_LINEAGE = ("first_call", "new_conversation")


def root_reason(
    *,
    request_hash: bytes,
    first_request: bytes | None,
    recorded_calls: int,
    matched: int,
    has_assistant: bool,
) -> RootReason:
    """``request_hash``: the chain hash of this request's messages; ``first_request``: that of
    the session's first request to arrive (``None`` before any, or when the session was
    rebuilt from the store); ``matched``: how many leading messages equal those of a recorded
    conversation; ``has_assistant``: the request holds an assistant turn (a history)."""
    if first_request == request_hash or (first_request is None and recorded_calls == 0):
        return "first_call"
    if matched == 0 and not has_assistant:
        return "new_conversation"
    return "history_diverged"
