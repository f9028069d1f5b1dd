"""When may a call extend recorded tokens? Decided per kind of append, from the startup audit.

The renderer cuts a delta from a short stand-in conversation; a template whose render of the new
messages depends on turns the stand-in leaves out (tool-round counters, reasoning dropped from
earlier turns, a system message that moves) gives a wrong delta without noticing. The startup
audit plays whole conversations through the same path and compares with full renders; the
policy lets a call extend only for an append kind the audit played and found exact. Anything
else — a kind it never played, one it could not play, one that mismatched — starts a new segment
with the reason. Unknown never means "extend".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


def append_kind(messages: list[dict]) -> str:
    """The shape of the messages a call appends: their roles with repeats collapsed
    (``tool``, ``user``, ``tool+user``, ``tool+system``, ``system+user``, ...)."""
    roles: list[str] = []
    for m in messages:
        role = str(m.get("role"))
        if not roles or roles[-1] != role:
            roles.append(role)
    return "+".join(roles)


def has_reasoning(messages: list[dict]) -> bool:
    """Whether an assistant turn in ``messages`` carries reasoning (templates often drop or
    keep it depending on where the turn is)."""
    return any(
        m.get("role") == "assistant" and (m.get("reasoning_content") or m.get("reasoning"))
        for m in messages
    )


class AuditStep(Protocol):
    kind: str
    variant: str
    status: str  # "exact" | "fallback" | "MISMATCH" | "n/a" | "error"
    detail: str


@dataclass(frozen=True)
class Policy:
    """Per append kind and variant (``plain``, or ``think`` when the conversation carries
    reasoning): extend the recorded tokens, or start a new segment (with the reason)."""

    extend: dict[tuple[str, str], bool]
    reasons: dict[tuple[str, str], str]
    everything: bool = False  # no audit was run (``--no-audit-template``, benchmarks)

    @classmethod
    def from_steps(cls, steps: Iterable[AuditStep]) -> Policy:
        """Extend the (kind, variant) pairs the audit played exactly at least once and never
        saw go wrong. A step the template refused to render (``error``: e.g. parallel calls
        on a single-call template) proves nothing either way; such a conversation is refused
        at run time too."""
        exact: set[tuple[str, str]] = set()
        bad: dict[tuple[str, str], str] = {}
        errors: dict[tuple[str, str], str] = {}
        for s in steps:
            key = (s.kind, s.variant)
            if s.status == "exact":
                exact.add(key)
            elif s.status == "error":
                errors.setdefault(key, f"error: {s.detail}")
            else:  # MISMATCH, fallback, n/a
                bad.setdefault(key, f"{s.status}: {s.detail}")
        keys = exact | bad.keys() | errors.keys()
        extend = {k: k in exact and k not in bad for k in keys}
        reasons = {k: bad.get(k) or errors.get(k) or "" for k in keys if not extend[k]}
        return cls(extend, reasons)

    @classmethod
    def permissive(cls) -> Policy:
        return cls({}, {}, everything=True)

    def allows(self, kind: str, variant: str) -> bool:
        return self.everything or self.extend.get((kind, variant), False)

    def reason(self, kind: str, variant: str) -> str:
        if (kind, variant) not in self.extend:
            return (
                f"the startup audit never played a {kind!r} append ({variant}), so it is "
                "not known to extend exactly"
            )
        return (
            f"the startup audit found this template does not extend exactly when "
            f"{kind!r} messages are appended ({variant}): "
            f"{self.reasons.get((kind, variant), '')[:200]}"
        )

    def describe(self) -> list[str]:
        if self.everything:
            return ["every append extends recorded tokens (no audit)"]
        return [
            f"{kind} messages ({variant}): "
            + (
                "extend recorded tokens"
                if ok
                else f"new segment (audit: {self.reasons[(kind, variant)][:100]})"
            )
            for (kind, variant), ok in sorted(self.extend.items())
        ]
